"""What the admin's overview and ``fabrika_job status`` report: each queue table's counts (``_counts``), each
job's state, and the health findings of ``_health`` (computed from the same counts).

Both read the same data the same way: queue rows counted by the states of ``_queuestate`` (one statement
per table), jobs read through ``run_reads.job_states`` (nothing written on a read).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypedDict

from .._runs import reads as run_reads
from ..jobs import registry
from . import _health
from ._counts import count_queue, queue_models


class QueueStatus(TypedDict):
    """One queue table in ``fabrika_job status --json``."""

    model: str
    waiting: int
    due_now: int
    dead: int
    done: int
    oldest_due_age_seconds: float | None


class JobStatus(TypedDict):
    """One job in ``fabrika_job status --json``: its state (``job_state_word``) and its last run, times in UTC."""

    name: str
    state: str
    active: bool
    active_lanes: int
    lanes: int
    pending: bool
    holder: str | None
    next_fire: str | None
    last_run_id: str | None
    last_trigger: str | None
    last_started: str | None
    last_finished: str | None
    last_outcome: str | None
    last_success: str | None
    failures_in_row: int


class Status(TypedDict):
    """The report of ``fabrika_job status`` (``--json`` prints it as it is)."""

    now: str | None
    queues: list[QueueStatus]
    jobs: list[JobStatus]
    health: list[dict[str, str | int | float]]


def job_states(now: datetime) -> list[run_reads.JobState]:
    """Return each registered job's row (defaults for a job without one) with its run state, in the registry's
    order."""
    names = [job.name for job in registry]
    states = run_reads.job_states(names, now)
    return [states[name] for name in names]


def job_state_word(state: run_reads.JobState) -> str:
    """Return "active", "active, pending", "pending" or "idle"; with lanes, "active 3/8" (active lanes / lanes)."""
    if state.active:
        active = f"active {state.active_lanes}/{state.lanes}" if state.lanes > 1 else "active"
        return f"{active}, pending" if state.pending else active
    return "pending" if state.pending else "idle"


def status(now: datetime) -> Status:
    """The report of ``fabrika_job status``: each queue table's counts (done exactly), each job's state, health."""
    queues: list[QueueStatus] = []
    counted = {}
    for model in queue_models():
        counts = counted[model._meta.label] = count_queue(model, now)
        oldest = counts.oldest_due
        queues.append(
            {
                "model": model._meta.label,
                "waiting": counts.waiting,
                "due_now": counts.due_now,
                "dead": counts.dead,
                "done": counts.done,
                "oldest_due_age_seconds": None if oldest is None else round((now - oldest).total_seconds(), 3),
            }
        )
    jobs: list[JobStatus] = []
    for state in job_states(now):
        jobs.append(
            {
                "name": state.name,
                "state": job_state_word(state),
                "active": state.active,
                "active_lanes": state.active_lanes,
                "lanes": state.lanes,
                "pending": state.pending,
                "holder": state.holder,
                "next_fire": _utc(state.next_fire),
                "last_run_id": str(state.last_run_id) if state.last_run_id else None,
                "last_trigger": state.last_trigger or None,
                "last_started": _utc(state.last_started),
                "last_finished": _utc(state.last_finished),
                "last_outcome": state.last_outcome or None,
                "last_success": _utc(state.last_success),
                "failures_in_row": state.failures_in_row,
            }
        )
    health = [finding.as_dict() for finding in _health.health_report(now, counts=counted)]
    return {"now": _utc(now), "queues": queues, "jobs": jobs, "health": health}


def _utc(moment: datetime | None) -> str | None:
    # ISO 8601 with its offset, so a reader never has to guess the zone.
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="seconds")
