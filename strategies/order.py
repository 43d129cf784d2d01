"""The order a prepared loader draws, as Accelerate's draws it, and what it takes to draw a pass's order again.

Accelerate's prepared loader keeps the script's sampler, which draws at every pass from its generator or from
torch's global RNG (with several processes it gives a sampler without a generator one, seeded by one draw from the
global RNG, and synchronizes it as each pass starts); with ``use_seedable_sampler`` a `RandomSampler` becomes a
`SeedableRandomSampler`. `ordered` sets a batch sampler up the same way.

For an exact mid-epoch resume a loader records, as each pass starts, the state of the RNG its order is drawn from
(`pass_record`): `redraw` draws that order again later without touching the live RNGs. Plain functions of the
`BatchSamplerShard`; the loader (`strategies.data`) decides when to call them.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from strategies.sharding import BatchSamplerShard

__all__ = ["SeedableRandomSampler", "adopt_order_generator", "ordered", "random_sampler_indices"]

Record = dict[str, torch.Tensor]  # {"generator": state} or {"global": state}: what a pass's order was drawn from


class SeedableRandomSampler(RandomSampler):
    """Accelerate's ``SeedableRandomSampler``: the order of epoch ``e`` is drawn from a generator seeded with ``seed + e``.

    Every process building one with the same seed draws the same order in the same epoch, and a resumed run
    draws the order it was interrupted in. The generator is the one given (reseeded every epoch, as Accelerate
    does), else one of its own. ``seed`` (Accelerate's ``data_seed``) defaults to ``torch.initial_seed()``, the
    seed `set_seed` set. Iterating it directly advances the epoch after a full pass (a prepared loader sets the
    epoch itself).
    """

    def __init__(
        self, data_source: Any, replacement: bool = False, num_samples: int | None = None,
        generator: torch.Generator | None = None, *, seed: int | None = None, data_seed: int | None = None,
    ) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        chosen = seed if seed is not None else data_seed
        self.seed = int(chosen) if chosen is not None else torch.random.initial_seed()
        self.epoch = 0

    @property
    def initial_seed(self) -> int:
        """Accelerate's name for ``seed``."""
        return self.seed

    def set_epoch(self, epoch: int) -> None:
        """Select the order of ``epoch``."""
        self.epoch = epoch

    def indices_tensor(self) -> torch.Tensor:
        """This epoch's indices as an int64 tensor (what iterating the sampler yields)."""
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.seed + self.epoch)
        return random_sampler_indices(self, self.generator)

    def __iter__(self) -> Iterator[int]:
        yield from self.indices_tensor().tolist()
        self.epoch += 1


def random_sampler_indices(sampler: RandomSampler, generator: torch.Generator | None = None) -> torch.Tensor:
    """One pass of a `RandomSampler` as an int64 tensor, drawn with the same calls as its ``__iter__``.

    From ``generator`` if given, else from the sampler's own, else from a generator seeded by one draw from
    torch's global RNG (so the RNGs are left exactly as iterating the sampler leaves them).
    """
    gen = generator if generator is not None else sampler.generator
    if gen is None:
        gen = torch.Generator()
        gen.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return torch.cat([draw(gen) for _, draw in _random_sampler_draws(sampler)])


def _random_sampler_draws(sampler: RandomSampler) -> list[tuple[int, Callable[[torch.Generator], torch.Tensor]]]:
    """The draws `RandomSampler.__iter__` makes, in order: (position of the first index it yields, the draw).

    Its ``__iter__`` is a generator: each draw happens when the index at its position is first asked for.
    """
    n, m = len(sampler.data_source), sampler.num_samples

    def randint(size: int) -> Callable[[torch.Generator], torch.Tensor]:
        return lambda gen: torch.randint(high=n, size=(size,), dtype=torch.int64, generator=gen)

    def randperm(keep: int | None) -> Callable[[torch.Generator], torch.Tensor]:
        return lambda gen: torch.randperm(n, generator=gen)[:keep]

    if sampler.replacement:
        return [(32 * j, randint(32)) for j in range(m // 32)] + [(32 * (m // 32), randint(m % 32))]
    return [(n * j, randperm(None)) for j in range(m // n)] + [(n * (m // n), randperm(m % n))]


def flat_index_tensor(sampler: Any) -> torch.Tensor:
    """One pass of a sized sampler as an int64 tensor (drawing what iterating it draws)."""
    if hasattr(sampler, "indices_tensor"):
        indices: torch.Tensor = sampler.indices_tensor()
        return indices
    if type(sampler) is SequentialSampler:
        return torch.arange(len(sampler))
    if type(sampler) is RandomSampler:
        return random_sampler_indices(sampler)
    return torch.as_tensor(list(sampler), dtype=torch.int64)


def ordered(batch_sampler: Any, seed: int | None, num_processes: int) -> tuple[Any, torch.Generator | None]:
    """The batch sampler drawing its order as Accelerate's prepared one does, and the generator to synchronize.

    With a ``seed``, a `RandomSampler` (or subclass) becomes a `SeedableRandomSampler` (``use_seedable_sampler``).
    Without, the sampler is kept; with several processes a sampler with a ``generator`` attribute left at ``None``
    gets a generator seeded by one draw from torch's global RNG, as Accelerate gives it (on the sampler itself).
    """
    sampler: Any = getattr(batch_sampler, "sampler", None)
    if seed is not None:
        if not isinstance(sampler, RandomSampler):
            return batch_sampler, None
        seeded = SeedableRandomSampler(
            sampler.data_source, replacement=sampler.replacement, num_samples=sampler._num_samples, generator=sampler.generator,
            seed=seed,
        )
        if type(batch_sampler) is BatchSampler:
            return BatchSampler(seeded, batch_sampler.batch_size, batch_sampler.drop_last), None
        batch_sampler.sampler = seeded  # a custom batch sampler: replaced in place, as Accelerate does
        return batch_sampler, None
    if num_processes == 1 or not hasattr(sampler, "generator"):
        return batch_sampler, None
    if sampler.generator is None:
        sampler.generator = torch.Generator()
        sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return batch_sampler, sampler.generator


# --- recording and redrawing a pass's order --------------------------------------------------------------------------

def _inner_sampler(shard: Any) -> Any:
    """The sampler under a `BatchSamplerShard`'s batch sampler (None for a batch sampler without one)."""
    return getattr(getattr(shard, "batch_sampler", None), "sampler", None)


def _draws_nothing(sampler: Any) -> bool:
    """Whether a sampler's order is fixed by its settings and epoch alone (nothing to record for a resume)."""
    return type(sampler) is SequentialSampler or isinstance(sampler, SeedableRandomSampler)


def order_generator(shard: Any) -> torch.Generator | None:
    """The generator the sampler draws its order from (None: a fixed order, or torch's global RNG)."""
    sampler = _inner_sampler(shard)
    generator = getattr(sampler, "generator", None)
    return generator if isinstance(generator, torch.Generator) and not _draws_nothing(sampler) else None


def pass_record(shard: Any) -> Record:
    """The state of the RNG a pass's order will be drawn from, taken as the pass starts."""
    if not isinstance(shard, BatchSamplerShard) or _draws_nothing(_inner_sampler(shard)):
        return {}
    generator = order_generator(shard)
    return {"generator": generator.get_state()} if generator is not None else {"global": torch.get_rng_state()}


def boundary_record(shard: Any) -> Record:
    """Between passes: the sampler's generator as it is (torch's global RNG is the checkpoint's to restore)."""
    generator = order_generator(shard)
    return {"generator": generator.get_state()} if generator is not None else {}


def adopt_order_generator(shard: Any, order: Any) -> None:
    """Give a sampler drawing from torch's global RNG the generator a saved pass drew from (``order`` holds one).

    With several processes `ordered` gives a `RandomSampler` without a generator one, so a checkpoint of several
    processes records the order's generator; resumed on one process, where the sampler has none, the sampler gets
    one, and goes on drawing the order the interrupted run would have drawn (not one from the global RNG).
    """
    sampler = _inner_sampler(shard)
    if (isinstance(order, Mapping) and "generator" in order and isinstance(sampler, RandomSampler)
            and not _draws_nothing(sampler) and sampler.generator is None):
        sampler.generator = torch.Generator()


def encode(record: Record) -> dict[str, str]:
    """``record`` for JSON."""
    return {name: base64.b64encode(state.contiguous().numpy().tobytes()).decode("ascii") for name, state in record.items()}


def decode(order: Any, shard: Any) -> Record:
    """The record `encode` wrote, checked against the RNGs it will be loaded into.

    Raises:
        ValueError: if ``order`` is not what `encode` wrote for such a loader.
    """
    if order is None:
        return {}
    if not isinstance(order, Mapping) or not set(order) <= {"generator", "global"}:
        raise ValueError(
            f"state_dict['order']={order!r:.80} is not valid; pass the dict returned by DataLoaderShard.state_dict() unchanged"
        )
    record = {}
    if "global" in order:
        record["global"] = _decoded(order["global"], torch.get_rng_state(), "global")
    generator = order_generator(shard)
    if "generator" in order and generator is not None:
        record["generator"] = _decoded(order["generator"], generator.get_state(), "generator")
    return record


def _decoded(text: Any, like: torch.Tensor, what: str) -> torch.Tensor:
    try:
        raw = base64.b64decode(text, validate=True) if isinstance(text, str) else None
    except ValueError:
        raw = None
    if raw is None or len(raw) != like.numel():
        raise ValueError(
            f"state_dict['order'][{what!r}] is not the saved state of a {like.numel()}-byte RNG; pass the dict returned by "
            "DataLoaderShard.state_dict() unchanged"
        )
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def redraw(shard: BatchSamplerShard, record: Record, loader_generator: torch.Generator | None) -> Any:
    """The order a pass drew from ``record``, drawn again as it was (the loader's base seed first): an index tensor,
    or the list of batches of a batch sampler of its own. Torch's global RNG is left as it is and the sampler's
    generator where that pass left it."""
    sampler = _inner_sampler(shard)
    generator = order_generator(shard)
    # a pass one process drew from the global RNG, resumed on several, where `ordered` gave the sampler a generator
    from_global = "global" in record and "generator" not in record and generator is not None
    with torch.random.fork_rng(devices=[]):
        if "global" in record:
            torch.set_rng_state(record["global"])
        if "generator" in record and generator is not None:
            generator.set_state(record["generator"])
        if loader_generator is None or loader_generator is generator:
            torch.empty((), dtype=torch.int64).random_(generator=loader_generator)
        if from_global:
            sampler.generator = None
        try:
            if shard.arithmetic:
                return flat_index_tensor(sampler)
            return [list(batch) for batch in shard.batch_sampler]
        finally:
            if from_global:
                sampler.generator = generator


def undraw_unreached(shard: Any, record: Record, loader_generator: torch.Generator | None, asked: int) -> None:
    """Leave the sampler's generator as a plain loader's leaves it when a pass is left before its end, after the
    loader asked its batch sampler for ``asked`` batches of this process.

    A `RandomSampler` draws its order in parts, each when its first index is asked for (the last, possibly empty,
    part at the end); the order was drawn at once here, so the generator is set back to the parts asked for.
    """
    generator, sampler = order_generator(shard), _inner_sampler(shard)
    if generator is None or "generator" not in record or type(sampler) is not RandomSampler:
        return
    if not isinstance(shard, BatchSamplerShard) or not shard.arithmetic or asked > len(shard):
        return  # (asked past its end: the batch sampler drew every part)
    # the last batch of the underlying batch sampler read: `num_processes` of them per batch (one when split)
    read = asked - 1 if shard.split_batches else asked * shard.num_processes - 1
    size = shard.batch_sampler.batch_size
    replay = torch.Generator()
    replay.set_state(record["generator"])
    if loader_generator is generator:
        torch.empty((), dtype=torch.int64).random_(generator=replay)
    for first, draw in _random_sampler_draws(sampler):
        if first // size <= read:
            draw(replay)
    generator.set_state(replay.get_state())
