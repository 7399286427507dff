"""Django tasks: fabrika_django.tasks.FabrikaBackend against django-tasks-db and PgQueuer, on the same PostgreSQL,
in one run.

    pip install -e ".[bench]"                   # the peers, django-tasks-db 0.13.0 and PgQueuer 1.6; never
                                                # dependencies of fabrika
    .venv/bin/python -m bench.tasks [--postgres URL] [--enqueues 1000] [--drain 20000] [--latency 200]
                                    [--only enqueue|drain|latency]

It drops and recreates its database (``fabrika_bench_tasks`` by default), then measures, each way in turn:
1. one-at-a-time enqueue rate from a loop with no worker running, each enqueue its own transaction (as from a
   view in autocommit): a fabrika task, a queue-table row + ``kick()`` (in autocommit, so two commits, and in one
   ``transaction.atomic()``, as a view that records the row with the kick), and a django-tasks-db task (alone, and
   in one ``transaction.atomic()``, which the atomic row + ``kick()`` is compared with: both then pay psycopg's
   BEGIN and the COMMIT); three interleaved rounds, the median counts;
2. a drain of ``--drain`` no-op tasks with one worker (``fabrika_job worker`` / ``db_worker --batch
   --interval 0``), tasks per second from the rows' own ``started_at`` of the first to ``finished_at`` of the last;
3. enqueue-to-start latency with an idle worker (fabrika: LISTEN/NOTIFY; django-tasks-db: polling every 0.1 s):
   the task row's ``started_at`` minus the moment just before ``enqueue()`` was called. The bench looks for the
   task's end only 15 ms after the enqueue (then every 5 ms): its own queries would otherwise take a core from the
   worker it measures on a two-core machine. The same loop sleeps a random part of a poll interval between
   enqueues for django-tasks-db (else each enqueue would follow its last poll closely). And the database's own
   floor, in the same run: plain psycopg, no Django, an enqueue of one prepared statement (the task's row, its
   kick and the NOTIFY: fabrika's own statement) and a process that only LISTENs and, on hearing it, starts the
   task with one prepared UPDATE: two statements and a NOTIFY, where a worker also takes a lease and records
   an attempt (one more statement) before its handler claims the task.
PgQueuer, the second peer, is measured the same three ways through its own API by bench/pgqueuer_peer.py (its
enqueue interleaved with the others' rounds; its drain with one consumer in batches of 10; its latency with an idle
consumer woken by its own NOTIFY), in its own tables, which its installer makes in the same database.
Targets (what the tasks backend was built to meet): enqueue >= 0.9x theirs, drain >= 5x theirs, latency p50 <= 3 ms
and p99 <= 12 ms. The performance targets the next work sets: drain >= 5x django-tasks-db and >= 0.5x PgQueuer's
batch-10 drain; enqueue >= 1.0x PgQueuer's (its faster API); enqueue-to-start p50 <= PgQueuer's, p99 <= 3x p50.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from bench import pgqueuer_peer
from bench._setup import out
from bench._tasks_report import report

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/fabrika_bench_tasks")
    parser.add_argument("--enqueues", type=int, default=1000, help="enqueues per way and round")
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument("--latency", type=int, default=200, help="tasks per way for the latency")
    parser.add_argument("--only", choices=("enqueue", "drain", "latency"), help="measure one of the three")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "floor-listener":
        return _floor_listener(args.postgres)
    try:
        import django_tasks_db  # noqa: F401
    except ImportError:
        out('django-tasks-db is not installed: pip install -e ".[bench]" (django-tasks-db 0.13.0, the peer).')
        return 2
    if not pgqueuer_peer.available():
        out('PgQueuer is not installed: pip install -e ".[bench]" (PgQueuer 1.6 and asyncpg, the second peer).')
        return 2
    _fresh_database(args.postgres)
    pgqueuer_peer.install(args.postgres)
    os.environ.update(
        DATABASE_URL=args.postgres, FABRIKA_LAB="1", FABRIKA_BENCH_TASKS_DB="1", FABRIKA_LOG_LEVEL="WARNING"
    )
    from bench._setup import setup_django

    setup_django(args.postgres, lab=True)
    out(f"PostgreSQL {args.postgres.rsplit('/', 1)[0]}, one run; CPU count {os.cpu_count()}")
    wanted = {args.only} if args.only else {"enqueue", "drain", "latency"}
    rates = _enqueue_rates(args.enqueues) if "enqueue" in wanted else {}
    drains = {way: _drain(way, args.drain) for way in ("fabrika", "db")} if "drain" in wanted else {}
    if drains:
        drains["pgqueuer"] = pgqueuer_peer.drain(args.postgres, args.drain)
    ways = ("fabrika", "floor", "db")
    latencies = {way: _latency(way, args.latency) for way in ways} if "latency" in wanted else {}
    if latencies:
        latencies["pgqueuer"] = pgqueuer_peer.latency(args.postgres, args.latency)
    report(rates, drains, latencies)
    return 0


def _fresh_database(url: str) -> None:
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


# -- 1. enqueue ---------------------------------------------------------------------------------------------


def _enqueue_rates(count: int) -> dict[str, float]:
    from django.db import transaction

    from fabrika_django import kick
    from testproject.lab.models import Item
    from testproject.lab.tasks import noop

    def row_and_kick_in_one_transaction():
        with transaction.atomic():
            Item.objects.create()
            kick("lab_items")

    on_db = noop.using(backend="db")

    def their_task_in_one_transaction():
        with transaction.atomic():
            on_db.enqueue()

    ways = {
        "fabrika task": noop.enqueue,
        "queue row + kick()": lambda: (Item.objects.create(), kick("lab_items")),
        "row + kick(), atomic": row_and_kick_in_one_transaction,
        "django-tasks-db task": on_db.enqueue,
        "theirs, atomic": their_task_in_one_transaction,
    }
    peer = pgqueuer_peer.Enqueuer(os.environ["DATABASE_URL"])
    loops = {name: _looped(call) for name, call in ways.items()} | peer.loops()
    for loop in loops.values():  # warm up connections, prepared statements, imports
        loop(50)
    seen: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(ROUNDS):
        for name, loop in loops.items():
            began = time.perf_counter()
            loop(count)
            seen[name].append(count / (time.perf_counter() - began))
    peer.close()
    _clear_tables()
    return {name: statistics.median(rates) for name, rates in seen.items()}


def _looped(call):
    def loop(count: int) -> None:
        for _ in range(count):
            call()

    return loop


def _clear_tables() -> None:
    from django.db import connection
    from django_tasks_db.models import DBTaskResult

    from fabrika_django.models import Job, KickRequest, QueuedTask
    from testproject.lab.models import Item

    models = (QueuedTask, DBTaskResult, Item, KickRequest)
    tables = ", ".join([*(connection.ops.quote_name(model._meta.db_table) for model in models), *pgqueuer_peer.TABLES])
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables}")
    Job.objects.update(pending_since=None)


# -- 2. drain -----------------------------------------------------------------------------------------------


def _drain(way: str, count: int) -> float:
    from django.utils import timezone
    from django_tasks_db.models import DBTaskResult

    from fabrika_django import kick
    from fabrika_django.models import QueuedTask

    path = "testproject.lab.tasks.noop"
    before = timezone.now() - timedelta(seconds=1)
    if way == "fabrika":
        QueuedTask.objects.bulk_create(
            [QueuedTask(task_path=path, backend="default", queue_name="default", due=before) for _ in range(count)],
            batch_size=2000,
        )
        _analyze(QueuedTask)
        worker = _start("fabrika_job", "worker", "--only", "tasks.default.default")
        try:
            _wait_for_output(worker, "Worker started")
            kick("tasks.default.default")
            _wait(lambda: not QueuedTask.objects.filter(status__in=["READY", "RUNNING"]).exists(), 600)
        finally:
            worker.kill()
            worker.wait()
        done = QueuedTask.objects.filter(status="SUCCESSFUL")
    else:
        DBTaskResult.objects.bulk_create(
            [
                DBTaskResult(
                    task_path=path,
                    backend_name="db",
                    queue_name="default",
                    args_kwargs={"args": [], "kwargs": {}},
                    run_after=before,
                )
                for _ in range(count)
            ],
            batch_size=2000,
        )
        _analyze(DBTaskResult)
        worker = _start("db_worker", "--batch", "--interval", "0", "--no-startup-delay", "--backend", "db")
        worker.wait(2400)
        done = DBTaskResult.objects.filter(status="SUCCESSFUL")
    assert done.count() == count, f"{way}: {done.count()} of {count} tasks succeeded"
    first = min(done.values_list("started_at", flat=True))
    last = max(done.values_list("finished_at", flat=True))
    _clear_tables()
    return count / (last - first).total_seconds()


def _analyze(model) -> None:
    """Give the planner the table's new size, as autovacuum soon would: else a claim sorts the whole table."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")


# -- 3. latency ---------------------------------------------------------------------------------------------


def _latency(way: str, count: int) -> list[float]:
    from django_tasks_db.models import DBTaskResult

    from fabrika_django.models import QueuedTask
    from testproject.lab.tasks import noop

    idle = 0.02
    if way == "floor":
        worker = _start_floor_listener()
        task, rows, key = _FloorEnqueue(), QueuedTask.objects, "result_id"
    elif way == "fabrika":
        worker = _start("fabrika_job", "worker", "--only", "tasks.default.default")
        _wait_for_output(worker, "Worker started")
        task, rows, key = noop, QueuedTask.objects, "result_id"
    else:
        worker = _start("db_worker", "--interval", "0.1", "--no-startup-delay", "--backend", "db")
        _wait_for_output(worker, "Starting worker")
        task, rows, key = noop.using(backend="db"), DBTaskResult.objects, "id"
        idle = 0.1  # its poll interval: enqueues land at random points of it
    seen = []
    try:
        for n in range(count + 10):
            time.sleep(random.uniform(0, idle))
            began = time.time()
            result = task.enqueue()
            time.sleep(0.015)
            started = _wait(
                lambda result=result: (
                    rows.filter(**{key: result.id}, status="SUCCESSFUL").values_list("started_at", flat=True).first()
                ),
                30,
            )
            if n >= 10:  # the first ones warm the worker's connections up
                seen.append(started.timestamp() - began)
    finally:
        worker.kill()
        worker.wait()
    _clear_tables()
    return seen


class _FloorEnqueue:
    """The floor's enqueue: fabrika's own one statement (row, kick, NOTIFY), prepared, from plain psycopg."""

    def __init__(self) -> None:
        import psycopg
        from django.db import connection

        from fabrika_django._task_rows import _insert_statement
        from fabrika_django.models import QueuedTask

        insert = _insert_statement("default", True)
        row = QueuedTask(task_path="testproject.lab.tasks.noop", backend="default", queue_name="default")
        given = [*insert.of_task, *insert.of_call]  # the other columns' values are in the statement's text
        values = {name: field.get_db_prep_save(field.pre_save(row, True), connection) for name, field in given}
        self._result_key = next(name for name, field in given if field.attname == "result_id")
        self._params = {**values, "name": "floor", "channel": _FLOOR_CHANNEL}
        self._sql = insert.sql
        self._conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, prepare_threshold=0)

    def enqueue(self):
        import uuid

        result_id = uuid.uuid4()
        self._conn.execute(self._sql, {**self._params, self._result_key: result_id})
        return type("Result", (), {"id": result_id})


_FLOOR_CHANNEL = "fabrika_bench_floor"


def _start_floor_listener() -> subprocess.Popen[bytes]:
    process = _start_python("-m", "bench.tasks", "--child", "floor-listener", "--postgres", os.environ["DATABASE_URL"])
    _wait_for_output(process, "listening")
    return process


def _floor_listener(url: str) -> int:
    """The floor's worker: LISTEN; on a NOTIFY, start the oldest ready task in one prepared statement, noting the
    server's clock as its ``started_at``; then (not measured) mark it done."""
    import psycopg

    listen = psycopg.connect(url, autocommit=True)
    listen.execute(f"LISTEN {_FLOOR_CHANNEL}")
    starter = psycopg.connect(url, autocommit=True, prepare_threshold=0)
    table = '"fabrika_django_queuedtask"'
    start = (
        f"UPDATE {table} SET status = 'RUNNING', started_at = clock_timestamp(), attempts = attempts + 1 "  # noqa: S608
        f"WHERE id = (SELECT id FROM {table} WHERE backend = 'default' AND queue_name = 'default' "
        "AND status = 'READY' ORDER BY priority DESC, due, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id"
    )
    done = f"UPDATE {table} SET status = 'SUCCESSFUL', finished_at = now() WHERE id = %s"  # noqa: S608
    sys.stdout.write("listening\n")
    sys.stdout.flush()
    for _note in listen.notifies():
        started = starter.execute(start).fetchone()
        if started is not None:
            starter.execute(done, [started[0]])
    return 0


# -- helpers ------------------------------------------------------------------------------------------------


def _start(*command: str) -> subprocess.Popen[bytes]:
    """Start ``manage.py COMMAND`` with its output in a file (a full pipe would stall it)."""
    return _start_python(str(ROOT / "manage.py"), *command)


def _start_python(*arguments: str) -> subprocess.Popen[bytes]:
    log = tempfile.NamedTemporaryFile("w+", prefix="fabrika-bench-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, *arguments],
        cwd=ROOT,
        env=dict(os.environ, DEBUG="0", FABRIKA_LOG_LEVEL="INFO"),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    process.log_name = log.name  # type: ignore[attr-defined]
    return process


def _wait_for_output(process: subprocess.Popen[bytes], text: str) -> None:
    def said() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the worker ended before saying {text!r}")
        return text in Path(process.log_name).read_text()  # type: ignore[attr-defined]

    _wait(said, 60)


def _wait(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("the bench waited too long")
        time.sleep(0.005)  # a poll often takes CPU from the worker on a small machine


if __name__ == "__main__":
    sys.exit(main())
