"""Backoff arithmetic, in one place and free of the database.

A claimed row waits ``min(period * 2 ** (attempts_after - 1), MAX_ROW_BACKOFF)`` before it is due again,
where ``period`` is the running job's schedule period (``DEFAULT_PERIOD`` for a job without a schedule)
and ``attempts_after`` the row's attempts including this claim. A failed attempt of a run is retried after
``min(RETRY_BASE * 2 ** (attempt - 1), RETRY_MAX)``: a short pause, so a retry is not the same instant. A
worker that lost its database waits ``doubling(...)`` between tries the same way.
"""

from __future__ import annotations

from datetime import timedelta

MAX_ROW_BACKOFF = timedelta(days=30)
DEFAULT_PERIOD = timedelta(seconds=60)
RETRY_BASE = timedelta(seconds=1)
RETRY_MAX = timedelta(seconds=30)


def row_backoff(period: timedelta, attempts_after: int) -> timedelta:
    """Return how long a row claimed for the ``attempts_after``-th time waits before it is due again."""
    if attempts_after < 1:
        raise ValueError(f"attempts_after must be at least 1, got {attempts_after}")
    # Past 2**40 the product would only overflow timedelta; the cap is long reached by then.
    exponent = min(attempts_after - 1, 40)
    try:
        return min(period * 2**exponent, MAX_ROW_BACKOFF)
    except OverflowError:
        return MAX_ROW_BACKOFF


def row_backoffs(period: timedelta, max_attempts: int) -> list[timedelta]:
    """``row_backoff`` of a row claimed with 0, 1, ... attempts before, up to its first capped value.

    A claim's SQL picks from this list by the row's attempts before the claim, the last one for any count past
    it (``LEAST(attempts, len - 1)``): the same backoff, computed here only.
    """
    found: list[timedelta] = []
    for before in range(max(max_attempts, 1)):
        found.append(row_backoff(period, before + 1))
        if found[-1] >= MAX_ROW_BACKOFF:
            break
    return found


def retry_pause(failed_attempt: int) -> timedelta:
    """Return the pause before the attempt that follows failed attempt number ``failed_attempt``."""
    return doubling(RETRY_BASE, failed_attempt, RETRY_MAX)


def doubling(first: timedelta, failures: int, cap: timedelta) -> timedelta:
    """Return ``min(first * 2 ** (failures - 1), cap)``: the pause after the ``failures``-th failure in a row."""
    return min(first * 2 ** min(failures - 1, 20), cap)
