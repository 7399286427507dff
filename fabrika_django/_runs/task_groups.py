"""How a run of Django tasks groups its writes: a group of claimed tasks started in one statement, and the
outcomes of the tasks before it written in that same statement.

A task's outcome is held until the next group starts, or the run ends: then one statement writes every held
outcome and the new group's RUNNING, each row checked against the version it was claimed with
(``_row_writes.update_rows``). A held outcome is lost only with the process, and a lost one is a task still
RUNNING with its claim's backoff as ``due``: a later run claims it again (at-least-once, as for a task whose
worker was killed while it ran). A task's result is therefore committed before its row leaves RUNNING.

The group's size comes from the run's own tasks (``Pace``): one at first, then as many as their mean time says
end within ``GROUP_WINDOW``. Slow tasks are started and recorded one by one, each outcome written as the next
task starts; only tasks of a few milliseconds share statements.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from .._row_writes import update_rows
from .._running import active_run, framework_write

logger = logging.getLogger(__name__)

#: How long a held outcome is meant to wait for the statement that writes it, at most, in seconds: the time the
#: tasks of one group are expected to take together.
GROUP_WINDOW = 0.01
#: The most tasks a run claims, starts or records in one statement.
MAX_GROUP = 50
#: Everything a run of tasks writes to a task's row. Each write names them all (the row's own value where the
#: write leaves one as it is): one statement's shape for every mix of starts and outcomes.
_WRITTEN = (
    "status",
    "started_at",
    "last_attempted_at",
    "worker_ids",
    "finished_at",
    "return_value",
    "errors",
    "last_failure",
    "attempts",
    "due",
)
#: The share of a new task's time in the run's running mean (``Pace``): a slow task shrinks the group at once.
_WEIGHT = 0.5


class Pace:
    """How many claimed tasks a run starts in one statement, from the mean time of the tasks it has run."""

    def __init__(self) -> None:
        self._mean: float | None = None

    def observe(self, seconds: float) -> None:
        """Count one task's time (its function and its bookkeeping, not the statements)."""
        self._mean = seconds if self._mean is None else (1 - _WEIGHT) * self._mean + _WEIGHT * seconds

    def group(self) -> int:
        """The tasks to start in the next statement: one until a task has been timed."""
        if self._mean is None:
            return 1
        return max(1, min(MAX_GROUP, int(GROUP_WINDOW / max(self._mean, 1e-6))))

    def claim(self, least: int) -> int:
        """The rows to claim next: ``least``, or the group's size when that is more."""
        return max(least, self.group())


class Writes:
    """The writes a run of tasks holds back to send with its next statement (see the module's docstring)."""

    def __init__(self, worker_id: str, written: Callable[[Any, Any], None]) -> None:
        self._worker_id = worker_id
        # Called with each row whose held outcome was written, and what was held with it (its task_finished).
        self._written = written
        self._held: list[tuple[Any, dict[str, Any], Any]] = []

    def hold(self, row: Any, values: dict[str, Any], task: Any = None) -> None:
        """Hold ``values`` (the task's outcome) for the row until the next statement; ``task``: the Task it ran."""
        self._held.append((row, values, task))

    def start(self, rows: list[Any]) -> list[Any]:
        """Mark ``rows`` RUNNING (``started_at`` kept from an earlier attempt, this worker's id appended) in one
        statement with the held outcomes; answer the rows started (not those that changed since their claim).

        Only after the fence's local check: a stale run never starts a task.
        """
        from ..models import TaskStatus

        check_fence()
        now = timezone.now()
        starts = [
            (
                row,
                {
                    "status": TaskStatus.RUNNING,
                    "started_at": row.started_at or now,
                    "last_attempted_at": now,
                    "worker_ids": [*row.worker_ids, self._worker_id],
                },
                None,
            )
            for row in rows
        ]
        written = self._send(starts)
        return [row for row, ok in zip(rows, written, strict=True) if ok]

    def flush(self) -> None:
        """Write the held outcomes now (the run's end, a given-back batch)."""
        self._send([])

    def flush_on_the_way_out(self) -> None:
        """``flush()`` as the run ends on an error: a failure to write is logged, the run's own error raised."""
        try:
            self.flush()
        except Exception as exc:
            # Those tasks stay RUNNING, claimed: a later run claims them again, as after a killed worker.
            logger.warning("Task outcomes not written error=%s code=task_outcomes_lost", type(exc).__name__)

    def _send(self, extra: list[tuple[Any, dict[str, Any], Any]]) -> list[bool]:
        """Write the held outcomes and ``extra`` in one statement; answer whether each of ``extra`` was written."""
        held, self._held = self._held, []
        writes = [*held, *extra]
        if not writes:
            return []
        full = [(row, {name: values.get(name, getattr(row, name)) for name in _WRITTEN}) for row, values, _t in writes]
        with framework_write():
            written = update_rows(
                type(full[0][0]), full[0][0]._state.db, [(row.pk, row.version, values) for row, values in full]
            )
        for (row, values), ok in zip(full, written, strict=True):
            if ok:
                for name, value in values.items():
                    setattr(row, name, value)
                row.version += 1
            else:
                logger.warning("Task changed since it was claimed task=%s code=version_conflict", row.result_id)
        for (row, _values, task), ok in zip(held, written, strict=False):
            if ok:
                self._written(row, task)
        return written[len(held) :]


def check_fence() -> None:
    """The attempt's fence's local check (``LeaseFence.check``: the signal, and the time the last renewal is known
    to cover; no round trip), through the thread's active run."""
    run = active_run()
    if run is not None and run.state is not None:
        run.state.fence.check()
