"""``QueueModel``, the abstract base of a project's queue tables, and fabrika's own tables."""

from ._buckets import RateBucket
from ._queue import FAILURE_CODE, QueueModel
from ._tables import (
    Attempt,
    AttemptHour,
    Claimer,
    FoldedHour,
    Job,
    KickRequest,
    Lease,
    Outcome,
    Overview,
    QueueSample,
    SentMail,
    Trigger,
    _outcome_choices,
)
from ._tasks import TASK_ATTEMPTS_CEILING, QueuedTask, TaskStatus

__all__ = [
    "FAILURE_CODE",
    "TASK_ATTEMPTS_CEILING",
    "Attempt",
    "AttemptHour",
    "Claimer",
    "FoldedHour",
    "Job",
    "KickRequest",
    "Lease",
    "Outcome",
    "Overview",
    "QueueModel",
    "QueueSample",
    "QueuedTask",
    "RateBucket",
    "SentMail",
    "TaskStatus",
    "Trigger",
    "_outcome_choices",  # the migrations name it
]
