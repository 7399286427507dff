"""``ctx.mail``: one message at a time through a Django e-mail backend, with an idempotency ledger."""

from ._capabilities import DEFAULT_MAX_ATTACHMENT_BYTES
from ._ledger import SendResult
from ._mailer import Mailer, mailer_for

__all__ = ["DEFAULT_MAX_ATTACHMENT_BYTES", "Mailer", "SendResult", "mailer_for"]
