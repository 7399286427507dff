"""Cron expressions: what a schedule may be, its fires in UTC, and its period (the base of row backoff)."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from fabrika_django import cron
from fabrika_django.schedule import RULE, Schedule, normalize, period_of

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
        ("* * * *", f"Schedule '* * * *' has 4 fields: give {RULE}."),
        ("0 * * * * *", f"Schedule '0 * * * * *' has 6 fields: give {RULE}."),
        ("61 * * * *", "Schedule '61 * * * *' is not a valid cron expression: check each of its five fields"),
        (
            "@reboot",
            "Schedule '@reboot' is not a known macro (@annually, @daily, @hourly, @midnight, @monthly, @weekly, "
            f"@yearly): give {RULE}.",
        ),
        ("", f"Schedule '' is not a cron expression: give {RULE}."),
        (15, f"Schedule 15 is not a cron expression: give {RULE}."),
        (
            "*/61 * * * *",
            "Schedule '*/61 * * * *' steps by 61 in its minute field, whose values are 0-59: give a step from 1 to 59.",
        ),
        ("*/60 * * * *", "Schedule '*/60 * * * *' steps by 60 in its minute field"),
        ("0 */24 * * *", "Schedule '0 */24 * * *' steps by 24 in its hour field, whose values are 0-23"),
        ("0 0 1-10/31 * *", "Schedule '0 0 1-10/31 * *' steps by 31 in its day-of-month field, whose values are 1-31"),
        ("0 0 * */12 *", "Schedule '0 0 * */12 *' steps by 12 in its month field"),
        ("0 0 * * 1,*/7", "Schedule '0 0 * * 1,*/7' steps by 7 in its day-of-week field"),
        ("*/0 * * * *", "Schedule '*/0 * * * *' steps by 0 in its minute field"),
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


@pytest.mark.parametrize("expression", ["*/61 * * * *", "0 9 * *", "@often"])
def test_cron_names_the_job_and_the_expression_in_one_rule(expression):
    def nightly(ctx):
        pass

    with pytest.raises(ValueError) as refused:
        cron(expression, name="shop.nightly")(nightly)
    assert str(refused.value).startswith(f"Cron job 'shop.nightly': Schedule {expression!r} ")
    with pytest.raises(ValueError) as unnamed:
        cron(expression)(nightly)
    assert str(unnamed.value).startswith(f"Cron job 'nightly': Schedule {expression!r} ")


def test_steps_within_each_fields_range_are_taken():
    assert normalize("*/59 */23 */30 */11 */6") == "*/59 */23 */30 */11 */6"
    assert normalize("0-30/15 9-17/2 * * 1-5") == "0-30/15 9-17/2 * * 1-5"


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
