"""The idempotency ledger of ``ctx.mail``, read-only: which keys are accepted, sending, or of unknown outcome.

It holds hashes only, so a person finds a row by its time and state, never by address or key.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..models import SentMail


@admin.register(SentMail)
class SentMailAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Sent mail: one row per idempotency key; only a superuser deletes one (the key then sends afresh)."""

    list_display = ("short_key", "state", "provider", "created", "accepted")
    list_filter = ("state", "provider")
    fields = ("key_hash", "content_hash", "state", "provider", "message_id", "created", "accepted")
    readonly_fields = fields
    ordering = ("-created",)
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    @admin.display(description=_("key hash"), ordering="key_hash")
    def short_key(self, row: SentMail) -> str:
        return row.key_hash[:12]
