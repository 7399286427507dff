"""The idempotency ledger of ``ctx.mail``, read-only: which keys are accepted, sending, or of unknown outcome.

It holds hashes only, so a person finds a row by its time and state, never by address or key.
"""

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ..models import SentMail
from ._attempts import HistoryAdmin


@admin.register(SentMail)
class SentMailAdmin(HistoryAdmin):
    """Sent mail: one row per idempotency key, read-only (a deleted row would let its key send again)."""

    list_display = ("short_key", "state", "provider", "created", "accepted")
    list_filter = ("state", "provider")
    fields = ("key_hash", "content_hash", "state", "provider", "message_id", "created", "accepted")
    readonly_fields = fields
    ordering = ("-created",)
    show_full_result_count = False

    @admin.display(description=_("key hash"), ordering="key_hash")
    def short_key(self, row: SentMail) -> str:
        return row.key_hash[:12]
