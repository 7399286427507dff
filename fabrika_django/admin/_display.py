"""How the admin's lists show values at 1280 px: moments short (the full time with its zone at hand), durations
a person can compare, dotted names that wrap at their dots."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from django.contrib import admin
from django.db import models
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    # Types only (django-stubs checks types; it is no dependency): what Django's admin hooks take and return, in
    # django-stubs' own names, so the admin's overrides say the same as the methods they override.
    from django.contrib.admin import options
    from django_stubs_ext import StrOrPromise

    FieldGroups: TypeAlias = options._FieldGroups
    Fieldsets: TypeAlias = options._FieldsetSpec
    _M = TypeVar("_M", bound=models.Model)
    ListDisplay: TypeAlias = options._ListDisplayT[_M]
    ListFilterSpec: TypeAlias = options._ListFilterT


def relative(value: datetime, now: datetime) -> str:
    """Say how far ``value`` is from ``now`` in words: "in 5 minutes", "3 hours ago", or "just now" within a minute."""
    if abs((value - now).total_seconds()) < 60:
        return str(_("just now"))
    if value > now:
        return str(_("in %(time)s") % {"time": timeuntil(value, now, depth=1)})
    return str(_("%(time)s ago") % {"time": timesince(value, now, depth=1)})


def moment(value: datetime | None, now: datetime) -> str:
    """Return "3 hours ago" over "2026-12-06 18:54 CET": short enough for a list at 1280 px.

    The time is in the user's zone and names it; the tooltip has it in the locale's long format. Where the
    column is narrow the words and the date and time wrap, never inside "5 minutes", a date or a time.
    """
    if value is None:
        return "—"
    local = timezone.localtime(value)
    return format_html(
        '<time class="fabrika-moment" datetime="{}" title="{} {}">{} <span class="fabrika-quiet">'
        '<span class="fabrika-nowrap">{}</span> <span class="fabrika-nowrap">{}</span></span></time>',
        value.isoformat(),
        date_format(local, "DATETIME_FORMAT"),
        local.tzname(),
        relative(value, now),
        date_format(local, "Y-m-d"),
        date_format(local, "H:i T"),
    )


def time_column(field: str, description: StrOrPromise) -> Callable[[object, models.Model], str]:
    """Return an admin column showing the datetime ``field`` as ``moment`` does, sortable by that field."""

    @admin.display(description=description, ordering=field)
    def column(model_admin: object, row: models.Model) -> str:
        return moment(getattr(row, field), timezone.now())

    return column


def flat_fields(lines: FieldGroups) -> list[str]:
    """Return the field names of a fieldset's ``fields`` (a line may be a tuple of names)."""
    return [name for line in lines for name in (line if isinstance(line, (list, tuple)) else (line,))]


def took(seconds: float) -> str:
    """Return a duration a person can compare: "3 ms" under a second (most attempts), "2.4 s", "95 s"."""
    if seconds < 0.001:
        return "< 1 ms"
    if seconds < 0.9995:  # what would round to "1000 ms" is "1.0 s"
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def breakable(name: str) -> str:
    """Return a dotted or snake_case name that may wrap after each "." and "_", never inside a word."""
    parts = name.replace("_", "_\0").replace(".", ".\0").split("\0")
    return format_html_join(mark_safe("<wbr>"), "{}", ((part,) for part in parts))
