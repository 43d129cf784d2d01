"""A model's repeated blocks: the units `FSDPStrategy` shards by default, and the memory planner checkpoints and shards.

For a ``transformers`` model the blocks are each class its ``_no_split_modules`` names (what Accelerate's
``transformer_based_wrap`` shards); otherwise the class of the longest `nn.ModuleList` whose entries share one class
(``model.layers`` of a hand-written transformer, as torchtitan shards it). A model with neither has no blocks (an MLP).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Blocks:
    """The repeated blocks of a model: their classes, and the `nn.ModuleList` holding them (its name in the model)."""

    classes: tuple[type[nn.Module], ...]
    list_name: str | None
    count: int


def find_blocks(model: nn.Module) -> Blocks:
    """The block classes (``_no_split_modules`` first, else the longest list of same-class modules) and their list."""
    lists = [(name, sub) for name, sub in model.named_modules() if isinstance(sub, nn.ModuleList) and len(sub) > 0]
    same = [(name, sub) for name, sub in lists if len({type(m) for m in sub}) == 1]
    names = set(getattr(model, "_no_split_modules", None) or ())
    if names:
        classes = tuple({type(m) for m in model.modules() if type(m).__name__ in names})
        holding = [(name, sub) for name, sub in same if isinstance(sub[0], classes)]
    else:
        holding = same
        classes = ()
    if not holding:
        return Blocks(classes=classes, list_name=None, count=0)
    name, longest = max(holding, key=lambda item: len(item[1]))
    first = next(iter(longest))  # (a pipeline stage's list keeps its layers' own indices: not always 0)
    return Blocks(classes=classes or (type(first),), list_name=name, count=len(longest))
