"""Benchmark the write guard's cost per statement: ``python -m bench.guard``.

The guard sees every statement a job sends. This captures the statements of the seed's recipe (claim 50 rows,
finish each in ctx.transaction()) as Django sends them to PostgreSQL, then times, per statement:
  guard, cached   the guard's decision for a statement it has seen before (the hot path: Django's SQL text
                  repeats, its parameters travel apart)
  guard, cold     the same with the cache emptied before each call (a statement seen for the first time)
  round trip      Django's cursor.execute("SELECT 1") on the same database: the cheapest statement a job can send
and prints the guard's costs as shares of the round trip.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench._setup import create_database, out, setup_django

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/fabrika_bench_guard"


def _recipe_statements() -> list[str]:
    """Return the SQL text of one claim-and-finish of the recipe, as the job's connection sent it."""
    from django.db import connection

    from fabrika_django import cron
    from fabrika_django._handlers import handler_threads
    from fabrika_django.runner import run
    from testproject.lab.models import Item

    Item.objects.all().delete()
    Item.objects.bulk_create([Item() for _ in range(50)])
    seen: list[str] = []

    def capture(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    @cron(None, name="bench_guard")
    def recipe(ctx):
        with connection.execute_wrapper(capture):
            for row in Item.objects.claim(limit=50):
                with ctx.transaction():
                    row.finish(writes=1)

    result = run(recipe)
    handler_threads.drain()
    if not result.ok:
        raise SystemExit(f"the recipe ended {result.outcome}")
    return seen


def _per_call(call, repeat: int) -> float:
    """Return the median seconds of one ``call()`` over ``repeat`` rounds of 200 calls."""
    rounds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(200):
            call()
        rounds.append((time.perf_counter() - t0) / 200)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    create_database(args.database_url)
    setup_django(args.database_url, lab=True)

    from django.db import connection

    from fabrika_django import guards
    from fabrika_django._running import ActiveRun, running
    from fabrika_django.jobs import CronJob

    statements = _recipe_statements()
    distinct = list(dict.fromkeys(statements))
    job = CronJob(name="bench_guard", func=lambda ctx: None, schedule=None, actions=frozenset({"lab.change_item"}))
    clear = getattr(guards, "_cached_classify", None)

    def decide_all() -> None:
        for sql in distinct:
            guards._guard(_no_execute, sql, None, False, {})

    def decide_all_cold() -> None:
        for sql in distinct:
            clear.cache_clear() if clear else None
            guards._guard(_no_execute, sql, None, False, {})

    with running(ActiveRun(job=job)) as active:
        active.in_transaction = True
        cached = _per_call(decide_all, args.repeat) / len(distinct)
        cold = _per_call(decide_all_cold, args.repeat) / len(distinct)
    with connection.cursor() as cursor:
        trip = _per_call(lambda: cursor.execute("SELECT 1"), args.repeat)

    out(f"recipe: {len(statements)} statements, {len(distinct)} distinct texts (claim 50, finish each)")
    out(f"{'per statement':<16}{'µs':>10}{'of a round trip':>18}")
    for label, seconds in (("guard, cached", cached), ("guard, cold", cold), ("round trip", trip)):
        out(f"{label:<16}{seconds * 1e6:>10.1f}{seconds / trip:>17.1%}")


def _no_execute(sql, params, many, context):
    return None


if __name__ == "__main__":
    main()
