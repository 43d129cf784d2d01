"""Lightning's ``Trainer(plugins=[...])``: ``AsyncCheckpointIO``, and the precision plugins of `trainer.plugins`
(``MixedPrecision``, ``HalfPrecision``, ``DoublePrecision``, ``FSDPPrecision``, ``DeepSpeedPrecision``), which name
the precision as ``Trainer(precision=...)`` does (the strategy builds the precision object for its device).

``AsyncCheckpointIO()`` makes the Trainer's checkpoints asynchronous. It is not Lightning's thread around a
``torch.save`` of the live state (which can write tensors the next step is already changing): the step copies the
state into staging buffers, the copy is written in the background, and the checkpoint is committed only once every
process's write finished (`strategies.checkpoint_store`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from strategies.precision import PrecisionSettings


class AsyncCheckpointIO:
    """``Trainer(plugins=[AsyncCheckpointIO()])``: save checkpoints in the background (see the module docstring).

    Args:
        checkpoint_io: Lightning's inner ``CheckpointIO``; only None is accepted (checkpoints here have one format).
    """

    def __init__(self, checkpoint_io: Any = None) -> None:
        if checkpoint_io is not None:
            raise NotImplementedError(
                f"AsyncCheckpointIO(checkpoint_io={checkpoint_io!r}): checkpoints here are written by one store in one format "
                "(safetensors, tensor-only files, sharded DCP files; hashed, committed with a manifest), so there is no "
                "CheckpointIO to wrap. Use AsyncCheckpointIO() alone"
            )

    def __repr__(self) -> str:
        return "AsyncCheckpointIO()"


def check_plugins(plugins: Any, precision: str | int | None = None) -> tuple[str | int | None, bool]:
    """Check ``Trainer(plugins=...)`` beside ``Trainer(precision=...)``; return the precision to use (`precision`, or
    the mode of a precision plugin: ``MixedPrecision("bf16-mixed", "cpu")`` is ``precision="bf16-mixed"``) and whether
    checkpoints are saved in the background. As in Lightning, a precision plugin and `precision` together, or two
    plugins of one kind, are an error."""
    if plugins is None:
        return precision, False
    from strategies.precision import Precision  # lazy: `import trainer` loads no strategies module

    listed = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    async_save, precision_plugins = False, []
    for plugin in listed:
        if isinstance(plugin, AsyncCheckpointIO):
            if async_save:
                raise ValueError("Trainer(plugins=[...]) holds AsyncCheckpointIO() twice; pass it once (as in Lightning)")
            async_save = True
        elif isinstance(plugin, Precision):
            precision_plugins.append(plugin)
        elif isinstance(plugin, str):
            raise ValueError(f"Trainer(plugins=[{plugin!r}]): plugins are given as objects here; use AsyncCheckpointIO() or a "
                             "precision plugin (MixedPrecision, HalfPrecision, DoublePrecision, ...)")
        else:
            raise ValueError(
                f"Trainer(plugins=[{type(plugin).__name__}(...)]) is not supported: the plugins here are AsyncCheckpointIO() "
                "and the precision plugins of trainer.plugins (MixedPrecision, HalfPrecision, DoublePrecision, FSDPPrecision, "
                "DeepSpeedPrecision); the cluster is detected (or set by `trainer launch`), and checkpoints have one format"
            )
    if len(precision_plugins) > 1:
        raise ValueError(f"Trainer(plugins=[...]) holds {len(precision_plugins)} precision plugins "
                         f"({', '.join(type(p).__name__ for p in precision_plugins)}); pass one (as in Lightning)")
    if precision_plugins:
        plugin = precision_plugins[0]
        if precision is not None:
            raise ValueError(f"Received both precision={precision!r} and plugins=[{plugin_repr(plugin)}]; choose one (as in "
                             "Lightning): the plugin says the precision itself")
        _check_plain(plugin)
        precision = plugin.mode
    return precision, async_save


_SHIPPED = ("strategies.precision", "trainer.plugins.precision")  # where the precision plugins we ship live


def plugin_repr(plugin: Any) -> str:
    return f"{type(plugin).__name__}({plugin.mode!r})"


def _check_plain(plugin: Any) -> None:
    """A precision plugin is read for its mode: a subclass that changes what the precision does would be run without
    its changes, so it is refused."""
    if type(plugin).__module__ not in _SHIPPED:
        raise ValueError(
            f"Trainer(plugins=[{type(plugin).__name__}(...)]): a precision plugin here only names the precision; a subclass "
            "with its own methods would run without them. Set it on a strategy instance instead "
            "(strategy = SingleDeviceStrategy(); strategy.precision = MyPrecision(...); Trainer(strategy=strategy))"
        )


def plugin_precision_settings(plugins: Any, base: PrecisionSettings, device: torch.device) -> PrecisionSettings:
    """The strategy's precision settings (`base`, built from a precision plugin's mode) with what the plugin adds: its
    loss scaler (``MixedPrecision("16-mixed", "cuda", scaler=GradScaler(...))``) and an ``FSDPPrecision(mode,
    policy=...)``'s policy; the strategy refuses what its precision cannot take (`Strategy.configure_precision`). A plugin
    made for another device type than the run's `device` is an error (Lightning would autocast for that device only)."""
    from strategies.precision import Precision  # lazy: as in check_plugins

    listed = plugins if isinstance(plugins, (list, tuple)) else [plugins]
    plugin = None if plugins is None else next((p for p in listed if isinstance(p, Precision)), None)
    if plugin is None:
        return base
    if plugin.mode in ("fp16", "bf16") and plugin.device.type != device.type:
        raise ValueError(
            f"Trainer(plugins=[MixedPrecision({plugin.mode!r}, device={plugin.device.type!r})]) but this Trainer runs on "
            f"{device.type!r}: autocast would cover the other device only. Pass device={device.type!r}"
        )
    return dataclasses.replace(base, policy=plugin.settings.policy, scaler=plugin.settings.scaler)
