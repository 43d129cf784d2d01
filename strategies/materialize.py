"""Empty (meta-device) models made real, one module at a time, on each process's shard only.

A model built under ``torch.device("meta")`` (`Strategy.module_init_context`, ``Trainer.init_module()``,
``TrainModule.configure_model()``, ``trainer.init_empty_weights()``) has shapes but no storage. After a strategy
has sharded it (FSDP2's `fully_shard` works on meta parameters), `materialize` allocates each process's shards
(``to_empty``) and fills them by running the model's own initialization:

1. each submodule's ``reset_parameters()`` (torch's layers all have one), in ``model.modules()`` order;
2. for a Hugging Face model (a module with ``_init_weights``), its ``_init_weights(submodule)`` in the order its
   ``initialize_weights`` applies it (children before parents), each sub-model (an inner module with its own
   ``_init_weights``) finished, steps 1 and 2, before the modules its parent builds after it.

Each step sees *full-size* temporary tensors for one submodule's own parameters and buffers, drawn from torch's CPU
generator as an eager constructor would; each process then keeps only its slice. So a process never holds more
than its shards plus one submodule, and the values equal what the same steps give in one process with the same
seed: process 0's generator state is shared first, so every process makes the same draws. For a model whose
constructor initializes its layers in ``modules()`` order (an ``nn.Sequential``, most hand-written models), that is
exactly the eager constructor's result; a Hugging Face model gets its ``_init_weights`` distribution.

A tensor that no step initializes (a submodule without ``reset_parameters`` whose parameters or buffers nothing
else sets, e.g. a buffer computed in ``__init__``) is an error naming it, never garbage: the temporaries start as
NaN (integer ones as their dtype's maximum) and are checked after the steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

_INIT_DEVICE = torch.device("cpu")  # where the full-size temporaries are drawn: the CPU generator, as an eager constructor


def has_meta_tensors(module: nn.Module) -> bool:
    """True when any parameter or buffer of `module` is on the meta device (built empty)."""
    return any(_is_meta(t) for t in _tensors(module))


def materialize(
    module: nn.Module, device: torch.device, *, broadcast_object: Callable[[Any], Any] | None = None, rng_state: torch.Tensor | None = None,
) -> nn.Module:
    """Allocate `module`'s meta tensors on `device` and initialize them (see the module docstring); returns `module`.

    Works on plain and on sharded (DTensor) parameters; ``broadcast_object`` (the strategy's, on several processes)
    shares process 0's CPU generator state first. ``rng_state``: draw from this CPU generator state (the one at the end of
    the block that built the model, `Strategy.module_init_context`) and leave the generator as it was afterwards, so
    the draws do not depend on what ran between building and preparing (e.g. a data loader drawing its seed).

    Raises:
        ValueError: some tensor was initialized by no step; the message names it and the fix.
    """
    if not has_meta_tensors(module):
        return module
    restore = torch.get_rng_state() if rng_state is not None else None
    if rng_state is not None:
        torch.set_rng_state(rng_state)
    if broadcast_object is not None:
        torch.set_rng_state(broadcast_object(torch.get_rng_state()))
    try:
        _initialize(module, device)
    finally:
        if restore is not None:
            torch.set_rng_state(restore)
    return module


def _initialize(module: nn.Module, device: torch.device) -> None:
    empty = _allocate(module, device)
    names = {id(sub): name for name, sub in module.named_modules(remove_duplicate=False)}
    pending: set[str] = set()
    done_reset: set[int] = set()
    done_hf: set[int] = set()
    for unit in _init_units(module):
        for sub in unit.modules():
            if id(sub) in empty and id(sub) not in done_reset:
                done_reset.add(id(sub))
                reset = getattr(sub, "reset_parameters", None)
                init = (lambda m: m.reset_parameters()) if callable(reset) else None
                _with_full_tensors(sub, init, empty[id(sub)], names, pending, first=True)
        init_weights = getattr(unit, "_init_weights", None)
        if callable(init_weights):
            for sub in _post_order(unit):
                if id(sub) in empty and id(sub) not in done_hf:
                    done_hf.add(id(sub))
                    _with_full_tensors(sub, init_weights, empty[id(sub)], names, pending, first=False)
    if pending:
        missing = sorted(pending)
        raise ValueError(
            f"{len(missing)} tensor(s) of the model built on the meta device were initialized by nothing: {', '.join(missing[:8])}"
            f"{' ...' if len(missing) > 8 else ''}. Materializing runs each submodule's reset_parameters() (and a Hugging Face "
            "model's _init_weights); give the submodules owning them a reset_parameters() that sets every parameter and buffer, "
            "or build the model outside the empty-init context (empty_init=False)"
        )


def allocate_empty(module: nn.Module, device: torch.device) -> None:
    """Allocate `module`'s meta tensors on `device`, uninitialized (to be filled by the caller), tied ones staying tied."""
    _allocate(module, device)


def to_meta(module: nn.Module) -> nn.Module:
    """Move `module`'s parameters and buffers to the meta device in place, tied ones staying tied (``module.to("meta")`` unties them)."""
    moved: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, t in list(table.items()):
                if t is None or t.is_meta:
                    continue
                if id(t) not in moved:
                    meta = torch.empty_like(t, device="meta")
                    moved[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
                table[name] = moved[id(t)]  # type: ignore[assignment]
    return module


def _allocate(module: nn.Module, device: torch.device) -> dict[int, list[str]]:
    """Allocate (uninitialized) every tensor on the meta device; returns ``{id(submodule): names of its tensors allocated}``.

    Per submodule, so that tensors built for real (outside the empty-init context, or buffers left real by
    ``init_empty_weights(include_buffers=False)``) keep their values.
    """
    empty: dict[int, list[str]] = {}
    allocated: dict[int, torch.Tensor] = {}  # id(meta tensor) -> its allocation: a tensor shared (tied) stays shared
    replaced: list[torch.Tensor] = []  # the meta tensors, kept alive so that their ids stay theirs
    for name, sub in module.named_modules(remove_duplicate=False):
        own = {n: t for n, t in [*sub._parameters.items(), *sub._buffers.items()] if t is not None}
        meta = [n for n, t in own.items() if _is_meta(t)]
        for n in [n for n in meta if id(own[n]) in allocated]:  # tied to a tensor an earlier submodule allocated
            (sub._parameters if n in sub._parameters else sub._buffers)[n] = allocated[id(own[n])]
        fresh = [n for n in meta if id(own[n]) not in allocated]
        if not fresh:
            continue
        if len(fresh) == len(own):
            sub.to_empty(device=device, recurse=False)
        elif any(hasattr(t, "placements") for t in own.values()):
            raise ValueError(
                f"submodule {name or type(sub).__name__!r} has some sharded tensors on the meta device and some real (or tied) "
                "ones; build each layer entirely inside or entirely outside the empty-init context"
            )
        else:
            for n in fresh:
                t = own[n]
                if n in sub._parameters:
                    sub._parameters[n] = nn.Parameter(torch.empty_like(t, device=device), requires_grad=t.requires_grad)
                else:
                    sub._buffers[n] = torch.empty_like(t, device=device)
        for n in fresh:
            allocated[id(own[n])] = getattr(sub, n)
            replaced.append(own[n])
        empty[id(sub)] = fresh
    return empty


def _init_units(root: nn.Module) -> list[nn.Module]:
    """The sub-models to finish one after another: inner modules with their own ``_init_weights`` (children first), then the root."""
    units = [m for m in _post_order(root) if m is not root and callable(getattr(m, "_init_weights", None))]
    return [*units, root]


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    seen: set[int] = set()

    def visit(m: nn.Module) -> Iterator[nn.Module]:
        for child in m.children():
            if id(child) not in seen:
                yield from visit(child)
        if id(m) not in seen:
            seen.add(id(m))
            yield m

    yield from visit(module)


def _with_full_tensors(
    sub: nn.Module, init: Callable[[nn.Module], Any] | None, born_empty: list[str], names: dict[int, str], pending: set[str], *,
    first: bool,
) -> None:
    """Swap full-size temporaries in for `sub`'s own parameters and buffers, run `init(sub)`, keep each process's slice.

    ``first``: the temporaries start empty (NaN / int max: "not initialized"); otherwise they start from the values
    so far (gathered from the shards: a collective when sharded).
    """
    own = [(name, t) for name, t in [*sub._parameters.items(), *sub._buffers.items()] if t is not None and name in born_empty]
    if not own:
        return
    prefix = f"{names[id(sub)]}." if names.get(id(sub)) else ""
    temps: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, tensor in own:
            temps[name] = _sentinel_like(tensor) if first else _full_value(tensor)
        with _swapped(sub, temps):
            if init is not None:
                init(sub)
            current = {name: getattr(sub, name) for name, _ in own}  # an init may replace a tensor (rare): take what it left
        for name, tensor in own:
            value = current[name]
            if not isinstance(value, torch.Tensor):
                continue
            label = prefix + name
            if _untouched(value):
                pending.add(label)
            else:
                pending.discard(label)
            _write_local(tensor, value)


@contextlib.contextmanager
def _swapped(sub: nn.Module, temps: dict[str, torch.Tensor]) -> Iterator[None]:
    saved_params = dict(sub._parameters)
    saved_buffers = dict(sub._buffers)
    for name, temp in temps.items():
        if name in sub._parameters:
            sub._parameters[name] = nn.Parameter(temp, requires_grad=saved_params[name].requires_grad)  # type: ignore[union-attr]
        else:
            sub._buffers[name] = temp
    try:
        yield
    finally:
        sub._parameters.update(saved_params)
        sub._buffers.update(saved_buffers)


def _sentinel_like(tensor: torch.Tensor) -> torch.Tensor:
    shape, dtype = tensor.shape, tensor.dtype
    out = torch.empty(shape, dtype=dtype, device=_INIT_DEVICE)
    if dtype.is_floating_point or dtype.is_complex:
        out.fill_(float("nan"))
    elif dtype != torch.bool:
        out.fill_(torch.iinfo(dtype).max)
    return out


def _untouched(value: torch.Tensor) -> bool:
    if value.numel() == 0 or value.dtype == torch.bool:
        return False
    if value.dtype.is_floating_point or value.dtype.is_complex:
        return bool(torch.isnan(value).any())
    return bool((value == torch.iinfo(value.dtype).max).all())


def _full_value(tensor: torch.Tensor) -> torch.Tensor:
    full = getattr(tensor, "full_tensor", None)
    value = full() if callable(full) else tensor
    return value.detach().to(_INIT_DEVICE, copy=True)


def _write_local(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this process's slice of `full` into `target` (a DTensor's local shard, or a plain tensor)."""
    placements = getattr(target, "placements", None)
    if placements is None:
        target.copy_(full.to(dtype=target.dtype))
        return
    from torch.distributed.tensor import distribute_tensor

    sharded: Any = target  # a DTensor
    local = distribute_tensor(full.to(device=target.device, dtype=target.dtype), sharded.device_mesh, placements, src_data_rank=None).to_local()
    sharded.to_local().copy_(local)


def _tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def _is_meta(tensor: torch.Tensor) -> bool:
    if tensor.is_meta:
        return True
    local = getattr(tensor, "_local_tensor", None)
    return isinstance(local, torch.Tensor) and local.is_meta


def scatter_from_rank0(module: nn.Module, source: dict[str, torch.Tensor] | None, *, rank: int, group: Any = None) -> None:
    """Fill a sharded `module` (allocated, e.g. by ``to_empty``) with process 0's full state `source`, slice by slice.

    ``cpu_ram_efficient_loading``: process 0 built the model with real (pretrained) weights, the others on the meta
    device. Process 0 sends each process only its slice of each parameter (a scatter), so no other process ever holds
    a full parameter; buffers (not sharded) are broadcast. Every process calls it; `source` is read on process 0 only.
    """
    import torch.distributed as dist
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    targets = full_state(module)
    layouts = [(name, *_layout(t, compute_local_shape_and_global_offset)) for name, t in targets.items()]
    world = dist.get_world_size(group)
    all_layouts = [None] * world
    dist.all_gather_object(all_layouts, layouts, group=group)
    if rank == 0 and source is not None:
        missing = sorted(set(targets) - set(source))
        if missing:
            raise ValueError(f"process 0's model lacks {missing[:8]} that the sharded model has; build the same model on every process")
    with torch.no_grad():
        for i, (name, target) in enumerate(targets.items()):
            local = target.to_local() if hasattr(target, "to_local") else target
            if not hasattr(target, "placements"):
                buffer = source[name].to(local.device, local.dtype) if rank == 0 and source is not None else torch.empty_like(local)
                dist.broadcast(buffer, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
                local.copy_(buffer)
                continue
            width = max(1, max(_numel(layout[i][1]) for layout in all_layouts))  # type: ignore[index]
            receive = torch.empty(width, dtype=local.dtype, device=local.device)
            parts = None
            if rank == 0 and source is not None:
                full = source[name]
                parts = []
                for layout in all_layouts:
                    shape, offset = layout[i][1], layout[i][2]  # type: ignore[index]
                    piece = full[tuple(slice(o, o + s) for o, s in zip(offset, shape))].reshape(-1)
                    padded = torch.zeros(width, dtype=local.dtype, device=local.device)
                    padded[: piece.numel()] = piece.to(local.device, local.dtype)
                    parts.append(padded)
            dist.scatter(receive, parts, group=group, group_src=0)
            local.copy_(receive[: local.numel()].view(local.shape))


def full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s state dict plus its non-persistent buffers (e.g. rotary tables), which a meta copy would lose too."""
    return {**dict(module.named_buffers()), **module.state_dict()}


def _layout(tensor: torch.Tensor, compute: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return tuple(tensor.shape), (0,) * tensor.dim()
    shape, offset = compute(tensor.shape, getattr(tensor, "device_mesh"), placements)  # noqa: B009  (a DTensor attribute)
    return tuple(shape), tuple(offset)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def is_sharded_module(module: nn.Module) -> bool:
    """True when some parameter of `module` is a DTensor (sharded by FSDP2 or tensor parallel)."""
    return any(hasattr(p, "placements") for p in module.parameters())


def load_safetensors_slices(path: Any, module: nn.Module) -> None:
    """Fill a sharded `module` from a full safetensors file, reading only this process's slice of each tensor.

    No process reads (or holds) a whole parameter: each takes its rows from the file with ``safe_open``'s slicing.
    The file's names and shapes must already have been checked against the module (`checkpoint_io.check_state_fits`);
    names missing from the file (``strict=False``) are left as they are.
    """
    from safetensors import safe_open
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    targets = module.state_dict()
    with safe_open(str(path), framework="pt") as f, torch.no_grad():
        stored = set(f.keys())
        for name, target in targets.items():
            if name not in stored:
                continue
            local = target.to_local() if hasattr(target, "to_local") else target
            shape, offset = _layout(target, compute_local_shape_and_global_offset)
            piece = f.get_slice(name)[tuple(slice(o, o + s) for o, s in zip(offset, shape))] if shape else f.get_tensor(name)
            local.copy_(piece.to(local.device, local.dtype).reshape(local.shape))
