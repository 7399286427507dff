"""A real SMTP server on loopback (aiosmtpd) that keeps what it received, for the mail tests.

``SMTPServer(dedup=True)`` drops a second message with a Message-ID it already holds, the way a provider that
deduplicates does; ``hang_up_after_data`` receives a message and closes the connection before answering, so the
client cannot know it left; ``refuse_recipients`` answers 550 to every RCPT.
"""

import email
import email.policy
import socket
import threading
from dataclasses import dataclass, field

from aiosmtpd.controller import Controller

from testproject.mailers import mail_settings


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Received:
    envelope_from: str
    envelope_to: list[str]
    raw: bytes

    @property
    def message(self) -> email.message.EmailMessage:
        return email.message_from_bytes(self.raw, policy=email.policy.default)  # type: ignore[return-value]


@dataclass
class _Handler:
    dedup: bool = False
    hang_up_after_data: bool = False
    refuse_recipients: bool = False
    defer_mail: bool = False
    #: An answer to the data other than "250" (e.g. "451 …" or "554 …"): the message is not kept.
    data_reply: str | None = None
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: SMTP sessions opened (one EHLO each).
    sessions: int = 0

    async def handle_EHLO(self, server, session, envelope, hostname, responses):
        session.host_name = hostname
        self.sessions += 1
        return responses

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        if self.defer_mail:
            return "421 4.7.0 Too many messages on this connection, try again later"
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if self.refuse_recipients:
            return "550 5.1.1 No such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        if self.data_reply is not None:
            return self.data_reply
        raw = envelope.original_content or envelope.content
        message = email.message_from_bytes(raw, policy=email.policy.default)
        with self.lock:
            duplicate = self.dedup and any(r.message["Message-ID"] == message["Message-ID"] for r in self.received)
            if not duplicate:
                self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), raw))
        if self.hang_up_after_data:
            # The message is kept, but the client never hears "250": it cannot know the message left.
            server.transport.close()
        return "250 2.0.0 Message accepted"


def _refuse_everyone(server, session, envelope, mechanism, auth_data):
    from aiosmtpd.smtp import AuthResult

    return AuthResult(success=False, handled=False)


class SMTPServer:
    """Start with ``with SMTPServer() as smtp:``; ``smtp.settings`` are the settings that reach it (for
    ``override_settings``), ``smtp.email`` the same as EMAIL_* settings, for ``mail_settings(**...)``."""

    def __init__(
        self,
        *,
        dedup: bool = False,
        hang_up_after_data: bool = False,
        refuse_recipients: bool = False,
        refuse_login: bool = False,
    ):
        self.handler = _Handler(dedup=dedup, hang_up_after_data=hang_up_after_data, refuse_recipients=refuse_recipients)
        self.port = _free_port()
        auth = {"authenticator": _refuse_everyone, "auth_require_tls": False} if refuse_login else {}
        self._controller = Controller(self.handler, hostname="127.0.0.1", port=self.port, **auth)

    def __enter__(self) -> "SMTPServer":
        self._controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self._controller.stop()

    @property
    def received(self) -> list[Received]:
        with self.handler.lock:
            return list(self.handler.received)

    @property
    def settings(self) -> dict:
        """Settings that make this server the installation's mailer (EMAIL_* or MAILERS, per Django)."""
        return mail_settings(**self.email)

    @property
    def email(self) -> dict:
        return {
            "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": self.port,
            "EMAIL_USE_TLS": False,
            "EMAIL_HOST_USER": "",
            "EMAIL_HOST_PASSWORD": "",
        }
