"""How the admin shows a moment and a duration: short in a list, the full time (with its zone) at hand."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext_lazy as _


def relative(value: datetime, now: datetime) -> str:
    """Say how far ``value`` is from ``now`` in words: "in 5 minutes", "3 hours ago", or "just now" within a minute."""
    if abs((value - now).total_seconds()) < 60:
        return str(_("just now"))
    if value > now:
        return str(_("in %(time)s") % {"time": timeuntil(value, now, depth=1)})
    return str(_("%(time)s ago") % {"time": timesince(value, now, depth=1)})


def moment(value: datetime | None, now: datetime) -> str:
    """Return "3 hours ago" over "2026-12-06 18:54 CET": short enough for a list at 1280 px, never wrapped.

    The time is the user's zone's and names it; the tooltip has it in the locale's long format.
    """
    if value is None:
        return "—"
    local = timezone.localtime(value)
    return format_html(
        '<time class="fabrika-moment" datetime="{}" title="{} {}"><span class="fabrika-nowrap">{}</span>'
        ' <span class="fabrika-quiet fabrika-nowrap">{}</span></time>',
        value.isoformat(),
        date_format(local, "DATETIME_FORMAT"),
        local.tzname(),
        relative(value, now),
        date_format(local, "Y-m-d H:i T"),
    )


def time_column(field: str, description: Any) -> Any:
    """Return an admin column showing the datetime ``field`` as ``moment`` does, sortable by that field."""

    @admin.display(description=description, ordering=field)
    def column(model_admin: Any, row: Any) -> str:
        return moment(getattr(row, field), timezone.now())

    return column


def took(seconds: float) -> str:
    """Return a duration a person can compare: "3 ms" under a second (most attempts), "2.4 s", "95 s"."""
    if seconds < 0.001:
        return "< 1 ms"
    if seconds < 0.9995:  # what would round to "1000 ms" is "1.0 s"
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
