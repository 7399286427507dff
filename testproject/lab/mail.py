"""Mail transports for the tests: a deduplicating SMTP transport and factories for ``OWN_MAIL_SENDER``."""

import os
import signal

from django.core.mail.backends.locmem import EmailBackend as LocmemBackend
from django.core.mail.backends.smtp import EmailBackend as SMTPBackend


class DeduplicatingSMTPBackend(SMTPBackend):
    """SMTP to a relay that drops a second message with the same Message-ID, as a provider's idempotency key does."""

    fabrika_provider = "dedup-relay"
    fabrika_deduplicates = True


class SmallLocmemBackend(LocmemBackend):
    """A transport that takes at most 1 KiB of attachments."""

    fabrika_provider = "small"
    fabrika_max_attachment_bytes = 1024


def own_sender():
    """The application's own sender: here, the test's in-memory outbox."""
    backend = LocmemBackend()
    backend.fabrika_provider = "own-locmem"
    return backend


def no_sender():
    """An application that configured no sender of its own."""
    return None


class DiesAfterAcceptanceSMTPBackend(SMTPBackend):
    """SMTP whose process is killed (SIGKILL) the moment the server accepted: before the ledger can record it."""

    def send_messages(self, email_messages):
        sent = super().send_messages(email_messages)
        os.kill(os.getpid(), signal.SIGKILL)
        return sent


class DedupDiesAfterAcceptanceSMTPBackend(DiesAfterAcceptanceSMTPBackend):
    fabrika_provider = "dedup-relay"
    fabrika_deduplicates = True


class PlainRelayBackend(LocmemBackend):
    """A relay that carries neither attachments nor the unsubscribe header, and may hold a message it accepted."""

    fabrika_provider = "plain-relay"
    fabrika_attachments = False
    fabrika_unsubscribe_header = False
    fabrika_max_attachment_bytes = 0
    fabrika_confirmation = "queued"
