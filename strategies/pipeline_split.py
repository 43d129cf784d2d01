"""Splitting a model into pipeline stages by module name, as torchtitan splits it.

A model is a chain of *units*: the entries of its layer container (the `nn.ModuleList`/`nn.ModuleDict` with the
most entries, e.g. ``layers.0`` ... ``layers.7``, or ``model.layers.3`` in a model held one level down) and the
modules beside it on the way there (``embed``, ``norm``, ``head``, or ``model.embed_tokens``, ``lm_head``). A stage
holds some units; the others are set to None (a container keeps only its stage's entries, under their own names), so
a stage's ``state_dict`` keys are the full model's and checkpoints of any layout load into any other (torchtitan's
``_pipeline_module_split``). The model's forward must skip what it does not hold::

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:       # this stage's layers only
            x = layer(x)
        return self.head(x) if self.head is not None else x

Units without parameters (a rotary embedding's tables) stay on every stage. Automatic split: the container's layers
in equal numbers per stage, the units before it on the first stage and those after it on the last.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from torch import nn


def layer_container(model: nn.Module) -> str:
    """The name of `model`'s layer container: the `nn.ModuleList`/`nn.ModuleDict` with the most entries.

    Raises:
        ValueError: the model holds no such container.
    """
    best: str | None = None
    size = 0
    for name, sub in model.named_modules():
        if isinstance(sub, (nn.ModuleList, nn.ModuleDict)) and name and len(sub) > size:
            best, size = name, len(sub)
    if best is None:
        raise ValueError(
            f"{type(model).__name__} holds no nn.ModuleList or nn.ModuleDict of layers, so it cannot be split into pipeline "
            "stages by layer; keep its repeated blocks in one (e.g. self.layers = nn.ModuleList([...])), or pass "
            "PipelineConfig(module_fqns_per_stage=[[...], [...]]) naming each stage's modules"
        )
    return best


def units(model: nn.Module, container: str) -> tuple[list[str], list[str], list[str]]:
    """`model`'s units as (before the container, its entries, after it), each a list of module names."""
    before: list[str] = []
    after: list[str] = []
    entries: list[str] = []
    path = container.split(".")
    parent: nn.Module = model
    prefix = ""
    for depth, part in enumerate(path):
        seen = False
        for name, child in parent.named_children():
            if name == part:
                seen = True
            elif child is not None:
                (after if seen else before).append(prefix + name)
        parent = getattr(parent, part)
        prefix += part + "."
        if depth == len(path) - 1:
            entries = [prefix + name for name, _ in parent.named_children()]
    return before, entries, after


def has_parameters(module: nn.Module | None) -> bool:
    return module is not None and any(True for _ in module.parameters())


def auto_split(model: nn.Module, num_stages: int) -> list[list[str]]:
    """Module names per stage: equal numbers of the container's layers; what comes before it on the first stage,
    what comes after on the last.

    Raises:
        ValueError: the layers do not divide into `num_stages` stages.
    """
    container = layer_container(model)
    before, entries, after = units(model, container)
    if len(entries) % num_stages:
        raise ValueError(
            f"{type(model).__name__}'s {len(entries)} layers ({container}) do not divide into {num_stages} pipeline stages; "
            f"choose a pipeline size and stages_per_rank whose product divides {len(entries)}, or name each stage's modules "
            "with PipelineConfig(module_fqns_per_stage=[[...], ...])"
        )
    per = len(entries) // num_stages
    stages = [entries[i * per:(i + 1) * per] for i in range(num_stages)]
    stages[0] = before + stages[0]
    stages[-1] = stages[-1] + after
    return stages


def check_split(model: nn.Module, fqns: Sequence[Sequence[str]], num_stages: int) -> list[list[str]]:
    """Check explicit module names per stage: one list per stage, each unit with parameters in exactly one stage.

    Raises:
        ValueError: the wrong number of lists, a name that is no unit, a unit in two stages or in none.
    """
    stages = [list(stage) for stage in fqns]
    if len(stages) != num_stages:
        raise ValueError(
            f"module_fqns_per_stage has {len(stages)} lists, but the pipeline has {num_stages} stages (pipeline size × "
            "stages_per_rank); give one list of module names per stage"
        )
    container = layer_container(model)
    before, entries, after = units(model, container)
    known = [*before, *entries, *after]
    unknown = [name for stage in stages for name in stage if name not in known]
    if unknown:
        raise ValueError(f"module_fqns_per_stage names {unknown}, which are not modules a stage can hold; they are {known}")
    placed = [name for stage in stages for name in stage]
    twice = sorted({name for name in placed if placed.count(name) > 1})
    missing = [name for name in known if name not in placed and has_parameters(model.get_submodule(name))]
    if twice or missing:
        raise ValueError(
            f"module_fqns_per_stage must place every module with parameters in exactly one stage: "
            f"{'in several stages: ' + str(twice) if twice else ''}{' ' if twice and missing else ''}"
            f"{'in none: ' + str(missing) if missing else ''}"
        )
    if any(not stage for stage in stages):
        raise ValueError(f"module_fqns_per_stage has an empty stage: {stages}; every stage needs at least one module")
    return stages


def stage_indices(pp_rank: int, pp: int, stages_per_rank: int, v_style: bool) -> tuple[int, ...]:
    """The stages process `pp_rank` of `pp` holds: looped (``rank, rank + pp, ...``) or V (``rank, 2 pp - 1 - rank``)."""
    if v_style:
        return (pp_rank, 2 * pp - 1 - pp_rank)
    return tuple(pp_rank + s * pp for s in range(stages_per_rank))


def prune(model: nn.Module, keep: set[str], *, in_place: bool) -> nn.Module:
    """`model` holding only the units in `keep` (and units without parameters): the others set to None, a container's
    entries filtered under their own names. `in_place`: change `model` itself; else a view (shallow copies along the
    way, sharing every kept module and parameter with `model`)."""
    container = layer_container(model)
    before, entries, after = units(model, container)
    all_units = set(before) | set(entries) | set(after)
    return _pruned(model, "", keep, all_units, in_place)


def _pruned(module: nn.Module, prefix: str, keep: set[str], all_units: set[str], in_place: bool) -> nn.Module:
    target = module if in_place else copy.copy(module)
    children = dict(module._modules)
    if not in_place:
        target.__dict__["_modules"] = children
    for name, child in list(children.items()):
        fqn = prefix + name
        if fqn in all_units:
            if fqn not in keep and has_parameters(child):
                if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
                    del children[name]  # the container keeps the others under their own names
                else:
                    children[name] = None
        elif child is not None and any(unit.startswith(fqn + ".") for unit in all_units):
            children[name] = _pruned(child, fqn + ".", keep, all_units, in_place)
    if in_place:
        module.__dict__["_modules"] = children
    return target
