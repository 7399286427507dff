"""Commit-to-start latency of a kicked job, with a worker idle: LISTEN/NOTIFY on PostgreSQL, and polling.

    .venv/bin/python bench/kick_latency.py [--kicks 500] [--postgres URL] [--mariadb URL] [--poll-interval 0.1]

For each mode it makes a fresh database, starts ``manage.py fabrika_job worker --only lab_stamp``, then
``--kicks`` times: commits a row with a kick inside the transaction, waits until the run ended and the
worker is idle again, and idles a random part of a poll interval. The lab job ``lab_stamp`` notes
``time.time()`` as its handler starts; the latency is that minus the moment the commit returned (so it
includes the kick's statement after the commit, not the commit itself).
Polling runs on SQLite and on MariaDB, where a worker has no other way to hear of a kick.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kicks", type=int, default=500)
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432/fabrika_bench")
    parser.add_argument("--mariadb", default="mysql://root@127.0.0.1:3306/fabrika_bench")
    parser.add_argument("--poll-interval", type=float, default=0.1)
    parser.add_argument("--only", choices=("listen", "floor", "poll", "poll-mariadb"), help="run one mode")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "floor":
        return _floor_child(args.kicks, args.poll_interval)
    if args.child == "floor-listener":
        return _floor_listener()
    if args.child:
        return _child(args.child, args.kicks, args.poll_interval)
    sqlite = os.path.join(tempfile.gettempdir(), f"fabrika-bench-{os.getpid()}.sqlite3")
    modes = [
        ("listen", "PostgreSQL, LISTEN/NOTIFY", args.postgres, {}),
        ("floor", "PostgreSQL alone (the floor)", args.postgres, {}),
        (
            "poll",
            f"SQLite, polling every {args.poll_interval * 1000:.0f} ms",
            f"sqlite:///{sqlite}",
            {"FABRIKA_POLL_INTERVAL": str(args.poll_interval)},
        ),
        (
            "poll-mariadb",
            f"MariaDB, polling every {args.poll_interval * 1000:.0f} ms",
            args.mariadb,
            {"FABRIKA_POLL_INTERVAL": str(args.poll_interval)},
        ),
    ]
    results: dict[str, tuple[float, float, float]] = {}
    for mode, title, url, extra in modes:
        if args.only and mode != args.only:
            continue
        # Idle a random part of a poll interval before each kick, so kicks fall at every phase of the
        # worker's polling (right after a run ends the worker has just looked; a kick then waits longest).
        idle = args.poll_interval if mode.startswith("poll") else 0.02
        env = dict(os.environ, DATABASE_URL=url, FABRIKA_LAB="1", DJANGO_SETTINGS_MODULE="testproject.settings")
        env.update(extra)
        env.setdefault("FABRIKA_LOG_LEVEL", "WARNING")
        out = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--kicks", str(args.kicks), "--poll-interval", str(idle)],
            env=env,
            cwd=ROOT,
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout
        latencies = json.loads(out.strip().splitlines()[-1])
        results[mode] = _report(title, latencies)
    if "listen" in results and "floor" in results:
        ours, floor = results["listen"], results["floor"]
        sys.stdout.write(
            "floor / ours: "
            + "  ".join(f"{name} {floor[i] / ours[i]:.0%}" for i, name in enumerate(("p50", "p95", "p99")))
            + "\n"
        )
    if os.path.exists(sqlite):
        os.unlink(sqlite)
    return 0


def _report(title: str, latencies: list[float]) -> tuple[float, float, float]:
    ms = sorted(value * 1000 for value in latencies)
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    sys.stdout.write(
        f"{title}: {len(ms)} kicks  p50 {cuts[49]:.2f} ms  p95 {cuts[94]:.2f} ms  p99 {cuts[98]:.2f} ms  "
        f"max {ms[-1]:.2f} ms\n"
    )
    return cuts[49], cuts[94], cuts[98]


def _fresh_database(url: str) -> None:
    if url.startswith("mysql"):
        _fresh_mariadb(url)
    if not url.startswith("postgres"):
        return
    import psycopg

    name = url.rsplit("/", 1)[1].split("?")[0]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')


def _fresh_mariadb(url: str) -> None:
    from urllib.parse import urlsplit

    import MySQLdb

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = MySQLdb.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
    )
    try:
        cursor = admin.cursor()
        cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cursor.execute(f"CREATE DATABASE `{name}`")
    finally:
        admin.close()


def _child(mode: str, kicks: int, idle: float) -> int:
    _fresh_database(os.environ["DATABASE_URL"])
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from fabrika_django import kick
    from fabrika_django.models import Lease
    from testproject.lab.models import Mark

    call_command("migrate", verbosity=0)
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "fabrika_job", "worker", "--only", "lab_stamp", "-v", "0"],
        cwd=ROOT,
    )
    # Stratified phases: one kick in each equal slice of the idle interval, in random order. Kicks still fall
    # at every phase of the worker's polling, evenly, without the median of a plain random draw wandering by
    # a couple of milliseconds from run to run.
    phases = [(slot + random.random()) / (WARMUP + kicks) for slot in range(WARMUP + kicks)]
    random.shuffle(phases)
    try:
        latencies = []
        for number in range(WARMUP + kicks):
            last = Mark.objects.filter(job="lab_stamp").order_by("-pk").values_list("pk", flat=True).first() or 0
            committed = []
            with transaction.atomic():
                Mark.objects.create(job="bench", note=str(number))
                # Hooks run in the order they were added: this one notes the moment the commit returned,
                # just before the kick's own statement.
                transaction.on_commit(lambda noted=committed: noted.append(time.time()))
                kick("lab_stamp")
            stamp = _wait_for_stamp(Mark, last, worker)
            _wait_idle(Lease)
            time.sleep(phases[number] * idle)
            if number >= WARMUP:
                latencies.append(stamp - committed[0])
        sys.stdout.write(json.dumps(latencies) + "\n")
    finally:
        worker.terminate()
        worker.wait(30)
        connection.close()
    return 0


def _wait_for_stamp(mark_model, last: int, worker: subprocess.Popen) -> float:
    deadline = time.monotonic() + 30
    # Look only after the run surely began: a client polling meanwhile would take the CPU (two cores here)
    # from the very start it measures.
    time.sleep(0.015)
    while True:
        note = mark_model.objects.filter(job="lab_stamp", pk__gt=last).values_list("note", flat=True).first()
        if note is not None:
            return float(note)
        if worker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"The worker did not run lab_stamp (exit code {worker.poll()}).")
        time.sleep(0.003)


def _wait_idle(lease_model) -> None:
    while lease_model.objects.filter(job="lab_stamp", token__isnull=False).exists():
        time.sleep(0.003)
    time.sleep(0.01)


def _floor_child(kicks: int, idle: float) -> int:
    """The same two statements with nothing around them: plain psycopg, one process that only listens.

    The client commits a row, then runs the kick's statement in autocommit; the listener, on hearing it,
    runs the worker's one-statement start and notes the time, then frees the lease for the next kick.
    Both statements are prepared, as fabrika prepares them (``fabrika_django._sql.prepared``).
    """
    _fresh_database(os.environ["DATABASE_URL"])
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    import psycopg
    from django.core.management import call_command
    from django.db import connection

    from fabrika_django._sql.runs import kick as make_kick_sql
    from fabrika_django.kicks import CHANNEL
    from fabrika_django.runner import sync_jobs

    call_command("migrate", verbosity=0)
    sync_jobs(["lab_stamp"])
    kick_sql = make_kick_sql(connection)
    connection.close()
    listener = subprocess.Popen(
        [sys.executable, __file__, "--child", "floor-listener"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert listener.stdout is not None and listener.stdin is not None
    listener.stdout.readline()  # "listening"
    url = os.environ["DATABASE_URL"]
    try:
        # Server-side binding and prepared statements: the least work the database can be asked to do.
        # Autocommit: the row's statement commits alone, and the kick's too (as fabrika's, after the commit).
        with psycopg.connect(url, autocommit=True, prepare_threshold=0).cursor() as client:
            latencies = []
            for number in range(WARMUP + kicks):
                client.execute(
                    "INSERT INTO lab_mark (job, note, pid, attempt, at) VALUES ('bench', %s, 0, 1, now())", [number]
                )
                committed = time.time()
                client.execute(kick_sql, {"name": "lab_stamp", "channel": CHANNEL})
                stamp = float(listener.stdout.readline())
                time.sleep(random.uniform(0, idle))
                if number >= WARMUP:
                    latencies.append(stamp - committed)
        sys.stdout.write(json.dumps(latencies) + "\n")
    finally:
        listener.terminate()
        listener.wait(30)
    return 0


def _floor_listener() -> int:
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()

    import psycopg
    from django.db import connection

    from fabrika_django._runs.start import Start
    from fabrika_django._sql.runs import free_lease_start as free_lease_start_sql
    from fabrika_django.kicks import CHANNEL

    start_sql = free_lease_start_sql(connection, require_pending=True)
    url = os.environ["DATABASE_URL"]
    listen = psycopg.connect(url, autocommit=True)
    listen.execute(f"LISTEN {CHANNEL}")
    starter = psycopg.connect(url, autocommit=True, prepare_threshold=0).cursor()
    sys.stdout.write("listening\n")
    sys.stdout.flush()
    while True:
        for note in listen.notifies():
            start = Start(job=note.payload, trigger="kick", holder="floor", seconds=30, max_attempt=1)
            starter.execute(start_sql, start.params())
            started = time.time()
            attempt = starter.fetchone()[0]
            starter.execute(
                "UPDATE fabrika_django_lease SET token = NULL, run_id = NULL, attempt = 0, expires = NULL "
                "WHERE job = %s",
                [note.payload],
            )
            starter.execute("UPDATE fabrika_django_attempt SET outcome = 'succeeded' WHERE id = %s", [attempt])
            sys.stdout.write(f"{started:.6f}\n")
            sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
