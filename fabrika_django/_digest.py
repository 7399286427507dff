"""A fixed-bucket histogram of attempt durations, from which the overview draws each hour's p50 and p95.

The folded hours (``_history``) keep, per job and hour, how many attempts ended in each bucket instead of every
duration, so the charts read 24 small rows per job whatever the history holds. Buckets are fixed, the same
everywhere (PostgreSQL computes the index in SQL, ``bucket_sql``; other databases here, ``bucket_of``):

- bucket 0 holds durations under ``BASE`` (1 ms);
- bucket ``i`` ≥ 1 holds ``[BASE·2^((i−1)/8), BASE·2^(i/8))``: eight buckets per doubling, each 9 % wider
  than the one before, up to bucket ``LAST`` (about 12 days, far past any timeout), which also takes anything
  longer.

A percentile is PostgreSQL's ``percentile_cont`` (linear interpolation between the two closest ranks) with each
rank's value read from its bucket, the bucket's values taken as evenly spread over it. The k-th smallest
duration lies in the bucket the counts put it in, so each rank's value is off by less than its bucket's width
(9 % of the value above 1 ms, under 1 ms below it), and so is the interpolation between two of them: at most
the wider of their two buckets (tests/test_history.py checks this against exact percentiles).
"""

from __future__ import annotations

import math

#: The upper bound of bucket 0, in seconds.
BASE = 0.001
#: Buckets per doubling of the duration.
STEPS = 8
#: The last bucket's index: 30 doublings above 1 ms (2^30 ms, about 12.4 days).
LAST = 30 * STEPS


def bucket_of(seconds: float) -> int:
    """Return the bucket a duration falls in (a negative one, from two hosts' clocks, in bucket 0)."""
    if seconds < BASE:
        return 0
    # The same operations in the same order as bucket_sql's, so a duration on a bucket's edge lands alike.
    return min(LAST, 1 + math.floor(STEPS * math.log(seconds / BASE) / math.log(2)))


def bounds(index: int) -> tuple[float, float]:
    """Return the bucket's ``[low, high)`` bounds, in seconds."""
    if index <= 0:
        return 0.0, BASE
    return BASE * 2 ** ((index - 1) / STEPS), BASE * 2 ** (index / STEPS)


def bucket_sql(seconds: str) -> str:
    """``bucket_of`` as a PostgreSQL expression of ``seconds``, an SQL expression of seconds as a ``float8``
    (``numeric``'s logarithm costs more than the rest of the statement)."""
    return (
        f"CASE WHEN {seconds} < {BASE} THEN 0 "
        f"ELSE least({LAST}, 1 + floor({STEPS} * ln(({seconds}) / {BASE}) / ln(2))::integer) END"
    )


def percentile(counts: dict[int, int], fraction: float) -> float | None:
    """Return the ``fraction`` percentile (0.5: the median) of the durations counted per bucket; None if none."""
    total = sum(counts.values())
    if not total:
        return None
    rank = fraction * (total - 1)
    low, high = math.floor(rank), math.ceil(rank)
    ordered = sorted((index, count) for index, count in counts.items() if count)
    below = _ranked(ordered, low)
    return below + (_ranked(ordered, high) - below) * (rank - low)


def _ranked(ordered: list[tuple[int, int]], rank: int) -> float:
    """The value of the ``rank``-th smallest duration (from 0): its place among its bucket's, evenly spread."""
    seen = 0
    for index, count in ordered:
        if rank < seen + count:
            low, high = bounds(index)
            return low + (high - low) * (rank - seen + 0.5) / count
        seen += count
    raise ValueError(f"rank {rank} is past the {seen} durations counted")  # pragma: no cover  percentile's ranks


def encode(counts: dict[int, int]) -> str:
    """Write counts per bucket as text, ``"index:count"`` by index, comma separated (empty buckets left out)."""
    return ",".join(f"{index}:{count}" for index, count in sorted(counts.items()) if count)


def decode(text: str) -> dict[int, int]:
    """Read what ``encode`` wrote."""
    counts: dict[int, int] = {}
    for part in filter(None, text.split(",")):
        index, count = part.split(":")
        counts[int(index)] = counts.get(int(index), 0) + int(count)
    return counts
