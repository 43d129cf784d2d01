"""Decisions every process must take at the same batch, agreed without a collective per batch.

Stopping (``trainer.should_stop`` set on any process: a callback, the `Timer`, early stopping) and a preemption
signal (SIGTERM/SIGUSR1 received by any process) must take effect at the same batch everywhere, or a process would
wait forever in a collective the others left. They are agreed in one small all-reduce (any process's stop or signal
counts), only where the loop must decide:

- after every validation and at the end of every epoch, where the loop decides anyway;
- during training, at the end of a batch that ends an accumulation window, every ``stop_check_interval``: seconds (a
  float, default 1.0) or batches (an int; 1 is every batch). For seconds, each agreement also fixes how many
  batches the next one is away, from the batch time measured since the last (the smallest proposal of the
  processes), so every process counts to the same batch without a clock in common.

Callbacks agree on their own decisions the same way (``ModelCheckpoint(train_time_interval=...)``: any process's
clock says a save is due): `register` a key in ``setup``, `request` it on any process, and `take` it where every process
acts on it (the same batch on all, after the agreement that carried it; at once with one process).

Latency: a signal or a stop set during training takes effect within about ``stop_check_interval`` seconds plus one
batch (or the rest of an accumulation window); a preemption grace period is tens of seconds (SLURM's
``--signal=USR1@90``, Kubernetes' 30 s), which leaves room for the checkpoint. With one process there is nothing to
agree: the flags are read every batch, where they are set, at no cost.

The opt-in per-batch checks are another matter: with ``on_nonfinite`` set, the processes agree on every batch whether
to skip it (a non-finite loss, or a ``training_step`` returning None) before its backward — one all-reduce and one
host read per batch, the price of the check. Without it a ``training_step`` returning None on one of several
processes is an error (the others would wait in the gradient reduction), as it is unsupported in Lightning.
Anchor: torchtitan's trainer, which keeps its checks on the device and synchronizes only at logging and checkpoint
steps; Lightning instead broadcasts its SIGTERM flag every batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainer.accelerator.signals import SignalRecorder

if TYPE_CHECKING:
    from trainer.fit.run_state import RunState

FIRST_GAP = 8  # batches before the first timed agreement (the batch time is not known yet)


class LoopAgreement:
    """Agrees on stop and preemption across processes at scheduled batches; see the module docstring.

    Args:
        world_size: the number of processes (one: nothing is reduced).
        interval: ``stop_check_interval``: seconds (float) or batches (int) between agreements during training.
        reduce: the all-reduce of the run (``accelerator.reduce``), with op ``"max"``.
        device: where the flags tensor lives (the reduction's device).
    """

    def __init__(self, *, world_size: int, interval: int | float, reduce: Callable[[torch.Tensor, str], Any], device: torch.device) -> None:
        self.several = world_size > 1
        self.seconds = float(interval) if isinstance(interval, float) else None
        self.fixed_gap = int(interval) if isinstance(interval, int) else None
        self.reduce = reduce
        self.device = device
        self.signals = SignalRecorder()
        self.signal = 0  # the signal every process agreed on (0: none)
        self.nonfinite = False  # the processes agreed this batch's loss is not finite (on_nonfinite)
        self.agreements = 0  # all-reduces made during training batches (the per-step collectives test reads it)
        self._countdown = self.fixed_gap if self.fixed_gap is not None else FIRST_GAP
        self._since = 0  # batches counted since the last agreement, and the time it was made
        self._last_time = time.perf_counter()
        self._requests: dict[str, bool] = {}  # the callbacks' registered decisions: asked for by this process
        self._agreed: set[str] = set()  # asked for by some process, agreed by all, not yet taken

    def begin_epoch(self) -> None:
        """Time batches from here (the epoch's first batch), not from the setup or validation before it."""
        self._since, self._last_time = 0, time.perf_counter()

    def due(self) -> bool:
        """Count a batch that ends an accumulation window; True when the processes agree at its end (every batch
        with one process)."""
        if not self.several:
            return True
        self._countdown -= 1
        self._since += 1
        return self._countdown <= 0

    def agree(self, state: RunState) -> bool:
        """Make every process agree on stopping (the run `state`'s ``should_stop``) and on a received signal; returns
        the agreed stop.

        The agreed stop lands in ``state.should_stop`` (``trainer.should_stop``) and the signal in `signal` on every
        process."""
        stop: bool = state.should_stop
        received = self.signals.received
        if self.several:
            gap = self._next_gap()
            keys = list(self._requests)
            asked = [float(self._requests[key]) for key in keys]
            flags = self.reduce(torch.tensor([float(stop), float(received), -float(gap), *asked], device=self.device), "max").tolist()
            stop, received, gap = bool(flags[0]), int(flags[1]), int(-flags[2])
            self._agreed.update(key for key, flag in zip(keys, flags[3:]) if flag)
            state.should_stop = stop
            self._countdown, self._since, self._last_time = gap, 0, time.perf_counter()
        self.signal = self.signal or received
        return stop

    def register(self, key: str) -> None:
        """Declare the decision `key`, which any process may then `request` (every process registers the same keys in the
        same order: in a callback's ``setup``)."""
        self._requests.setdefault(key, False)

    def request(self, key: str) -> None:
        """This process asks for `key`: every process `take`s it after the next agreement (at once with one process)."""
        if key not in self._requests:
            raise KeyError(f"LoopAgreement.request({key!r}): register the key first (every process, in setup)")
        if self.several:
            self._requests[key] = True
        else:
            self._agreed.add(key)

    def take(self, key: str) -> bool:
        """True, once, when the processes agreed on `key` (the same batch on every process); clears this process's
        own request of it too, so one agreement makes one decision."""
        if key not in self._agreed:
            return False
        self._agreed.discard(key)
        self._requests[key] = False
        return True

    def agree_skip(self, skip: bool, nonfinite: bool) -> tuple[bool, bool]:
        """The per-batch check of ``on_nonfinite``: (skip this batch, its loss is not finite) on any process."""
        if self.several:
            flags = self.reduce(torch.tensor([float(skip), float(nonfinite)], device=self.device), "max").tolist()
            skip, nonfinite = bool(flags[0]), bool(flags[1])
        self.nonfinite = nonfinite
        return skip, nonfinite

    def _next_gap(self) -> int:
        """Batches to the next agreement: the fixed interval, or as many as fit in `seconds` at the batch time
        measured since the last agreement."""
        if self.fixed_gap is not None:
            return self.fixed_gap
        seconds = self.seconds if self.seconds is not None else 0.0
        if not self._since:  # agreed at a validation or an epoch end right after the last one: nothing measured
            return self._countdown if self._countdown > 0 else FIRST_GAP
        per_batch = max((time.perf_counter() - self._last_time) / self._since, 1e-9)
        return max(1, min(int(seconds / per_batch), 1 << 20))
