"""``QueueModel``, the abstract base of a project's queue tables, and fabrika's own tables."""

from ._tables import (
    FAILURE_CODE,
    TASK_ATTEMPTS_CEILING,
    Attempt,
    AttemptHour,
    Claimer,
    FoldedHour,
    Job,
    KickRequest,
    Lease,
    Outcome,
    Overview,
    QueuedTask,
    QueueModel,
    QueueSample,
    SentMail,
    TaskStatus,
    Trigger,
    _outcome_choices,
)

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
    "SentMail",
    "TaskStatus",
    "Trigger",
    "_outcome_choices",  # the migrations name it
]
