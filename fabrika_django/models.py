"""Queue tables (the abstract ``QueueModel``) and fabrika's own tables: jobs, leases, attempts, sent mail."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any

from django.db import connections, models, router, transaction
from django.db.models.deletion import Collector
from django.db.models.signals import class_prepared
from django.dispatch import receiver
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ._queuestate import DEFAULT_MAX_ATTEMPTS, max_attempts_of, row_state, state_q, waiting_q
from .exceptions import VersionConflict
from .jobs import registry, task_job_name
from .kicks import kick
from .queues import QueueManager, QueueQuerySet, _now, _refuse_own_fields, _update_row

FAILURE_CODE = re.compile(r"[a-z0-9_.-]{1,64}")  # matched whole (fullmatch): "send\n" is not a code


class QueueModel(models.Model):
    """A table whose rows are work: mix it into a model, claim its rows in a job.

    A row is *waiting* while ``due`` is set and its attempts are below ``Queue.max_attempts``, *dead* once
    they reach it, and *done* when ``due`` is null. Optional options::

        class Queue:
            max_attempts = 5    # default 10
    """

    attempts = models.PositiveIntegerField(_("attempts"), default=0, editable=False)
    due = models.DateTimeField(_("due"), null=True, blank=True, default=timezone.now, editable=False)
    version = models.PositiveIntegerField(_("version"), default=0, editable=False)
    last_failure = models.CharField(_("last failure"), max_length=64, blank=True, default="", editable=False)

    objects = QueueManager()

    class Meta:
        abstract = True

    class Queue:
        max_attempts = DEFAULT_MAX_ATTEMPTS

    @property
    def state(self) -> str:
        """Return ``"waiting"``, ``"dead"`` or ``"done"``."""
        return row_state(self)

    @property
    def is_due_now(self) -> bool:
        """Return whether the row is waiting and its time has come (by the run's clock inside a run)."""
        return row_state(self) == "waiting" and self.due is not None and self.due <= _now()

    def finish(self, **values: Any) -> None:
        """Write ``values``, mark the row done and bump its version, if it is unchanged since it was read."""
        _refuse_own_fields("finish", values)
        self._write_versioned(dict(values, due=None))

    def requeue(self, at: datetime | None = None) -> None:
        """Make the row due again at ``at`` (now by default) with no attempts, if it is unchanged.

        "Now" is the run's clock inside a job run (a test's fixed one), the wall clock elsewhere (the admin).
        """
        self._write_versioned({"due": at if at is not None else _now(), "attempts": 0})

    def record_failure(self, code: str, *, give_up: bool = False) -> None:
        """Keep a fixed step code (``[a-z0-9_.-]``, at most 64) in ``last_failure``; never an error message.

        ``give_up=True`` also makes the row dead at once (its attempts reach ``max_attempts``): for a failure no
        retry can fix, such as a refused message; a person requeues it from the admin.
        """
        if not isinstance(code, str) or not FAILURE_CODE.fullmatch(code):
            # The value is not quoted back: a wrong code is often an error's message, which can quote a user's data.
            raise ValueError(
                "record_failure() needs a fixed code: 1-64 characters of a-z, 0-9, '_', '.', '-' "
                "naming the step (e.g. 'send'), never an error message."
            )
        values: dict[str, Any] = {"last_failure": code}
        if give_up:
            values["attempts"] = max(self.attempts, max_attempts_of(type(self)))
        self._write_versioned(values)

    def remove(self) -> None:
        """Delete the row, if it is unchanged since it was read."""
        using = self._state.db or router.db_for_write(type(self), instance=self)
        mine = type(self)._base_manager.using(using).filter(pk=self.pk, version=self.version)
        if Collector(using, origin=self).can_fast_delete(mine):
            deleted, _rows = mine.delete()  # one DELETE ... WHERE pk AND version
        else:
            # Cascades and delete signals make Django read the row before it deletes it by pk: lock it in that
            # read, so the version checked there still holds when the DELETE comes.
            with transaction.atomic(using=using):
                deleted, _rows = mine.select_for_update().delete()
        if not deleted:
            raise self._conflict()

    def _write_versioned(self, values: dict[str, Any]) -> None:
        """Write ``values`` and the next version in one UPDATE conditioned on the version read."""
        using = self._state.db or router.db_for_write(type(self), instance=self)
        if not _update_row(type(self), using, self.pk, self.version, values):
            raise self._conflict()
        for name, value in values.items():
            setattr(self, name, value)
        self.version += 1

    def _conflict(self) -> VersionConflict:
        return VersionConflict(
            f"{self._meta.label} {self.pk} changed since it was read (version {self.version}): nothing was written. "
            "Re-read it with select_for_update() inside ctx.transaction() and decide again."
        )


@receiver(class_prepared)
def _add_queue_indexes(sender: type[models.Model], **kwargs: Any) -> None:
    """Give every concrete queue model its claim index and its dead-row index, both partial.

    The claim index, on ``(due, pk)`` (claim's order: oldest due, then pk), holds waiting rows only: done rows
    (due null) are most of a busy table and dead ones can pile up by the million, and the claim walks this
    index, so neither may be in it. The dead-row index, on ``pk``, holds dead rows only, so the overview counts
    them and the admin lists them without reading the table. Both predicates are the states' own ``Q``
    (``_queuestate``), with the model's ``max_attempts`` in them: changing it makes a migration. A backend
    without partial indexes (MariaDB, MySQL) builds both whole; a model that declares an index of either
    name keeps its own.
    """
    if not issubclass(sender, QueueModel) or sender._meta.abstract or sender._meta.proxy:
        return
    pk = sender._meta.pk.name
    wanted = [
        _named_index(sender, ["due", pk], state_q(sender, "waiting")),
        _named_index(sender, [pk], state_q(sender, "dead")),
    ]
    declared = {index.name for index in sender._meta.indexes}
    added = [index for index in wanted if index.name not in declared]
    if added:
        sender._meta.indexes = [*sender._meta.indexes, *added]
        # Migrations read a model's indexes only when its Meta declared some.
        sender._meta.original_attrs["indexes"] = sender._meta.indexes


def _named_index(model: type[models.Model], fields: list[str], condition: models.Q) -> models.Index:
    """Return an index on ``fields`` with Django's own short, stable name for them, and ``condition``."""
    named = models.Index(fields=fields)
    named.set_name_with_model(model)
    return models.Index(fields=fields, name=named.name, condition=condition)


class Outcome(models.TextChoices):
    """How an attempt ended; every failure is a fixed code."""

    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    HANDLER_FAILED = "handler_failed", _("handler failed")
    TIMED_OUT = "timed_out", _("timed out")
    LEASE_LOST = "lease_lost", _("lease lost")
    SHUTDOWN = "shutdown", _("worker shut down")
    CRASHED = "crashed", _("crashed (holder vanished)")
    WRITE_OUTSIDE_TRANSACTION = "write_outside_transaction", _("write outside transaction")
    CLAIM_INSIDE_TRANSACTION = "claim_inside_transaction", _("claim inside transaction")
    CLAIM_OUTSIDE_JOB = "claim_outside_job", _("claim outside job")
    UNDECLARED_KICK = "undeclared_kick", _("undeclared kick")
    CAPABILITY_REFUSED = "capability_refused", _("capability refused")
    UNKNOWN_JOB = "unknown_job", _("unknown job")
    VERSION_CONFLICT = "version_conflict", _("version conflict")
    TOKEN_INVALID = "token_invalid", _("token invalid")
    TOKEN_EXPIRED = "token_expired", _("token expired")
    EGRESS_REFUSED = "egress_refused", _("egress refused")
    FETCH_FAILED = "fetch_failed", _("fetch failed")
    FETCH_TOO_LARGE = "fetch_too_large", _("fetch too large")
    # ctx.mail's refusals (EmailDeliveryError.code), when a handler lets one end the attempt.
    MAIL_NOT_CONFIGURED = "mail_not_configured", _("mail not configured")
    INVALID_MESSAGE = "invalid_message", _("invalid message")
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key", _("invalid idempotency key")
    IDEMPOTENCY_CONFLICT = "idempotency_conflict", _("idempotency conflict")
    SEND_INSIDE_TRANSACTION = "send_inside_transaction", _("send inside transaction")
    ATTACHMENTS_TOO_LARGE = "attachments_too_large", _("attachments too large")
    FILE_MISSING = "file_missing", _("attachment file missing")
    FILE_NOT_READY = "file_not_ready", _("attachment file not ready")
    FILE_REJECTED = "file_rejected", _("attachment file rejected")
    FILE_IS_LINK = "file_is_link", _("attachment file is a link")
    FILE_STATE_FAILED = "file_state_failed", _("file state callable failed")
    FILE_STATE_INVALID = "file_state_invalid", _("file state answer invalid")
    RECIPIENT_REFUSED = "recipient_refused", _("recipient refused")
    SENDER_REFUSED = "sender_refused", _("sender refused")
    MESSAGE_REJECTED = "message_rejected", _("message rejected")
    TRANSPORT_REFUSED = "transport_refused", _("transport refused")
    TRANSPORT_DEFERRED = "transport_deferred", _("transport deferred")
    TRANSPORT_FAILED = "transport_failed", _("transport failed")
    TRANSPORT_UNAVAILABLE = "transport_unavailable", _("transport unavailable")
    OUTCOME_UNKNOWN = "outcome_unknown", _("outcome unknown")


def _outcome_choices() -> list[tuple[str, Any]]:
    """The outcome field's choices, read from ``Outcome`` when asked: a migration keeps only this function's
    name, so a new outcome code costs no migration."""
    return Outcome.choices


class Trigger(models.TextChoices):
    SCHEDULE = "schedule", _("schedule")
    KICK = "kick", _("kick")
    MANUAL = "manual", _("manual")


class Job(models.Model):
    """One row per cron job: the pending flag, the next scheduled fire, and the last run's summary.

    Starting and ending a run lock this row, so a kick that arrives as a run ends is never lost.
    """

    name = models.CharField(_("name"), max_length=100, primary_key=True)
    pending_since = models.DateTimeField(_("pending since"), null=True, blank=True)
    #: Set by a run whose claim came back full (a job with lanes): start one more run in a free lane.
    lane_asked = models.DateTimeField(_("one more lane asked"), null=True, blank=True)
    next_fire = models.DateTimeField(_("next fire"), null=True, blank=True)
    last_run_id = models.UUIDField(_("last run"), null=True, blank=True)
    last_trigger = models.CharField(_("last trigger"), max_length=16, blank=True, choices=Trigger.choices)
    last_outcome = models.CharField(_("last outcome"), max_length=64, blank=True)
    last_started = models.DateTimeField(_("last started"), null=True, blank=True)
    last_finished = models.DateTimeField(_("last finished"), null=True, blank=True)
    last_success = models.DateTimeField(_("last success"), null=True, blank=True)
    failures_in_row = models.PositiveIntegerField(_("failures in a row"), default=0)

    class Meta:
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Overview(Job):
    """No table of its own: the entry of the admin's overview of every queue and job in the admin index."""

    class Meta:
        proxy = True
        verbose_name = _("overview")
        verbose_name_plural = _("overview")


class Lease(models.Model):
    """The lease of a job's active attempt: token, holder and expiry.

    ``token`` is unique on purpose: on MariaDB/MySQL ``ctx.transaction()`` holds its index entry shared, which
    an UPDATE of the token must lock and so waits for, while a renewal (an UPDATE of ``expires`` alone) does
    not. So a lease is never taken over under an open fenced transaction, and renewing never waits for one.
    PostgreSQL does the same with an advisory lock named after the row's id (``_runs.fence``).
    """

    # A 32-bit key on purpose: it is the second key of the fence's advisory lock on PostgreSQL (_sql.fence).
    id = models.AutoField(primary_key=True)
    job = models.CharField(_("job"), max_length=100)
    #: The lane (0-based) of a job declared with ``lanes``: one lease per (job, lane).
    lane = models.PositiveSmallIntegerField(_("lane"), default=0)
    token = models.UUIDField(_("token"), null=True, blank=True, unique=True)
    holder = models.CharField(_("holder"), max_length=200, blank=True)
    run_id = models.UUIDField(_("run"), null=True, blank=True)
    attempt = models.PositiveIntegerField(_("attempt"), default=0)
    expires = models.DateTimeField(_("expires"), null=True, blank=True)

    class Meta:
        verbose_name = _("lease")
        verbose_name_plural = _("leases")
        ordering = ["job", "lane"]
        constraints = [models.UniqueConstraint(fields=["job", "lane"], name="fabrika_lease_job_lane")]

    def __str__(self) -> str:
        return f"{self.job}[{self.lane}] ({self.holder or 'free'})"


class Attempt(models.Model):
    """One attempt of a run: when, how it ended, and where it failed; never the exception's message by default."""

    job = models.CharField(_("job"), max_length=100, db_index=True)
    run_id = models.UUIDField(_("run"), db_index=True)
    trigger = models.CharField(_("trigger"), max_length=16, choices=Trigger.choices)
    number = models.PositiveIntegerField(_("attempt"))
    lane = models.PositiveSmallIntegerField(_("lane"), default=0)
    holder = models.CharField(_("holder"), max_length=200, blank=True)
    started = models.DateTimeField(_("started"), default=timezone.now, db_index=True)
    finished = models.DateTimeField(_("finished"), null=True, blank=True)
    outcome = models.CharField(_("outcome"), max_length=64, default=Outcome.RUNNING, choices=_outcome_choices)
    error_class = models.CharField(_("exception class"), max_length=200, blank=True)
    frames = models.TextField(_("frames"), blank=True, help_text=_("file:line of each frame, innermost last"))
    message = models.TextField(_("message"), blank=True, help_text=_("kept only when STORE_ERROR_MESSAGES is on"))

    class Meta:
        verbose_name = _("attempt")
        verbose_name_plural = _("attempts")
        ordering = ["-started", "-id"]
        indexes = [models.Index(fields=["job", "-started"], name="fabrika_attempt_job_started")]

    def __str__(self) -> str:
        return f"{self.job} #{self.number} {self.outcome}"

    @property
    def duration(self):
        return self.finished - self.started if self.finished else None


class Claimer(models.Model):
    """A job that claimed rows of a queue table (at least once): a requeue of that table kicks it."""

    queue = models.CharField(_("queue"), max_length=200, help_text=_("app_label.Model"))
    job = models.CharField(_("job"), max_length=100)

    class Meta:
        verbose_name = _("claimer")
        verbose_name_plural = _("claimers")
        constraints = [models.UniqueConstraint(fields=["queue", "job"], name="fabrika_claimer_queue_job")]

    def __str__(self) -> str:
        return f"{self.job} claims {self.queue}"


class KickRequest(models.Model):
    """A kick not yet taken by a worker: inserted in the kicking transaction, deleted by the worker that takes it.

    Append-only on the request's side: every kick is a row of its own, so concurrent requests never wait for
    each other's kicks (the job's own row, which a pending flag set in the request would lock until its commit,
    stays the workers'). A worker deletes the rows and sets the jobs' ``pending_since`` in one transaction.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.CharField(_("job"), max_length=100)
    created = models.DateTimeField(_("created"), default=timezone.now)

    class Meta:
        verbose_name = _("kick request")
        verbose_name_plural = _("kick requests")
        # Workers take the kicks of the jobs they serve; a kick in autocommit looks for one already waiting.
        indexes = [models.Index(fields=["job"], name="fabrika_kick_job")]

    def __str__(self) -> str:
        return f"kick {self.job}"


class SentMail(models.Model):
    """The idempotency ledger of ``ctx.mail``: one row per key, with a hash of what was sent under it.

    Keys and content are stored only as SHA-256 hashes: the ledger holds no address, key or message.
    """

    key_hash = models.CharField(_("key hash"), max_length=64, primary_key=True)
    content_hash = models.CharField(_("content hash"), max_length=64)
    state = models.CharField(_("state"), max_length=16, default="sending")
    provider = models.CharField(_("provider"), max_length=100, blank=True)
    message_id = models.CharField(_("message id"), max_length=255, blank=True)
    created = models.DateTimeField(_("created"), default=timezone.now)
    accepted = models.DateTimeField(_("accepted"), null=True, blank=True)

    class Meta:
        verbose_name = _("sent mail")
        verbose_name_plural = _("sent mail")
        # The pruning job deletes by age, in batches.
        indexes = [models.Index(fields=["created"], name="fabrika_sentmail_created")]

    def __str__(self) -> str:
        return f"{self.provider} {self.state}"


# -- Django tasks (fabrika_django.tasks.FabrikaBackend) ------------------------------------------------------


class TaskStatus(models.TextChoices):
    """A Django task's status, with the values of ``django.tasks.TaskResultStatus`` (not imported here: on
    Django 5.2 that module is an optional backport)."""

    READY = "READY", _("ready")
    RUNNING = "RUNNING", _("running")
    SUCCESSFUL = "SUCCESSFUL", _("successful")
    FAILED = "FAILED", _("failed")


#: A task's attempts are the backend's OPTIONS["max_attempts"]; the table's own limit is this ceiling, which
#: a task reaches only when it is given up (FAILED: a dead row, requeued by a person).
TASK_ATTEMPTS_CEILING = 100
#: A task's priority bounds, Django's (TASK_MIN_PRIORITY, TASK_MAX_PRIORITY): the table's check constraint holds them.
_TASK_PRIORITIES = (-100, 100)


class _TaskQuerySet(QueueQuerySet["QueuedTask"]):
    # Django's promise: a higher priority first, then the earliest run_after/enqueue, then enqueue order.
    _claim_order = ("-priority", "due", "pk")

    def _claim_query(self, using: str, now: datetime, where: models.Q | None) -> QueueQuerySet[QueuedTask]:
        """The claim's rows; on MariaDB/MySQL with every priority named, so the claim index is read by ranges.

        There the claim index is built whole (no partial indexes): within each priority, done tasks (``due``
        null, first) and tasks not yet due sit around the due ones, and a walk of one queue's part of the index
        would pass, and lock, every one of them. Named one by one (the check constraint holds every row to
        them, so none is left out), the priorities make one range of due tasks each, read in the index's order.
        """
        rows = super()._claim_query(using, now, where)
        if connections[using].vendor != "mysql":
            return rows
        low, high = _TASK_PRIORITIES
        return rows.filter(priority__in=range(high, low - 1, -1))


class _TaskManager(QueueManager.from_queryset(_TaskQuerySet)):  # type: ignore[misc]
    pass


class QueuedTask(QueueModel):
    """One enqueue of a Django task on ``fabrika_django.tasks.FabrikaBackend``: its call, status and result.

    The queue's own columns say where the row is in the queue (``due``, ``attempts``); ``status`` says the same
    in Django's words. A failed attempt leaves the row due after the claim's backoff; the last one gives it
    up: its attempts jump to the ceiling, which makes it dead (FAILED) until a person requeues it.
    """

    result_id = models.UUIDField(_("result id"), unique=True, default=uuid.uuid4, editable=False)
    task_path = models.CharField(_("function"), max_length=255)
    backend = models.CharField(_("backend"), max_length=100)
    queue_name = models.CharField(_("queue"), max_length=100)
    priority = models.SmallIntegerField(_("priority"), default=0)
    args = models.JSONField(_("args"), default=list, blank=True)
    kwargs = models.JSONField(_("kwargs"), default=dict, blank=True)
    run_after = models.DateTimeField(_("run after"), null=True, blank=True)
    status = models.CharField(_("status"), max_length=10, choices=TaskStatus.choices, default=TaskStatus.READY)
    enqueued_at = models.DateTimeField(_("enqueued at"), default=timezone.now)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    last_attempted_at = models.DateTimeField(_("last attempted at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    return_value = models.JSONField(_("return value"), null=True, blank=True)
    #: One {"exception_class_path", "traceback"} per failed attempt; the traceback has no message by default.
    errors = models.JSONField(_("errors"), default=list, blank=True)
    worker_ids = models.JSONField(_("worker ids"), default=list, blank=True)

    objects = _TaskManager()  # type: ignore[misc]  # QueueModel's manager, with the tasks' claim order

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        indexes = [
            # The claim: one (backend, queue) in claim order, over waiting rows only (as the claim index of
            # every queue table: a given-up task is dead, and dead rows stay out of the claim's path).
            models.Index(
                fields=["backend", "queue_name", "-priority", "due", "id"],
                name="fabrika_task_claim",
                condition=waiting_q(TASK_ATTEMPTS_CEILING),
            ),
            models.Index(fields=["finished_at"], name="fabrika_task_finished"),  # the pruning
        ]
        constraints = [
            # Django's bounds (TASK_MIN_PRIORITY, TASK_MAX_PRIORITY), also for rows written by hand.
            models.CheckConstraint(
                condition=models.Q(priority__range=_TASK_PRIORITIES), name="fabrika_task_priority_range"
            ),
        ]

    class Queue:
        max_attempts = TASK_ATTEMPTS_CEILING

    def __str__(self) -> str:
        return f"{self.task_path} {self.result_id}"

    def requeue(self, at: datetime | None = None) -> None:
        """Make the task READY again at ``at`` (now by default) with no attempts, and kick its job on commit."""
        self._write_versioned(
            {
                "due": at if at is not None else _now(),
                "attempts": 0,
                "status": TaskStatus.READY,
                "finished_at": None,
                "last_failure": "",
            }
        )
        name = task_job_name(self.backend, self.queue_name)
        if name in registry:  # a backend or queue since removed from TASKS has no job to kick
            kick(name, using=self._state.db)


class QueueSample(models.Model):
    """A queue table's backlog at one moment, taken every five minutes by the built-in sampling job.

    The overview draws the last day of these; ``dead_rows_grew`` compares the dead count with them. Pruned
    with the attempt history.
    """

    queue = models.CharField(_("queue"), max_length=200)  # the model's label, app_label.Model
    sampled = models.DateTimeField(_("sampled"), default=timezone.now)
    waiting = models.PositiveIntegerField(_("waiting"), default=0)
    due_now = models.PositiveIntegerField(_("due now"), default=0)
    dead = models.PositiveIntegerField(_("dead"), default=0)

    class Meta:
        verbose_name = _("queue sample")
        verbose_name_plural = _("queue samples")
        indexes = [models.Index(fields=["queue", "sampled"], name="fabrika_sample_queue_time")]

    def __str__(self) -> str:
        return f"{self.queue} {self.sampled:%Y-%m-%d %H:%M}"


class AttemptHour(models.Model):
    """One job's attempts that started in one hour (UTC): how many ended in each outcome band, and a histogram
    of their durations (``_digest``). Folded by the sampling job from the attempt history once the hour is over,
    so the overview's charts read 24 rows per job instead of a day of attempts; pruned with the history."""

    hour = models.DateTimeField(_("hour"))
    job = models.CharField(_("job"), max_length=100)
    succeeded = models.PositiveIntegerField(_("succeeded"), default=0)
    handler_failed = models.PositiveIntegerField(_("handler failed"), default=0)
    timed_out = models.PositiveIntegerField(_("timed out"), default=0)
    interrupted = models.PositiveIntegerField(_("interrupted"), default=0)
    other = models.PositiveIntegerField(_("other failure"), default=0)
    durations = models.TextField(_("durations"), blank=True, help_text=_("attempts per duration bucket"))

    class Meta:
        verbose_name = _("attempt hour")
        verbose_name_plural = _("attempt hours")
        constraints = [models.UniqueConstraint(fields=["hour", "job"], name="fabrika_attempthour_hour_job")]

    def __str__(self) -> str:
        return f"{self.job} {self.hour:%Y-%m-%d %H:00}"


class FoldedHour(models.Model):
    """An hour whose attempts the sampling job folded into ``AttemptHour`` rows (every job's, none if none ran).

    ``running``: attempts of the hour still running when it was folded; the hour is folded again while any
    are, so an attempt that ends later is counted."""

    hour = models.DateTimeField(_("hour"), unique=True)
    folded = models.DateTimeField(_("folded"))
    running = models.PositiveIntegerField(_("running"), default=0)

    class Meta:
        verbose_name = _("folded hour")
        verbose_name_plural = _("folded hours")

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00}"
