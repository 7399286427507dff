"""``ctx.mail``: one message at a time through a Django e-mail backend, with an idempotency ledger."""

from ._mailer import DEFAULT_MAX_ATTACHMENT_BYTES, Mailer, SendResult, mailer_for

__all__ = ["DEFAULT_MAX_ATTACHMENT_BYTES", "Mailer", "SendResult", "mailer_for"]
