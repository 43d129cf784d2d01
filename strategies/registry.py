"""The strategy registry: one `StrategyEntry` per name, read by everything that asks about a strategy name.

Both faces build strategies through it (`resolve_strategy`), ``Trainer.fit`` asks it which names may start
processes from a plain ``python script.py`` (`StrategyEntry.launchable`), ``trainer launch`` checks names against
it, and ``Accelerator.distributed_type`` reads Accelerate's name for a strategy from it
(`StrategyEntry.distributed_type`). What ``"auto"`` stands for is decided in one place, `resolve_auto`::

    REGISTRY["fsdp2"].name                          # "fsdp": an alias reads its strategy's entry
    resolve_auto("auto", distributed=True)          # "ddp": also what `fit` launches for strategy="auto"
    resolve_strategy("deepspeed_stage_3", cpu=True)  # a DeepSpeedStrategy(zero_stage=3, cpu=True)

A strategy of your own is one more entry::

    register_strategy(StrategyEntry("mine", MyStrategy, launchable=True))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from strategies.base import Strategy
from strategies.ddp import DDPStrategy
from strategies.deepspeed import DeepSpeedStrategy
from strategies.environment import detect_environment
from strategies.fsdp import FSDPStrategy
from strategies.single_device import SingleDeviceStrategy
from strategies.xla import XLAStrategy, xla_device_present

AUTO = "auto"


@dataclass(frozen=True)
class StrategyEntry:
    """A strategy name and everything the rest of the code asks about it.

    Attributes:
        name: the registry name (what ``Strategy.name`` of the built strategy is, except for presets and ``"auto"``).
        build: called with the strategy's keyword arguments (``cluster``, ``cpu``, ``precision``, ``timeout``, ...).
        aliases: other names for the same entry (``"fsdp2"`` for ``"fsdp"``).
        launchable: ``Trainer(strategy=name, devices=N)`` in a plain ``python script.py`` starts the N processes itself.
        distributed_type: Accelerate's ``DistributedType`` value for a run of this strategy, or None when it follows
            from the process layout (``NO``, ``MULTI_GPU``, ``MULTI_CPU``).
    """

    name: str
    build: Callable[..., Strategy]
    aliases: tuple[str, ...] = ()
    launchable: bool = False
    distributed_type: str | None = None


def resolve_auto(name: str, *, distributed: bool, xla: bool = False) -> str:
    """The registry name a strategy named `name` runs as: ``"auto"`` becomes ``"xla"`` when an XLA device is used,
    else ``"ddp"`` when the run has several processes (or is about to be launched on several), else ``"single"``.
    Any other name is returned as it is."""
    if name != AUTO:
        return name
    if xla:
        return "xla"
    return "ddp" if distributed else "single"


def _auto(**kwargs: Any) -> Strategy:
    """`resolve_auto` for this process: XLA when a device is announced (and torch_xla installed), else by the launch."""
    xla = not kwargs.get("cpu") and xla_device_present()
    cluster = None if xla else kwargs.get("cluster") or detect_environment()
    name = resolve_auto(AUTO, distributed=cluster is not None and cluster.is_distributed, xla=xla)
    return REGISTRY[name].build(**{**kwargs, "cluster": cluster})


def _not_available(name: str, why: str) -> Callable[..., Strategy]:
    def build(**kwargs: Any) -> Strategy:
        raise NotImplementedError(f"strategy={name!r} is not available in this release: {why}; use strategy='fsdp', 'ddp' or 'single'")

    return build


def _deepspeed(stage: int, offload: bool = False) -> StrategyEntry:
    """Lightning's preset names: ``"deepspeed_stage_2"``, ``"deepspeed_stage_3_offload"``, ..."""

    def build(**kwargs: Any) -> Strategy:
        if offload:
            kwargs.setdefault("offload_optimizer", True)
            kwargs.setdefault("offload_parameters", stage == 3)
        return DeepSpeedStrategy(zero_stage=stage, **kwargs)

    name = f"deepspeed_stage_{stage}" + ("_offload" if offload else "")
    return StrategyEntry(name, build, launchable=True, distributed_type="DEEPSPEED")


def _ddp_find_unused_parameters(**kwargs: Any) -> Strategy:
    """Lightning's ``"ddp_find_unused_parameters_true"``: DDP that tolerates parameters a forward does not use."""
    return DDPStrategy(find_unused_parameters=True, **kwargs)


REGISTRY: dict[str, StrategyEntry] = {}  # every name and alias -> its entry


def register_strategy(entry: StrategyEntry) -> None:
    """Add `entry` under its name and aliases; a name already taken is a `ValueError`."""
    taken = [name for name in (entry.name, *entry.aliases) if name in REGISTRY]
    if taken:
        raise ValueError(f"strategy name(s) {taken} are registered already; choose another name for {entry.build!r}")
    REGISTRY.update(dict.fromkeys((entry.name, *entry.aliases), entry))


for _entry in (
    StrategyEntry(AUTO, _auto, launchable=True),
    StrategyEntry("single", SingleDeviceStrategy, aliases=("single_device",)),
    # Lightning's "ddp_spawn"/"ddp_notebook" start their processes by spawning/forking; here every DDP run starts them by
    # re-running the script (Lightning's "ddp"); in a notebook, `Trainer` names `notebook_launcher` instead
    StrategyEntry("ddp", DDPStrategy, aliases=("ddp_find_unused_parameters_false", "ddp_spawn", "ddp_notebook"), launchable=True),
    StrategyEntry("ddp_find_unused_parameters_true", _ddp_find_unused_parameters, launchable=True),
    StrategyEntry("fsdp", FSDPStrategy, aliases=("fsdp2",), launchable=True, distributed_type="FSDP"),
    StrategyEntry("fsdp1", _not_available("fsdp1", "FSDP1 (FullyShardedDataParallel) is not supported; strategy='fsdp' shards with "
                                          "FSDP2 (fully_shard)")),
    StrategyEntry("deepspeed", DeepSpeedStrategy, launchable=True, distributed_type="DEEPSPEED"),
    _deepspeed(1),
    _deepspeed(2),
    _deepspeed(2, offload=True),
    _deepspeed(3),
    _deepspeed(3, offload=True),
    StrategyEntry("xla", XLAStrategy, aliases=("tpu",), distributed_type="XLA"),
):
    register_strategy(_entry)


class _Builders(Mapping[str, Callable[..., Strategy]]):
    """`STRATEGIES`: the registry read as name -> builder (read-only; add a strategy with `register_strategy`)."""

    def __getitem__(self, name: str) -> Callable[..., Strategy]:
        return REGISTRY[name].build

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY)

    def __len__(self) -> int:
        return len(REGISTRY)


STRATEGIES: Mapping[str, Callable[..., Strategy]] = _Builders()


def resolve_strategy(strategy: str | Strategy | None = AUTO, **kwargs: Any) -> Strategy:
    """Turn a strategy name (or instance) into a `Strategy`.

    Keyword arguments (``cpu``, ``precision``, ``timeout``, ``cluster``) go to the strategy's constructor.
    """
    if isinstance(strategy, Strategy):
        return strategy
    name = AUTO if strategy is None else str(strategy).lower()
    if name not in REGISTRY:
        raise ValueError(f"strategy={strategy!r} is not known; choose one of {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name].build(**kwargs)


__all__ = ["AUTO", "REGISTRY", "STRATEGIES", "StrategyEntry", "register_strategy", "resolve_auto", "resolve_strategy"]
