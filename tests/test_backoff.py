"""Backoff arithmetic, without a database."""

from datetime import timedelta

import pytest

from fabrika_django.backoff import DEFAULT_PERIOD, MAX_ROW_BACKOFF, retry_pause, row_backoff

FIVE_MINUTES = timedelta(minutes=5)


def test_a_row_waits_the_period_then_twice_then_four_times_and_so_on():
    assert [row_backoff(FIVE_MINUTES, n) for n in (1, 2, 3, 4, 5)] == [
        timedelta(minutes=5),
        timedelta(minutes=10),
        timedelta(minutes=20),
        timedelta(minutes=40),
        timedelta(minutes=80),
    ]


def test_a_row_waits_at_most_thirty_days():
    assert MAX_ROW_BACKOFF == timedelta(days=30)
    # 5 min * 2**13 = 28.4 days; the next doubling passes the cap.
    assert row_backoff(FIVE_MINUTES, 14) == timedelta(minutes=5 * 2**13)
    assert row_backoff(FIVE_MINUTES, 15) == timedelta(days=30)
    assert row_backoff(timedelta(days=365), 1) == timedelta(days=30)


def test_the_cap_holds_for_attempt_counts_that_would_overflow_a_timedelta():
    assert row_backoff(DEFAULT_PERIOD, 10_000) == timedelta(days=30)
    assert row_backoff(timedelta(days=300), 60) == timedelta(days=30)


def test_a_job_without_a_schedule_backs_off_from_one_minute():
    assert DEFAULT_PERIOD == timedelta(seconds=60)
    assert [row_backoff(DEFAULT_PERIOD, n) for n in (1, 2, 3)] == [
        timedelta(minutes=1),
        timedelta(minutes=2),
        timedelta(minutes=4),
    ]


@pytest.mark.parametrize("attempts_after", [0, -1])
def test_row_backoff_refuses_a_row_that_was_not_claimed(attempts_after):
    with pytest.raises(ValueError, match=f"attempts_after must be at least 1, got {attempts_after}"):
        row_backoff(FIVE_MINUTES, attempts_after)


def test_a_failed_attempt_is_retried_after_a_short_growing_pause():
    assert [retry_pause(n).total_seconds() for n in (1, 2, 3, 4, 5, 6, 50)] == [1, 2, 4, 8, 16, 30, 30]


def test_the_workers_reconnect_backoff_doubles_to_its_cap_and_resets():
    from fabrika_django._listen import Backoff

    backoff = Backoff(first=0.1, cap=1.0)
    assert [round(backoff.next(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.reset()
    assert backoff.next() == 0.1
