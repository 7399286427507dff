"""Cron expressions: the one rule of a schedule (``RULE``), its fires in UTC and its period.

A schedule is five cron fields in UTC (minute hour day-of-month month day-of-week) or a macro such as ``@hourly``;
``None`` makes a job that runs only when kicked. Each field's values and steps stay within its range (``*/61`` in
the minute field would fire only at :00, so it is refused); random and hashed fields (R, H) are refused too.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import cached_property

from croniter import CroniterError, croniter

from .backoff import DEFAULT_PERIOD

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# The period is measured from a fixed instant, so it is the same on every host and every day.
_PERIOD_ORIGIN = datetime(2001, 1, 1, tzinfo=UTC)
_PERIOD_SAMPLES = 16
#: What a schedule must be, said the same way by every refusal (``@cron``'s ValueError and the checks).
RULE = (
    "five cron fields in UTC (minute hour day-of-month month day-of-week), such as '15 * * * *', "
    "or a macro such as '@hourly'"
)
#: Each field's name and range, in order: a step beyond its range fires once per period at its start.
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12), ("day-of-week", 0, 6))
_STEP = re.compile(r"/(\d+)$")
# croniter's random ("R") and hashed ("H") fields would fire at different times on different hosts.
_NOT_PORTABLE = re.compile(r"(^|,)[RH]($|[(/,])", re.IGNORECASE)


class Schedule:
    """A validated cron expression, evaluated in UTC."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.fields = normalize(expression)

    def __repr__(self) -> str:
        return f"Schedule({self.expression!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and other.fields == self.fields

    def __hash__(self) -> int:
        return hash(self.fields)

    def next_after(self, moment: datetime) -> datetime:
        """Return the first fire strictly after ``moment`` (an aware datetime), in UTC."""
        start = moment.astimezone(UTC)
        return croniter(self.fields, start).get_next(datetime).astimezone(UTC)

    def previous_at_or_before(self, moment: datetime) -> datetime:
        """Return the latest fire at or before ``moment``, in UTC."""
        start = moment.astimezone(UTC) + timedelta(microseconds=1)
        return croniter(self.fields, start).get_prev(datetime).astimezone(UTC)

    @cached_property
    def period(self) -> timedelta:
        """Return the shortest gap between two fires: the base of a claimed row's backoff.

        Computed once per schedule: every claim reads it.
        """
        return _period(self.fields)


def _period(fields: str) -> timedelta:
    it = croniter(fields, _PERIOD_ORIGIN)
    fires = [it.get_next(datetime) for _ in range(_PERIOD_SAMPLES)]
    return min(later - earlier for earlier, later in zip(fires, fires[1:], strict=False))


def normalize(expression: object) -> str:
    """Return the five fields of ``expression``, or raise ValueError saying what a schedule must be (``RULE``)."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError(f"Schedule {expression!r} is not a cron expression: give {RULE}.")
    text = expression.strip()
    if text.startswith("@"):
        if text not in MACROS:
            raise ValueError(
                f"Schedule {expression!r} is not a known macro ({', '.join(sorted(MACROS))}): give {RULE}."
            )
        return MACROS[text]
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(f"Schedule {expression!r} has {len(fields)} fields: give {RULE}.")
    normalized = " ".join(fields)
    if any(_NOT_PORTABLE.search(field) for field in fields):
        raise ValueError(
            f"Schedule {expression!r} uses a random or hashed field (R, H): give fixed values, "
            "so every host fires the job at the same time."
        )
    _refuse_long_steps(expression, fields)
    if not croniter.is_valid(normalized):
        raise ValueError(
            f"Schedule {expression!r} is not a valid cron expression: check each of its five fields "
            "(minute 0-59, hour 0-23, day 1-31, month 1-12, weekday 0-6)."
        )
    try:
        _period(normalized)
    except CroniterError:
        raise ValueError(
            f"Schedule {expression!r} never fires (such as the 31st of February): "
            "check its day-of-month and month fields."
        ) from None
    return normalized


def _refuse_long_steps(expression: str, fields: list[str]) -> None:
    """Refuse a step of 0 or one past its field's range (``*/61`` in minutes), which croniter takes."""
    for field, (name, low, high) in zip(fields, _FIELDS, strict=True):
        for part in field.split(","):
            step = _STEP.search(part)
            if step is not None and not 1 <= int(step.group(1)) <= high - low:
                raise ValueError(
                    f"Schedule {expression!r} steps by {step.group(1)} in its {name} field, whose values are "
                    f"{low}-{high}: give a step from 1 to {high - low}."
                )


def period_of(schedule: Schedule | None) -> timedelta:
    """Return the backoff period of a job: its schedule's period, or one minute without a schedule."""
    return schedule.period if schedule is not None else DEFAULT_PERIOD
