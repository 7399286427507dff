"""``ctx.mail``: one message at a time through a Django e-mail backend, with an idempotency ledger.

A job that declares ``mailer`` sends through ``ctx.mail.send(...)``. Before a message leaves, the ledger
(``SentMail``, a framework table holding only hashes) records its key as ``sending`` in a transaction of its own;
the transport's acceptance turns it ``accepted``. So a repeated key answers the first acceptance without sending,
and a key left ``sending`` by a try that died during the call is known to have an unknown outcome: a transport
that deduplicates by key (``fabrika_deduplicates = True`` on the backend) is simply asked again, any other is
reported ``unknown`` once, never silently sent twice.

A backend may describe itself with these optional attributes (fabrika describes Django's own backends):
``fabrika_provider`` (the name in ``SendResult.provider``), ``fabrika_deduplicates`` (it drops a second message
with the same ``Message-ID``; default False), ``fabrika_max_attachment_bytes`` (default 10 MiB),
``fabrika_attachments`` and ``fabrika_unsubscribe_header`` (it carries attachments, the List-Unsubscribe header;
default True), ``fabrika_confirmation`` (``"sent"``: an acceptance means the provider took the message, the default;
``"queued"``: a relay or an operator may still hold it) and ``fabrika_from_email`` (the sending address;
``DEFAULT_FROM_EMAIL`` otherwise). ``ctx.mail.capabilities`` answers them; a message the transport cannot carry is
refused ``invalid_message`` before anything is reserved.
"""

from __future__ import annotations

import logging
import smtplib
from collections.abc import Iterable, Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from django.conf import settings as django_settings
from django.core import mail as django_mail
from django.core.mail import EmailMultiAlternatives, get_connection
from django.core.mail.backends.dummy import EmailBackend as DummyBackend
from django.core.mail.backends.locmem import EmailBackend as LocmemBackend
from django.db.models.fields.files import FieldFile
from django.utils.module_loading import import_string

from .._running import active_run
from ..conf import settings
from ..exceptions import CapabilityRefused, EmailDeliveryError
from ._capabilities import NO_TRANSPORT, Capabilities, capabilities_of
from ._envelope import Envelope
from ._ledger import Ledger, SendResult, check_key, key_hash

if TYPE_CHECKING:
    from django.core.mail.backends.base import BaseEmailBackend

    from .._signal import AbortSignal
    from ..jobs import CronJob

logger = logging.getLogger("fabrika_django.mail")


#: Codes that refuse the message or the configuration: sending it again gives the same answer.
_REFUSED = frozenset(
    {
        "mail_not_configured",
        "invalid_message",
        "invalid_idempotency_key",
        "idempotency_conflict",
        "send_inside_transaction",
        "attachments_too_large",
        "file_missing",
        "file_rejected",
        "file_is_link",
        "file_state_invalid",
        "recipient_refused",
        "sender_refused",
        "message_rejected",
        "transport_refused",
    }
)


def _installation_backend() -> BaseEmailBackend:
    """A new connection of the installation's mailer: ``MAILERS["default"]`` (Django 6.1+), else EMAIL_BACKEND."""
    handler = getattr(django_mail, "mailers", None)
    if handler is not None and hasattr(django_settings, "MAILERS"):
        return handler.default
    return get_connection(fail_silently=False)


class Mailer:
    """``ctx.mail``: ``available``, ``send(...)`` and ``may_retry(error)`` over the job's transport."""

    def __init__(self, *, job_name: str, mailer: str, mode: str | None, signal: AbortSignal) -> None:
        self._job_name = job_name
        self._mailer = mailer
        self._mode = mode
        self._signal = signal

    def __repr__(self) -> str:
        return f"<Mailer job={self._job_name} mailer={self._mailer}>"

    @property
    def available(self) -> bool:
        """Whether a transport reaches this job; when false, every send fails ``mail_not_configured``."""
        return self._backend is not None

    @cached_property
    def _backend(self) -> BaseEmailBackend | None:
        if self._mode == "none":
            return None
        if self._mode == "locmem":
            return LocmemBackend()
        if self._mailer == "own":
            path = settings.OWN_MAIL_SENDER
            backend = import_string(path)() if path else None
        else:
            backend = _installation_backend()
        # The dummy backend drops every message: no transport reaches the job.
        return None if backend is None or isinstance(backend, DummyBackend) else backend

    @property
    def provider(self) -> str:
        """The transport's name: its ``fabrika_provider``, or the Django backend's module ("smtp", "locmem" …)."""
        backend = self._backend
        if backend is None:
            return ""
        named = getattr(backend, "fabrika_provider", None)
        if named:
            return str(named)
        module = type(backend).__module__
        if module.startswith("django.core.mail.backends."):
            return module.rsplit(".", 1)[-1]
        return type(backend).__name__.lower()

    @property
    def deduplicates(self) -> bool:
        """Whether the transport drops a second message with the same key (then an unknown outcome may retry)."""
        return self.capabilities.deduplicates

    @cached_property
    def capabilities(self) -> Capabilities:
        """What the transport does: ``attachments``, ``unsubscribe_header``, ``max_attachment_bytes``,
        ``deduplicates`` and ``confirmation`` ("sent" or "queued"); nothing at all without a transport."""
        backend = self._backend
        return NO_TRANSPORT if backend is None else capabilities_of(backend)

    def may_retry(self, error: BaseException) -> bool:
        """Whether the message that raised ``error`` may go again.

        False for a refused message or configuration, and for an unknown outcome over a transport that does
        not deduplicate (a retry could deliver it twice); true for a transient failure that sent nothing.
        """
        if not isinstance(error, EmailDeliveryError):
            return False
        if error.code in _REFUSED:
            return False
        if error.outcome == "unknown":
            return self.deduplicates
        return True

    def send(
        self,
        *,
        to: str | Sequence[str],
        subject: str,
        text: str,
        html: str | None = None,
        reply_to: str | Sequence[str] | None = None,
        from_name: str | None = None,
        idempotency_key: str,
        attachments: Iterable[FieldFile] = (),
        unsubscribe_url: str | None = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Hand one message to the transport and answer its acceptance; raise EmailDeliveryError otherwise.

        Call it outside ``ctx.transaction()``: the ledger commits on its own, before and after the call.
        """
        self._refuse_inside_transaction()
        backend = self._backend
        if backend is None:
            raise EmailDeliveryError(
                "No mail transport reaches this job: configure EMAIL_BACKEND or MAILERS['default'] (OWN_MAIL_SENDER "
                "for mailer='own'); check ctx.mail.available before the batch and leave the rows as they are.",
                code="mail_not_configured",
            )
        key = check_key(idempotency_key)
        files = tuple(attachments)
        self._refuse_what_the_transport_cannot_carry(files, unsubscribe_url)
        envelope = Envelope.build(
            to=to,
            subject=subject,
            text=text,
            html=html,
            reply_to=reply_to,
            from_name=from_name,
            attachments=files,
            unsubscribe_url=unsubscribe_url,
            limit=self.capabilities.max_attachment_bytes,
        )
        seconds = self._deadline(timeout)
        ledger = Ledger(key_hash(key), envelope.content_hash)
        earlier = ledger.reserve(self.provider, deduplicates=self.deduplicates)
        if earlier is not None:
            return earlier
        message = envelope.message(
            from_email=str(getattr(backend, "fabrika_from_email", "") or django_settings.DEFAULT_FROM_EMAIL),
            key_hash=ledger.key_hash,
        )
        self._deliver(backend, message, seconds, ledger)
        result = SendResult(status="accepted", provider=self.provider, message_id=_accepted_id(message))
        ledger.accepted(result)
        logger.info("Mail accepted job=%s provider=%s", self._job_name, result.provider)
        return result

    def _refuse_what_the_transport_cannot_carry(self, files: tuple[object, ...], unsubscribe_url: str | None) -> None:
        capabilities = self.capabilities
        if files and not capabilities.attachments:
            raise EmailDeliveryError(
                "This transport carries no attachments: send a link to the file instead.", code="invalid_message"
            )
        if unsubscribe_url is not None and not capabilities.unsubscribe_header:
            raise EmailDeliveryError(
                "This transport writes no List-Unsubscribe header: send without unsubscribe_url, "
                "and put the link in the text.",
                code="invalid_message",
            )

    def _refuse_inside_transaction(self) -> None:
        run = active_run()
        if run is not None and run.in_transaction:
            raise EmailDeliveryError(
                "ctx.mail.send() ran inside ctx.transaction(): send between transactions, and record the "
                "acceptance in the next one, so a rollback never forgets a message that left.",
                code="send_inside_transaction",
            )

    def _deadline(self, timeout: float | None) -> float:
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
            raise EmailDeliveryError(
                f"timeout={timeout!r} is not a deadline: give seconds above 0, or None for the attempt's.",
                code="invalid_message",
            )
        self._signal.throw_if_aborted()
        remaining = self._signal.remaining()
        return min(timeout, remaining) if timeout is not None else remaining

    def close(self) -> None:
        """Close the transport's connection; the runner calls it when the attempt ends."""
        backend = self.__dict__.get("_backend")
        if backend is not None:
            try:
                backend.close()
            except Exception:  # noqa: S110 - a failed QUIT after the last answer changes nothing
                pass

    def _deliver(
        self, backend: BaseEmailBackend, message: EmailMultiAlternatives, seconds: float, ledger: Ledger
    ) -> None:
        """Send ``message``; a failure before it could leave frees the ledger's key, any other is unknown.

        The connection stays open for the attempt's next message (a batch pays one TLS and login, not one a
        message); it is probed before each reuse, so a connection the server dropped while idle is opened
        again rather than failing a message that never left.
        """
        try:
            _connect(backend, seconds)
        except Exception as error:
            ledger.release()
            if isinstance(error, smtplib.SMTPAuthenticationError):
                # Configuration, not weather: retrying gives the same answer until someone fixes the credentials.
                raise EmailDeliveryError(
                    "The mail server refused the credentials; nothing was sent: fix the mailer's user and password "
                    "(EMAIL_HOST_USER/PASSWORD, or MAILERS['default'] OPTIONS).",
                    code="transport_refused",
                ) from None
            raise EmailDeliveryError(
                "The mail transport could not be reached; nothing was sent: a later attempt sends it.",
                code="transport_unavailable",
            ) from _quiet(error)
        try:
            sent = backend.send_messages([message])
        except Exception as error:
            self.close()  # the session's state is unknown: the next message starts a new one
            _raise_for_send_failure(error, ledger)
        if not sent:
            ledger.release()
            raise EmailDeliveryError(
                "The mail transport refused the message; nothing was sent.", code="transport_refused"
            )


def _connect(backend: BaseEmailBackend, seconds: float) -> None:
    """Open the backend's connection, or make sure the open one still answers; bound its socket by ``seconds``."""
    if hasattr(backend, "timeout"):
        backend.timeout = seconds
    session = getattr(backend, "connection", None)
    if isinstance(session, smtplib.SMTP) and session.sock is not None:
        try:
            session.sock.settimeout(seconds)
            if session.noop()[0] == 250:
                return
        except (smtplib.SMTPException, OSError):
            pass
        try:
            backend.close()
        except Exception:  # noqa: S110 - the connection is already gone
            pass
    backend.open()


def mailer_for(job: CronJob, mode: str | None, signal: AbortSignal) -> Mailer:
    """Return ``ctx.mail`` for a job that declares ``mailer``; refuse for one that does not."""
    if job.mailer is None:
        raise CapabilityRefused(
            f"Job '{job.name}' has no ctx.mail: declare @cron(..., mailer='installation') "
            "(Django's EMAIL_BACKEND) or mailer='own' (the OWN_MAIL_SENDER factory).",
            missing="mailer",
        )
    return Mailer(job_name=job.name, mailer=job.mailer, mode=mode, signal=signal)


def _raise_for_send_failure(error: Exception, ledger: Ledger) -> None:
    """Raise the EmailDeliveryError for a failed send: not_sent where the server refused, unknown otherwise."""
    if _deferred(error):
        # A 4xx (a per-connection message limit, greylisting, a full queue): the server kept nothing, try later.
        ledger.release()
        raise EmailDeliveryError(
            "The server deferred the message; nothing was sent: a later attempt sends it.",
            code="transport_deferred",
        ) from None
    refusals: list[tuple[type[Exception], str, str]] = [
        (smtplib.SMTPRecipientsRefused, "recipient_refused", "The server refused every recipient"),
        (smtplib.SMTPSenderRefused, "sender_refused", "The server refused the sending address"),
    ]
    for kind, code, text in refusals:
        if isinstance(error, kind):
            ledger.release()
            raise EmailDeliveryError(f"{text}; nothing was sent.", code=code) from _quiet(error)
    if isinstance(error, smtplib.SMTPDataError):
        ledger.release()
        raise EmailDeliveryError("The server rejected the message; nothing was sent.", code="message_rejected") from (
            _quiet(error)
        )
    # The connection broke or timed out mid-call: the message may have left.
    ledger.unknown()
    raise EmailDeliveryError(
        f"The transport failed during the send ({type(error).__name__}); the message may have left.",
        code="transport_failed",
        outcome="unknown",
    ) from _quiet(error)


def _deferred(error: Exception) -> bool:
    """Whether the server answered MAIL, every RCPT, or the data with a temporary (4xx) code."""
    if isinstance(error, smtplib.SMTPSenderRefused | smtplib.SMTPDataError):
        return 400 <= error.smtp_code < 500
    if isinstance(error, smtplib.SMTPRecipientsRefused) and error.recipients:
        return all(400 <= answer[0] < 500 for answer in error.recipients.values())
    return False


def _quiet(error: BaseException) -> BaseException | None:
    """Chain only errors whose text quotes no address (SMTP replies can echo one)."""
    return None if isinstance(error, smtplib.SMTPException) else error


def _accepted_id(message: EmailMultiAlternatives) -> str:
    # A provider backend (django-anymail) answers its own id; the Message-ID is everyone else's.
    status = getattr(message, "anymail_status", None)
    provider_id = getattr(status, "message_id", None)
    if isinstance(provider_id, str) and provider_id:
        return provider_id
    return str(message.extra_headers.get("Message-ID", "")).strip("<>")
