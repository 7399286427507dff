"""Benchmark the admin overview's counting query on a PostgreSQL queue table of a million rows.

    python -m bench.overview [--url postgres://postgres@127.0.0.1:5432/fabrika_overview] [--rows 1000000]

Fills ``lab_item`` (max_attempts 10) with mostly done rows, some waiting (half of them due now) and some
dead, VACUUM ANALYZEs it, then times the statement ``fabrika_django.admin._overview`` runs per queue table,
the same counts written the naive way (a FILTER per state over the whole table), and prints
``EXPLAIN (ANALYZE, BUFFERS)`` of ours. The table is kept between runs and refilled only when its shape
differs, so a second run measures at once. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench._setup import create_database, out, setup_django

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/fabrika_overview"
TABLE = "lab_item"


def _shape(rows: int) -> dict[str, int]:
    """Mostly done; 1% waiting (half of it due now), 0.5% dead."""
    waiting, dead = rows // 100, (rows + 199) // 200
    return {"waiting": waiting, "dead": dead, "done": rows - waiting - dead}


def _fill(cursor, rows: int) -> None:
    shape = _shape(rows)
    cursor.execute(
        f"SELECT count(*) FILTER (WHERE due IS NULL), count(*) FILTER (WHERE due IS NOT NULL AND attempts >= 10), "  # noqa: S608
        f"count(*) FILTER (WHERE due IS NOT NULL AND attempts < 10), "
        f"min(n) FILTER (WHERE due IS NOT NULL AND attempts >= 10) FROM {TABLE}"
    )
    done, dead, waiting, first_dead = cursor.fetchone()
    if (done, dead, waiting, first_dead) == (shape["done"], shape["dead"], shape["waiting"], 1):
        out(f"{TABLE} already holds {rows:,} rows in the benchmark's shape")
        return
    started = time.perf_counter()
    cursor.execute(f"TRUNCATE {TABLE}")
    # One INSERT from generate_series. Waiting and dead rows are spread over the whole table (every 100th
    # row waits, every 200th is dead), as in a table that has lived: the index scan then visits many pages.
    cursor.execute(
        f"INSERT INTO {TABLE} (n, writes, attempts, version, last_failure, due) "  # noqa: S608
        "SELECT i, 0, CASE WHEN i %% 100 = 0 THEN i %% 3 WHEN i %% 200 = 1 THEN 10 ELSE 1 END, 1, '', "
        "  CASE WHEN i %% 100 = 0 THEN now() + (CASE WHEN i %% 200 = 0 THEN -1 ELSE 1 END) "
        "                                 * (i %% 7200) * interval '1 second' "
        "       WHEN i %% 200 = 1 THEN now() - interval '3 days' + (i %% 3600) * interval '1 second' END "
        "FROM generate_series(1, %s) AS i",
        [rows],
    )
    out(f"filled {TABLE} with {rows:,} rows {shape} in {time.perf_counter() - started:.1f} s")


def _time(run, repeat: int) -> list[float]:
    run()  # warm: the first execution pays for planning and cold buffers
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return times


def _summary(label: str, times: list[float]) -> None:
    out(
        f"{label:<46} median {statistics.median(times):8.2f} ms   min {min(times):8.2f}   max {max(times):8.2f}"
        f"   ({len(times)} runs)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    options = parser.parse_args(argv)
    create_database(options.url)
    setup_django(options.url, lab=True)

    from django.db import connection
    from django.utils import timezone

    from fabrika_django._report import count_queue, count_sql
    from fabrika_django.admin._overview import DONE_COUNT_CAP
    from testproject.lab.models import Item

    with connection.cursor() as cursor:
        _fill(cursor, options.rows)
        cursor.execute(f"VACUUM ANALYZE {TABLE}")
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size(%s))", [TABLE])
        out(f"{TABLE}: {cursor.fetchone()[0]} with indexes; PostgreSQL {connection.pg_version}")

    now = timezone.now()
    counts = count_queue(Item, now, cap=DONE_COUNT_CAP)
    out(
        f"counts: waiting {counts.waiting:,}  due now {counts.due_now:,}  dead {counts.dead:,}  "
        f"done {'>' if counts.done > 10_000 else ''}{min(counts.done, 10_000):,} (capped)  "
        f"oldest due {counts.oldest_due}"
    )
    out()
    count = _time(lambda: count_queue(Item, now, cap=DONE_COUNT_CAP), options.repeat)
    _summary("overview count (one statement, partial index)", count)

    def naive() -> None:
        # What a straightforward aggregate does: every state counted by a FILTER over the whole table.
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*) FILTER (WHERE due IS NOT NULL AND attempts < 10), "  # noqa: S608
                f"count(*) FILTER (WHERE due IS NOT NULL AND attempts < 10 AND due <= %s), "
                f"count(*) FILTER (WHERE due IS NOT NULL AND attempts >= 10), "
                f"count(*) FILTER (WHERE due IS NULL), "
                f"min(due) FILTER (WHERE attempts < 10 AND due <= %s) FROM {TABLE}",
                [now, now],
            )
            cursor.fetchone()

    _summary("naive count (FILTER over the whole table)", _time(naive, options.repeat))
    out()
    sql, params = count_sql(Item, now, connection.alias, DONE_COUNT_CAP)
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        out("EXPLAIN (ANALYZE, BUFFERS) of the overview's statement:")
        for (line,) in cursor.fetchall():
            out(f"  {line}")


if __name__ == "__main__":
    main()
