"""`GradientState`: Accelerate's view of the accumulation window and of the loader being iterated.

It keeps no state of its own: ``sync_gradients`` and the window's settings are the `Accelerator`'s `Stepper`'s (which
decides the boundaries), ``active_dataloader`` / ``end_of_dataloader`` / ``remainder`` are read from the loaders the
`Accelerator` prepared (each knows whether it is in a pass, and whether the batch in use is its last). Reading it
costs nothing in the training step.

Unlike Accelerate's, it is not one state shared by every `Accelerator` of the process: ``accelerator.gradient_state``
is that accelerator's, and ``GradientState()`` is the one of the `Accelerator` made last.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import TYPE_CHECKING, Any

from trainer.accelerator.config import GradientAccumulationPlugin

if TYPE_CHECKING:
    from trainer.accelerator.accelerator import Accelerator

_latest: list[weakref.ref[Accelerator]] = []  # the Accelerator made last, which `GradientState()` reads


def track(accelerator: Accelerator) -> None:
    """Make `accelerator` the one `GradientState()` reads (each `Accelerator` calls it as it is made)."""
    _latest[:] = [weakref.ref(accelerator)]


def _current() -> Accelerator:
    accelerator = _latest[0]() if _latest else None
    if accelerator is None:
        raise RuntimeError(
            "GradientState() reads the accumulation state of an Accelerator, and none exists in this process; create the "
            "Accelerator first (Accelerator(gradient_accumulation_steps=...)), then read accelerator.gradient_state"
        )
    return accelerator


class GradientState:
    """Whether this batch ends an accumulation window, the window's settings, and the loader being iterated.

    Args:
        gradient_accumulation_plugin: when given, the `Accelerator` counts windows by it from now on (as Accelerate's,
            where a new plugin replaces the shared settings).

    Raises:
        RuntimeError: if no `Accelerator` exists in this process.
        TypeError: if `gradient_accumulation_plugin` is not a `GradientAccumulationPlugin`.
    """

    __slots__ = ("_accelerator",)

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None) -> None:
        self._accelerator = _current()
        if gradient_accumulation_plugin is not None:
            if not isinstance(gradient_accumulation_plugin, GradientAccumulationPlugin):
                raise TypeError(
                    f"gradient_accumulation_plugin={gradient_accumulation_plugin!r} must be a trainer.utils.GradientAccumulationPlugin"
                )
            self._accelerator.gradient_plugin = gradient_accumulation_plugin
            self._accelerator.stepper.configure(gradient_accumulation_plugin)

    # the accumulation window (the Stepper's) ----------------------------------------------------------
    @property
    def sync_gradients(self) -> bool:
        """True on a batch that ends an accumulation window: gradients are reduced and optimizers step."""
        return self._accelerator.stepper.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self._accelerator.stepper.sync_gradients = bool(value)

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """The accumulation settings that differ from the defaults (Accelerate's ``plugin.to_kwargs()``)."""
        plugin = self._accelerator.stepper.accumulation
        return {f.name: getattr(plugin, f.name) for f in dataclasses.fields(plugin) if getattr(plugin, f.name) != f.default}

    @property
    def num_steps(self) -> int:
        """Batches per optimizer step."""
        return self._accelerator.stepper.accumulation_steps

    @property
    def adjust_scheduler(self) -> bool:
        """Whether a prepared scheduler counts the batches inside a window (as the plugin says; default True)."""
        return self._accelerator.stepper.accumulation.adjust_scheduler

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether the last batch of a loader ends the window and restarts the count."""
        return self._accelerator.stepper.accumulation.sync_with_dataloader

    @property
    def initialized(self) -> bool:
        return True

    @staticmethod
    def _reset_state() -> None:
        """Restart the accumulation window of the `Accelerator` made last (the next batch starts a window); nothing
        without one. Accelerate clears its shared state here; each `Accelerator` here has its own."""
        accelerator = _latest[0]() if _latest else None
        if accelerator is not None:
            accelerator.stepper.sync_gradients = True
            accelerator.stepper.batches_in_window = 0

    # the loader being iterated (the loaders') ---------------------------------------------------------
    @property
    def dataloader_references(self) -> list[Any]:
        """``None``, then the prepared loaders in a pass, in the order their passes began (the last is active)."""
        passes = {}
        for loader in self._accelerator.prepared.dataloaders:
            running = getattr(loader, "pass_in_progress", None)
            if running is not None:
                passes[running[0]] = running[1]
        return [None, *(passes[k] for k in sorted(passes))]

    @property
    def active_dataloader(self) -> Any:
        """The prepared loader whose pass began last and has not ended (None outside every pass)."""
        return self.dataloader_references[-1]

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    @property
    def end_of_dataloader(self) -> bool:
        """True while the batch in use is the last of the active loader's pass."""
        loader = self.active_dataloader
        return bool(loader is not None and loader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        """Real samples in the active loader's last step over all processes (-1 outside a pass, or unknown)."""
        loader = self.active_dataloader
        return -1 if loader is None else loader.remainder

    def __repr__(self) -> str:
        return (f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
                f"Extra samples added: {self.remainder}\nGradient accumulation plugin: {self.plugin_kwargs}\n")


def gradient_state_of(accelerator: Accelerator) -> GradientState:
    """The `GradientState` view an `Accelerator` returns as ``accelerator.gradient_state``: of that accelerator, not of
    the one made last (which ``GradientState()`` reads)."""
    view = object.__new__(GradientState)
    view._accelerator = accelerator
    return view


__all__ = ["GradientState"]
