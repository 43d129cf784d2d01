"""The process layout both Accelerate names describe: `PartialState` and `AcceleratorState` (``trainer.state``).

`PartialState` is the process layout (rank, count, device) and the helpers that need nothing else: for a
script without an `Accelerator`, e.g. inference split over processes::

    state = PartialState()
    with state.split_between_processes(prompts) as mine:
        outputs = [generate(p) for p in mine]

`Accelerator.state` is an `AcceleratorState`: the same view plus the accelerator's precision, read-only.
As in Accelerate every `PartialState()` of a process shares one layout: the newest `Accelerator`'s, or
the one the first `PartialState()` set up when there is no `Accelerator`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from strategies import REGISTRY, Strategy
from strategies.abilities import Engine
from strategies.sharding import split_for_process
from trainer.accelerator.builder import strategy_from_name
from trainer.accelerator.config import DeepSpeedPlugin, DistributedType

_shared: list[Strategy] = []  # the process's layout
_debug: list[bool] = []  # debug mode (`PartialState.debug`), read from the environment at its first use
resets: list[int] = [0]  # how often `AcceleratorState._reset_state()` was called: an Accelerator made before refuses prepare()


def share_strategy(strategy: Strategy) -> None:
    """Make `strategy` the layout `PartialState()` reports (each `Accelerator` calls it)."""
    _shared[:] = [strategy]


def distributed_type(strategy: Strategy) -> DistributedType:
    """Accelerate's name for what kind of run `strategy` does: its registry entry's, else from the process layout."""
    entry = REGISTRY.get(strategy.name)
    if entry is not None and entry.distributed_type is not None:
        return DistributedType(entry.distributed_type)
    if strategy.world_size == 1:
        return DistributedType.NO
    return DistributedType.MULTI_GPU if strategy.device.type == "cuda" else DistributedType.MULTI_CPU


class ProcessLayout:
    """The process layout and the helpers that need only it, read from ``self.strategy``.

    What `PartialState`, `AcceleratorState` and the `Accelerator` share (Accelerate's ``PartialState`` API).
    """

    __slots__ = ()
    strategy: Strategy

    # the layout ---------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.strategy.device

    @property
    def process_index(self) -> int:
        return self.strategy.rank

    @property
    def local_process_index(self) -> int:
        return self.strategy.local_rank

    @property
    def num_processes(self) -> int:
        return self.strategy.world_size

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def distributed_type(self) -> DistributedType:
        return distributed_type(self.strategy)

    @property
    def initialized(self) -> bool:
        return True

    # helpers ------------------------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        self.strategy.barrier()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on the main process only."""
        if self.is_main_process:
            print(*args, **kwargs)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first, then on the others."""
        with self._first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on the main process of each machine first, then on the others."""
        with self._first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _first(self, first: bool) -> Iterator[None]:
        if not first:
            self.wait_for_everyone()
        yield
        if first:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's contiguous share of `inputs`: a list, tuple, tensor, or a dict of them of one length.

        The first ``len(inputs) % num_processes`` processes get one item more; with more processes than items
        the last ones get an empty share. ``apply_padding=True`` repeats the last item of `inputs` so every
        process gets as many (drop the copies after a gather). One process gets `inputs` itself.
        """
        yield split_for_process(inputs, self.num_processes, self.process_index, apply_padding=apply_padding)

    # decorators: with one process every one of them runs the function, as in Accelerate ------------------
    def _runs_here(self, here: bool, function: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(function):
            raise TypeError(f"expected a function to decorate, got {function!r}")
        if here or not self.use_distributed:
            return function

        @functools.wraps(function)
        def skipped(*args: Any, **kwargs: Any) -> None:
            return None
        return skipped

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run `function` on the main process only (calls elsewhere return None)."""
        return self._runs_here(self.is_main_process, function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run `function` on the main process of each machine only."""
        return self._runs_here(self.is_local_main_process, function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run `function` on the last process only."""
        return self._runs_here(self.is_last_process, function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        """Decorator: run `function` on process `process_index` only (``@state.on_process(process_index=1)``)."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._runs_here(self.process_index == _index(process_index, "process_index"), function)

    def on_local_process(self, function: Callable[..., Any] | None = None, local_process_index: int | None = None) -> Any:
        """Decorator: run `function` on local process `local_process_index` of each machine only."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._runs_here(self.local_process_index == _index(local_process_index, "local_process_index"), function)


class PartialState(ProcessLayout):
    """The process layout and its helpers, without an `Accelerator` (Accelerate's ``PartialState``).

    Args:
        cpu: use the CPU even when an accelerator is present (only when this call sets the layout up).
    """

    __slots__ = ("_strategy",)

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"PartialState() got unsupported arguments {sorted(kwargs)}; it takes only cpu=")
        if not _shared:
            strategy = strategy_from_name(None, cpu=cpu, precision="no", timeout=None, ddp=None)
            strategy.setup_environment()
            share_strategy(strategy)
        self._strategy = _shared[0]

    @property
    def debug(self) -> bool:
        """Accelerate's debug mode: before `gather`, `broadcast`, `reduce` and `pad_across_processes` (of `trainer.utils`
        and the `Accelerator`) the processes compare their tensors' shapes, and a mismatch raises
        `trainer.utils.DistributedOperationException` on every process instead of hanging. On from the start with
        ``ACCELERATE_DEBUG_MODE=1`` or ``TRAINWRIGHT_DEBUG_COLLECTIVES=1``; one extra small gather per call while on."""
        return debug_mode()

    @debug.setter
    def debug(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"PartialState().debug must be True or False, got {value!r}")
        _debug[:] = [value]

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy `group` (default: the process group this layout joined, if it created it; nothing in one process),
        as Accelerate's. Collectives fail afterwards; call it at the end of a script."""
        if group is None:
            self.strategy.teardown()
            return
        import torch.distributed as dist

        dist.destroy_process_group(group)

    @staticmethod
    def _reset_state() -> None:
        """Forget the process's layout (Accelerate's): the next `PartialState()` or `Accelerator` sets it up again (the
        process group joined stays; debug mode is read from the environment again)."""
        _shared.clear()
        _debug.clear()

    @property
    def strategy(self) -> Strategy:  # type: ignore[override]  # read-only here
        return self._strategy

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(distributed_type={self.distributed_type.value}, num_processes={self.num_processes}, "
                f"process_index={self.process_index}, device={self.device})")

    def __str__(self) -> str:
        """Accelerate's text of the state (what ``print(accelerator.state)`` shows there)."""
        backend = getattr(self.strategy, "backend", None) if self.num_processes > 1 else None
        return (f"Distributed environment: {self.distributed_type}{('  Backend: ' + backend) if backend else ''}\n"
                f"Num processes: {self.num_processes}\nProcess index: {self.process_index}\n"
                f"Local process index: {self.local_process_index}\nDevice: {self.device}\n")


class AcceleratorState(PartialState):
    """`PartialState` plus the precision: what `Accelerator.state` returns (read-only)."""

    __slots__ = ()

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Accelerate's: the `Accelerator`s made so far stop working (their `prepare` raises `AttributeError`), a new
        `Accelerator` starts afresh; ``reset_partial_state`` also forgets the layout (`PartialState._reset_state`)."""
        resets[0] += 1
        if reset_partial_state:
            PartialState._reset_state()

    @property
    def mixed_precision(self) -> str:
        """The precision mode, ``"fp8"`` under FP8 training (which runs in bf16 autocast), as Accelerate reports it."""
        precision = self.strategy.precision
        return "fp8" if precision.float8 else precision.mode

    def __str__(self) -> str:
        return super().__str__() + f"\nMixed precision type: {self.mixed_precision}\n"

    @property
    def deepspeed_plugin(self) -> DeepSpeedPlugin | None:
        """The DeepSpeed settings of this run, None without DeepSpeed (Accelerate's): ``deepspeed_plugin.deepspeed_config``
        is the running strategy's config itself, so a script can test ``"optimizer" in ...deepspeed_config`` (to pass
        `DummyOptim`) or set an ``"auto"`` entry before `prepare`."""
        config = self.strategy.config if isinstance(self.strategy, Engine) else None
        if not isinstance(config, dict):
            return None
        plugin = DeepSpeedPlugin(zero_stage=getattr(self.strategy, "zero_stage", None))
        plugin.bind(config)
        return plugin


def accelerator_state_of(strategy: Strategy) -> AcceleratorState:
    """The read-only view of `strategy`'s layout an `Accelerator` returns as ``accelerator.state``: its own strategy's,
    not the process's shared one (which a later `Accelerator` replaces)."""
    view = object.__new__(AcceleratorState)
    view._strategy = strategy
    return view


def is_initialized() -> bool:
    """Whether this process's layout is set up (an `Accelerator` or a `PartialState()` was made), as Accelerate's."""
    return bool(_shared)


def debug_mode() -> bool:
    """Whether `PartialState.debug` is on (set there, or ``ACCELERATE_DEBUG_MODE`` / ``TRAINWRIGHT_DEBUG_COLLECTIVES``)."""
    if not _debug:
        from strategies.process_group import debug_collectives  # lazy: import cost (read once, when first asked)

        _debug[:] = [debug_collectives()]
    return _debug[0]


def _index(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be an int >= 0, e.g. @state.on_process({name}=1)")
    return value


__all__ = ["AcceleratorState", "DistributedType", "PartialState", "ProcessLayout"]
