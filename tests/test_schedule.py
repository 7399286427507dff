"""Cron expressions: what a schedule may be, its fires in UTC, and its period (the base of row backoff)."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from fabrika_django import cron
from fabrika_django.schedule import Schedule, normalize, period_of

MONDAY_NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "fields"),
    [
        ("15 * * * *", "15 * * * *"),
        ("  */5   *  * * 1-5 ", "*/5 * * * 1-5"),
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("0 9 * jan mon", "0 9 * jan mon"),
    ],
)
def test_a_schedule_is_five_fields_or_a_macro(expression, fields):
    assert normalize(expression) == fields
    assert Schedule(expression).fields == fields


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (
            "* * * *",
            "Schedule '* * * *' has 4 fields: give exactly five (minute hour day-of-month month day-of-week), in UTC.",
        ),
        ("0 * * * * *", "Schedule '0 * * * * *' has 6 fields: give exactly five"),
        ("61 * * * *", "Schedule '61 * * * *' is not a valid cron expression: check each of its five fields"),
        ("@reboot", "Schedule '@reboot' is not a known macro: use one of @annually, @daily"),
        ("", "Schedule '' is not a cron expression: give five fields in UTC, such as '15 * * * *'"),
        (15, "Schedule 15 is not a cron expression"),
        ("0 0 31 2 *", "Schedule '0 0 31 2 *' never fires (such as the 31st of February): check its day-of-month"),
        ("R * * * *", "Schedule 'R * * * *' uses a random or hashed field (R, H): give fixed values"),
        ("H/15 * * * *", "Schedule 'H/15 * * * *' uses a random or hashed field (R, H)"),
    ],
)
def test_anything_else_is_refused_saying_what_a_schedule_must_be(expression, message):
    with pytest.raises(ValueError) as refused:
        normalize(expression)

    assert str(refused.value).startswith(message)


def test_cron_refuses_a_bad_schedule_at_import_naming_the_expression():
    with pytest.raises(ValueError, match="Schedule '0 0 30 2 \\*' never fires"):
        cron("0 0 30 2 *")(lambda ctx: None)


def test_fires_are_computed_in_utc_whatever_the_given_zone():
    berlin_noon = MONDAY_NOON.astimezone(timezone(timedelta(hours=1)))
    schedule = Schedule("15 * * * *")

    assert schedule.next_after(berlin_noon) == datetime(2026, 1, 5, 12, 15, tzinfo=UTC)
    assert schedule.next_after(datetime(2026, 1, 5, 12, 15, tzinfo=UTC)) == datetime(2026, 1, 5, 13, 15, tzinfo=UTC)
    assert schedule.previous_at_or_before(datetime(2026, 1, 5, 12, 15, tzinfo=UTC)) == datetime(
        2026, 1, 5, 12, 15, tzinfo=UTC
    )
    assert schedule.previous_at_or_before(berlin_noon) == datetime(2026, 1, 5, 11, 15, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "period"),
    [
        ("*/5 * * * *", timedelta(minutes=5)),
        ("15 * * * *", timedelta(hours=1)),
        ("@daily", timedelta(days=1)),
        ("0 9 * * 1-5", timedelta(days=1)),  # the shortest gap, not the weekend's
        ("*/7 * * * *", timedelta(minutes=4)),  # :56 to :00
        ("@monthly", timedelta(days=28)),
    ],
)
def test_the_period_is_the_shortest_gap_between_fires(expression, period):
    assert Schedule(expression).period == period


def test_the_period_is_computed_once_per_schedule():
    schedule = Schedule("*/5 * * * *")

    assert schedule.period is schedule.period


def test_a_job_without_a_schedule_has_a_period_of_one_minute():
    assert period_of(None) == timedelta(seconds=60)
    assert period_of(Schedule("@hourly")) == timedelta(hours=1)


def test_schedules_with_the_same_fields_are_equal():
    assert Schedule("@hourly") == Schedule("0 * * * *")
    assert len({Schedule("@hourly"), Schedule(" 0 * * * * ")}) == 1
    assert Schedule("@hourly") != Schedule("@daily")
