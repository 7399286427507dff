"""The abort signal of one attempt (``ctx.signal``): its deadline, a lost lease, or the worker's shutdown."""

from __future__ import annotations

import threading
import time

from .exceptions import AttemptTimedOut, LeaseLost, WorkerStopping

_ABORT_ERRORS: dict[str, type[LeaseLost]] = {
    "timed_out": AttemptTimedOut,
    "lease_lost": LeaseLost,
    "shutdown": WorkerStopping,
}
_ABORT_MESSAGES = {
    "timed_out": "The attempt ran past its timeout",
    "lease_lost": "The attempt's lease is no longer its own",
    "shutdown": "The worker is stopping",
}


class AbortSignal:
    """Aborts when the attempt ends: its deadline, a lost lease, or the worker's shutdown.

    The deadline is checked whenever the signal is read, so it holds even without a timer thread.
    """

    def __init__(self, deadline: float) -> None:
        self._event = threading.Event()
        self._deadline = deadline  # time.monotonic() value
        self.reason: str | None = None

    def abort(self, reason: str) -> None:
        """End the attempt with ``reason`` ("timed_out", "lease_lost" or "shutdown"); the first reason stays."""
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def aborted(self) -> bool:
        """Whether the attempt has ended (its deadline passed, its lease was lost, or the worker is stopping)."""
        if not self._event.is_set() and time.monotonic() >= self._deadline:
            self.abort("timed_out")
        return self._event.is_set()

    def throw_if_aborted(self) -> None:
        """Raise the attempt's end (AttemptTimedOut, LeaseLost or WorkerStopping) if it has come."""
        if self.aborted:
            reason = self.reason or "lease_lost"
            raise _ABORT_ERRORS.get(reason, LeaseLost)(
                f"{_ABORT_MESSAGES.get(reason, 'The attempt ended')}: start no new effect; the next run picks up."
            )

    def remaining(self) -> float:
        """Return the seconds left before the deadline (0 once aborted): give it to a call as its timeout."""
        if self.aborted:
            return 0.0
        return max(0.0, self._deadline - time.monotonic())

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` or until the attempt is aborted; return whether it was aborted."""
        self._event.wait(min(seconds, max(0.0, self._deadline - time.monotonic())))
        return self.aborted
