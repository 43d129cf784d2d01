"""Preemption signals: SIGTERM (spot instances, Kubernetes) and SIGUSR1 (SLURM's ``--signal=USR1@90``), recorded only.

Both faces use one `SignalRecorder`: the Accelerator's ``trigger_on_signals`` (your loop asks ``check_trigger()``)
and the Trainer's fit (its loop agrees on the signal and writes a preemption checkpoint, `trainer.fit.preemption`).
A handler does nothing but note the signal number; acting on it is a decision every process takes together.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from typing import Any

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s is not None)


class SignalRecorder:
    """Installs handlers that record a signal in `received`; `restore` puts the previous handlers back."""

    def __init__(self) -> None:
        self.received = 0
        self._previous: dict[int, Any] = {}

    def install(self, signals: Iterable[int] = SIGNALS, *, keep_user_handlers: bool, first_wins: bool) -> None:
        """Record `signals` (main thread only: Python delivers signals there).

        `keep_user_handlers`: leave a signal alone when a handler other than the default is set (the Trainer keeps
        the user's own). `first_wins`: keep the first signal received (else the latest).
        """
        if threading.current_thread() is not threading.main_thread():
            return

        def record(received: int, frame: Any) -> None:
            if not (first_wins and self.received):
                self.received = received

        for signum in signals:
            if keep_user_handlers and signal.getsignal(signum) is not signal.SIG_DFL:
                continue
            previous = signal.signal(signum, record)
            self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        """Put back the handlers `install` replaced."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
