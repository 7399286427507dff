"""fabrika's own tables: jobs, leases, attempts, claimers, kick requests, sent mail and the hourly history."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from django_stubs_ext import StrPromise


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


def _outcome_choices() -> list[tuple[str, StrPromise]]:
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
