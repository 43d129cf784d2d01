"""What an `Accelerator` prepared: the one list of each kind that checkpoints, the step and the Trainer read.

``accelerator.prepared`` holds, in the order they were prepared, the models, optimizers (`PreparedOptimizer`),
schedulers (`PreparedScheduler`), data loaders and the objects given to ``register_for_checkpointing``, and the data
seed the loaders draw their order from. ``save_state`` writes them in this order and ``load_state`` reads them back
into the same positions; a `Trainer` that starts another fit on the same accelerator lets its previous fit's
optimizers, schedulers and loaders go with `Prepared.forget`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from trainer.accelerator.wrappers import PreparedOptimizer, PreparedScheduler


@dataclass
class Prepared:
    """The objects an `Accelerator` prepared, each kind in preparation order (the order checkpoints use)."""

    models: list[nn.Module] = field(default_factory=list)
    optimizers: list[PreparedOptimizer] = field(default_factory=list)
    schedulers: list[PreparedScheduler] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom_objects: list[Any] = field(default_factory=list)  # register_for_checkpointing
    data_seed: int | None = None  # the seed of the loaders' shuffling order, agreed by every process at the first prepare

    def forget(self, *objects: Any) -> None:
        """Drop `objects` from their lists: prepared ones, or the optimizer or scheduler a prepared one wraps."""
        def kept(item: Any, wrapped: Any) -> bool:
            return all(item is not obj and (wrapped is None or wrapped is not obj) for obj in objects)

        self.optimizers[:] = [o for o in self.optimizers if kept(o, o.optimizer)]
        self.schedulers[:] = [s for s in self.schedulers if kept(s, s.scheduler)]
        for kind in (self.models, self.dataloaders, self.custom_objects):
            kind[:] = [item for item in kind if kept(item, None)]

    def clear(self) -> None:
        """Forget every prepared model, optimizer, scheduler and loader (``free_memory``); registered objects stay."""
        for kind in (self.models, self.optimizers, self.schedulers, self.dataloaders):
            kind.clear()
