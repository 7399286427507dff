"""A schedule in words for people ("every 5 minutes", "daily at 03:15 UTC"), translated; the cron fields where
no words fit. Next to ``schedule.py``, which validates and computes; this module only describes."""

from __future__ import annotations

from django.utils.dates import MONTHS, WEEKDAYS
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .schedule import Schedule


def describe(schedule: Schedule | None) -> str:
    """Return the schedule in words, in the active language; ``at cron <fields> (UTC)`` where none fit."""
    if schedule is None:
        return _("only when kicked or run by hand")
    minute, hour, day, month, weekday = schedule.fields.split()
    words = _words(minute, hour, day, month, weekday)
    return words if words is not None else _("at cron %(fields)s (UTC)") % {"fields": schedule.fields}


def _words(minute: str, hour: str, day: str, month: str, weekday: str) -> str | None:
    if (day, month) != ("*", "*") and not (day.isdigit() and month == "*" and weekday == "*"):
        if day.isdigit() and month.isdigit() and weekday == "*" and minute.isdigit() and hour.isdigit():
            return _("yearly on %(month)s %(day)d at %(time)s UTC") % {
                "month": MONTHS[int(month)],
                "day": int(day),
                "time": _clock(hour, minute),
            }
        return None
    if hour == "*" and weekday == "*" and day == "*":
        if minute == "*":
            return _("every minute")
        if minute.startswith("*/") and minute[2:].isdigit():
            count = int(minute[2:])
            return ngettext("every %(count)d minute", "every %(count)d minutes", count) % {"count": count}
        if minute.isdigit():
            return _("hourly at minute %(minute)d") % {"minute": int(minute)}
    if minute.isdigit() and hour.isdigit():
        at = _clock(hour, minute)
        if day == "*" and weekday == "*":
            return _("daily at %(time)s UTC") % {"time": at}
        if day == "*" and weekday.isdigit() and int(weekday) <= 7:
            # cron counts weekdays from Sunday (0 or 7), Django's WEEKDAYS from Monday (0).
            return _("every %(weekday)s at %(time)s UTC") % {"weekday": WEEKDAYS[(int(weekday) - 1) % 7], "time": at}
        if day.isdigit() and weekday == "*":
            return _("monthly on day %(day)d at %(time)s UTC") % {"day": int(day), "time": at}
    if minute.isdigit() and hour.startswith("*/") and hour[2:].isdigit() and (day, weekday) == ("*", "*"):
        count = int(hour[2:])
        return ngettext(
            "every %(count)d hour at minute %(minute)d", "every %(count)d hours at minute %(minute)d", count
        ) % {"count": count, "minute": int(minute)}
    return None


def _clock(hour: str, minute: str) -> str:
    return f"{int(hour):02d}:{int(minute):02d}"
