"""Benchmark the admin overview on PostgreSQL: a million-row queue table, a million history rows.

    python -m bench.overview [--url postgres://postgres@127.0.0.1:5432/fabrika_overview] [--rows 1000000]
        [--history 1000000]

Fills ``lab_item`` (max_attempts 10) with mostly done rows, some waiting (half of them due now) and some
dead, VACUUM ANALYZEs it, then times the statement ``fabrika_django.admin._overview`` runs per queue table,
the same counts written the naive way (a FILTER per state over the whole table), and prints
``EXPLAIN (ANALYZE, BUFFERS)`` of ours. The table is kept between runs and refilled only when its shape
differs, so a second run measures at once.

Then the whole overview page (health, counts, the 24-hour charts) is rendered in-process on ``--history``
attempt rows spread over 30 days (the default ``RUN_HISTORY_DAYS``) with 30 days of queue samples, and timed
against its budget of 300 ms server time, with ``EXPLAIN (ANALYZE, BUFFERS)`` of the charts' statements; and
the sampling job's work (one counting statement per queue table and the insert) is timed on the million-row
table against its budget of 50 ms. A benchmark, not a test: it asserts nothing.
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


HISTORY_DAYS = 30
HISTORY_JOBS = 10


def _fill_history(cursor, rows: int) -> None:
    """``rows`` attempts of ten jobs, evenly over the last 30 days; 5 % failed; plus 30 days of samples."""
    # Kept while its newest row is under an hour old: the last day then still holds a thirtieth of it.
    cursor.execute("SELECT count(*), now() - max(started) < interval '1 hour' FROM fabrika_django_attempt")
    count, fresh = cursor.fetchone()
    if count == rows and fresh:
        out(f"fabrika_django_attempt already holds {rows:,} rows of the last {HISTORY_DAYS} days")
        return
    started = time.perf_counter()
    cursor.execute(
        "TRUNCATE fabrika_django_attempt, fabrika_django_queuesample, fabrika_django_attempthour, "
        "fabrika_django_foldedhour"
    )
    cursor.execute(
        "INSERT INTO fabrika_django_attempt (job, run_id, trigger, number, holder, started, finished, outcome, "
        "error_class, frames, message) "
        "SELECT 'bench_job_' || (i %% %s), gen_random_uuid(), 'schedule', 1, 'bench', "
        "  now() - (i * (%s * 86400.0 / %s)) * interval '1 second', "
        "  now() - (i * (%s * 86400.0 / %s)) * interval '1 second' + (0.05 + (i %% 97) / 20.0) * interval '1 second', "
        "  CASE WHEN i %% 20 = 0 THEN 'handler_failed' ELSE 'succeeded' END, '', '', '' "
        "FROM generate_series(1, %s) AS i",
        [HISTORY_JOBS, HISTORY_DAYS, rows, HISTORY_DAYS, rows, rows],
    )
    cursor.execute(
        "INSERT INTO fabrika_django_queuesample (queue, sampled, waiting, due_now, dead) "
        "SELECT q, now() - s * interval '5 minutes', 100 + s %% 50, s %% 40, s %% 7 "
        "FROM unnest(%s::text[]) AS q, generate_series(0, %s) AS s",
        [_queue_labels(), HISTORY_DAYS * 288],
    )
    cursor.execute("VACUUM ANALYZE fabrika_django_attempt")
    cursor.execute("VACUUM ANALYZE fabrika_django_queuesample")
    took = time.perf_counter() - started
    out(f"filled fabrika_django_attempt with {rows:,} rows over {HISTORY_DAYS} days in {took:.1f} s")


def _queue_labels() -> list[str]:
    from fabrika_django.ops._counts import queue_models

    return [model._meta.label for model in queue_models()]


def _bench_jobs():
    """Register the ten jobs the history belongs to, so the overview draws each of them."""
    from datetime import timedelta

    from fabrika_django.jobs import cron, registry

    for number in range(HISTORY_JOBS):
        name = f"bench_job_{number}"
        if name not in registry:
            cron("*/5 * * * *", name=name, timeout=timedelta(minutes=1))(lambda ctx: None)


def _render_overview():
    """Return a function that renders the admin overview page in-process, as a superuser's request."""
    from django.contrib import admin
    from django.contrib.auth import get_user_model
    from django.test import RequestFactory

    from fabrika_django.admin._overview import overview_view

    user = get_user_model().objects.filter(username="bench").first()
    if user is None:
        user = get_user_model().objects.create_superuser("bench", "bench@localhost", "bench")
    view = overview_view(admin.site)

    def render() -> int:
        request = RequestFactory().get("/admin/fabrika_django/overview/")
        request.user = user
        response = view(request)
        response.render()
        return len(response.content)

    return render


def _explain(cursor, label: str, sql: str, params: list) -> None:
    cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
    out(f"EXPLAIN (ANALYZE, BUFFERS) of {label}:")
    for (line,) in cursor.fetchall():
        out(f"  {line}")


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
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    options = parser.parse_args(argv)
    create_database(options.url)
    setup_django(options.url, lab=True)

    from django.db import connection
    from django.utils import timezone

    from fabrika_django.admin._overview import DONE_COUNT_CAP
    from fabrika_django.ops._counts import count_queue, count_sql
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
    out()
    with connection.cursor() as cursor:
        _fill_history(cursor, options.history)
    _bench_page(options.history, options.repeat)
    out()
    _bench_sampling(Item, options.repeat)


def _bench_sampling(model, repeat: int) -> None:
    """The sampling job's work, in its transaction: a count per queue table (no done count), one insert, and the
    fold of the hours just over (nothing most runs; one hour in the first run after an hour ends)."""
    from datetime import timedelta

    from django.db import connection, transaction
    from django.utils import timezone

    from fabrika_django.models import FoldedHour, QueueSample
    from fabrika_django.ops._counts import count_sql
    from fabrika_django.ops._history import FOLD_GRACE, fold_hours, hour_slots, take_samples

    def sample(refold: bool) -> None:
        now = timezone.now()
        with transaction.atomic():
            if refold:  # as in the first run after an hour (and its grace) ended
                last = max(slot for slot in hour_slots(now) if slot + timedelta(hours=1) + FOLD_GRACE <= now)
                FoldedHour.objects.filter(hour=last).delete()
            QueueSample.objects.bulk_create(take_samples(now))
            fold_hours(now)
            transaction.set_rollback(True)  # measured, not kept: the charts' samples stay as filled

    tables = len(_queue_labels())
    times = _time(lambda: sample(False), repeat)
    _summary(f"sampling job ({tables} queue tables, one of 1M rows)", times)
    out(f"  budget 50 ms: median at {statistics.median(times) / 50:.0%} of it")
    _summary("sampling job, the run that folds an hour", _time(lambda: sample(True), repeat))
    out()
    sql, params = count_sql(model, timezone.now(), connection.alias, None, done=False)
    with connection.cursor() as cursor:
        _explain(cursor, "the sampling job's count of the 1M-row table", sql, params)


def _bench_page(history: int, repeat: int) -> None:
    from datetime import timedelta

    from django.db import connection, transaction
    from django.utils import timezone

    from fabrika_django.jobs import registry
    from fabrika_django.models import AttemptHour, FoldedHour
    from fabrika_django.ops._history import fold_hours, hour_slots, hourly_sql

    _bench_jobs()
    render = _render_overview()
    with transaction.atomic():
        FoldedHour.objects.all().delete()  # as before the first sampling run: the whole day read from attempts
        size = render()
        unfolded = _time(render, max(3, repeat // 4))
        transaction.set_rollback(True)
    started = time.perf_counter()
    folded = fold_hours(timezone.now())
    out(f"folded {folded} hours of {history:,} attempts' last day in {(time.perf_counter() - started) * 1000:.0f} ms")
    times = _time(render, repeat)
    _summary(f"overview page ({history:,} attempts, {len(registry)} jobs)", times)
    _summary("  the same before any hour is folded", unfolded)
    out(f"  load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs while measured")
    out(f"  {size:,} bytes of HTML; budget 300 ms: median at {statistics.median(times) / 300:.0%} of it")
    out()
    slots = hour_slots(timezone.now())
    stored = AttemptHour.objects.filter(hour__gte=slots[0], hour__lt=slots[-1], job__in=[job.name for job in registry])
    with connection.cursor() as cursor:
        _explain(cursor, "the overview's read of the folded hours", *stored.query.sql_with_params())
        _explain(
            cursor,
            "the overview's read of the current hour",
            *hourly_sql(connection, slots[-1], slots[-1] + timedelta(hours=1)),
        )
        _explain(cursor, "the fold of one hour (the sampling job)", *hourly_sql(connection, slots[-2], slots[-1]))


if __name__ == "__main__":
    main()
