"""Benchmark claim and finish against each database's own limit: ``python -m bench.claim``.

Patterns, each from a freshly filled table of ``--rows`` due rows (see bench/README.md):
  per_row  the seed's recipe: claim 50, finish each row in its own transaction
  batch    claim 500, finish them all in one transaction (finish_all: one UPDATE)
On PostgreSQL each is measured five ways (per_row six): "pgbench" (the same SQL from C, the database's own limit),
"pgbench_fenced" (the same, each finishing transaction's BEGIN carrying the fence's lock and token check as the
job way's does: the job way's own limit), "pgbench_prepared" (per_row only, the one-statement limit: ``-M
prepared``, the claim and its lease in one statement, then each row's finish one autocommit statement, ``UPDATE ...
WHERE id AND version``: the finish as one round trip), "psycopg" (plain psycopg 3), "direct" (our claim/finish inside an
active run, a plain transaction.atomic() per finish), and "job" (a registered @cron job run by
fabrika_django.runner.run, finishing inside the lease-fenced ctx.transaction()).
On MariaDB (``--mariadb-url``) three: "mysqlclient" (the same SQL from the plain C-backed driver: the limit),
"direct" and "job".
Every Python measurement runs in a child process of its own, so its peak RSS is its own.

``--scale``: claim(50)'s p50 as dead rows pile up (0, 100,000, 1,000,000 beside 20,000 due rows) and as the
table grows (100,000 and 5,000,000 rows, 1 % of them due), with the claim's EXPLAIN (ANALYZE, BUFFERS).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/fabrika_bench"
DEFAULT_MARIADB_URL = "mysql://root@127.0.0.1:3306/fabrika_bench_claim"
WAYS = ("pgbench", "pgbench_fenced", "pgbench_prepared", "psycopg", "direct", "job")
LIMIT_WAYS = ("pgbench", "pgbench_fenced", "pgbench_prepared")  # run by pgbench, not by a Python child
PER_ROW_ONLY = ("pgbench_prepared",)  # the one-statement limit is of the per-row recipe
MARIADB_WAYS = ("mysqlclient", "direct", "job")
PATTERNS = {"per_row": 50, "batch": 500}  # claim limit of each pattern
TABLE = "lab_item"
LEASE_TABLE = "fabrika_django_lease"
FENCED_JOB = "bench_pgbench_fenced"  # the lease row pgbench_fenced's fence statements name
FENCE_LOCK_CLASS = 0x66616272  # fence_sql.FENCE_LOCK_CLASS (this process does not set Django up)
MAX_ATTEMPTS = 10  # lab.Item declares no Queue options


# --- child side: our code ---------------------------------------------------------------------------------


def _setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("FABRIKA_LAB", "1")  # lab.Item is the benched queue table
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("FABRIKA_LOG_LEVEL", "WARNING")
    os.environ["DEBUG"] = "0"  # as in production: DEBUG keeps every statement in connection.queries
    import django

    django.setup()


def _drain(pattern: str, drain: int, finish_batch, clock=time.perf_counter) -> dict:
    """Claim and finish ``drain`` rows the pattern's way; answer its latencies (seconds)."""
    from testproject.lab.models import Item

    limit = PATTERNS[pattern]
    batches, finishes, claims = [], [], []
    done = 0
    started = clock()
    while done < drain:
        t0 = clock()
        rows = Item.objects.claim(limit=min(limit, drain - done))
        t1 = clock()
        if not rows:
            raise SystemExit(f"the table ran out of due rows after {done}: fill more (--rows)")
        finishes.extend(finish_batch(rows))
        batches.append(clock() - t0)
        claims.append(t1 - t0)
        done += len(rows)
    return {"rows": done, "elapsed": clock() - started, "batches": batches, "finishes": finishes, "claims": claims}


def _finisher(pattern: str, transaction_of):
    """Return the function that finishes one claimed batch, timing each finish transaction."""
    from testproject.lab.models import Item

    def per_row(rows):
        latencies = []
        for row in rows:
            t0 = time.perf_counter()
            with transaction_of():
                row.finish(writes=1)
            latencies.append(time.perf_counter() - t0)
        return latencies

    def batch(rows):
        t0 = time.perf_counter()
        with transaction_of():
            conflicts = Item.objects.finish_all(rows, writes=1)
        if conflicts:
            raise SystemExit(f"{len(conflicts)} rows changed during the bench: nothing else may use {TABLE}")
        return [time.perf_counter() - t0]

    return per_row if pattern == "per_row" else batch


def _child_direct(pattern: str, drain: int) -> dict:
    from django.db import transaction

    from fabrika_django._running import ActiveRun, running
    from fabrika_django.jobs import CronJob
    from fabrika_django.schedule import Schedule

    job = CronJob(name="bench_direct", func=lambda ctx: None, schedule=Schedule("*/5 * * * *"))
    with running(ActiveRun(job=job)):
        return _drain(pattern, drain, _finisher(pattern, transaction.atomic))


def _child_job(pattern: str, drain: int) -> dict:
    from fabrika_django import cron
    from fabrika_django._handlers import handler_threads
    from fabrika_django.runner import run

    answer: dict = {}

    @cron("*/5 * * * *", name=f"bench_{pattern}", timeout=timedelta(hours=1))
    def bench_job(ctx):
        answer.update(_drain(pattern, drain, _finisher(pattern, ctx.transaction)))

    t0 = time.perf_counter()
    result = run(bench_job)
    whole = time.perf_counter() - t0
    handler_threads.drain()
    if not result.ok:
        raise SystemExit(f"the bench job ended {result.outcome}")
    answer["run_elapsed"] = whole  # with the run's own start and end (lease, history)
    return answer


def _child_psycopg(pattern: str, drain: int, url: str) -> dict:
    """The same statements from plain psycopg (client-side binding, as Django): Python's own floor."""
    import psycopg

    limit = PATTERNS[pattern]
    conn = psycopg.connect(_psql_url(url), cursor_factory=psycopg.ClientCursor)
    claim_sql = (
        f"SELECT id, n, writes, attempts, version, last_failure FROM {TABLE} WHERE due IS NOT NULL "
        f"AND attempts < {MAX_ATTEMPTS} AND due <= %s ORDER BY due, id LIMIT %s FOR UPDATE OF {TABLE} SKIP LOCKED"
    )
    lease_sql = f"UPDATE {TABLE} SET attempts = attempts + 1, version = version + 1, due = %s WHERE id = ANY(%s)"
    batches, finishes, done = [], [], 0
    started = time.perf_counter()
    while done < drain:
        t0 = time.perf_counter()
        now = datetime.now(UTC)
        with conn.transaction():
            rows = conn.execute(claim_sql, [now, min(limit, drain - done)]).fetchall()
            conn.execute(lease_sql, [now + timedelta(minutes=5), [row[0] for row in rows]])
        if pattern == "per_row":
            for row in rows:
                t1 = time.perf_counter()
                with conn.transaction():
                    conn.execute(
                        f"UPDATE {TABLE} SET writes = %s, due = %s, version = %s WHERE id = %s AND version = %s",
                        [1, None, row[4] + 2, row[0], row[4] + 1],
                    )
                finishes.append(time.perf_counter() - t1)
        else:
            t1 = time.perf_counter()
            with conn.transaction():
                conn.execute(
                    f"UPDATE {TABLE} SET writes = %s, due = %s, version = version + 1 "
                    "WHERE version = %s AND id = ANY(%s) RETURNING id",
                    [1, None, rows[0][4] + 1, [row[0] for row in rows]],
                ).fetchall()
            finishes.append(time.perf_counter() - t1)
        batches.append(time.perf_counter() - t0)
        done += len(rows)
    conn.close()
    return {"rows": done, "elapsed": time.perf_counter() - started, "batches": batches, "finishes": finishes}


def _mysql_connect(url: str, *, database: bool = True):
    from urllib.parse import urlsplit

    import MySQLdb

    parts = urlsplit(url)
    options = {"host": parts.hostname or "127.0.0.1", "port": parts.port or 3306, "user": parts.username or "root"}
    options["password"] = parts.password or ""
    if database:
        options["database"] = parts.path.lstrip("/")
    return MySQLdb.connect(**options)


def _child_mysqlclient(pattern: str, drain: int, url: str) -> dict:
    """Our statements on MariaDB from plain mysqlclient, at Django's isolation level: the database's limit."""
    conn = _mysql_connect(url)
    cursor = conn.cursor()
    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")  # Django's on MySQL
    conn.autocommit(False)
    index = _mariadb_due_index(cursor)
    limit = PATTERNS[pattern]
    claim_sql = (
        f"SELECT id, n, writes, attempts, version, last_failure FROM {TABLE} FORCE INDEX (`{index}`) "
        f"WHERE due IS NOT NULL AND attempts < {MAX_ATTEMPTS} AND due <= %s ORDER BY due, id LIMIT %s "
        "FOR UPDATE SKIP LOCKED"
    )

    def listed(ids):
        return ", ".join(["%s"] * len(ids))

    batches, finishes, done = [], [], 0
    started = time.perf_counter()
    while done < drain:
        t0 = time.perf_counter()
        now = datetime.now(UTC).replace(tzinfo=None)  # Django keeps UTC without a zone on MySQL
        cursor.execute(claim_sql, [now, min(limit, drain - done)])
        rows = cursor.fetchall()
        ids = [row[0] for row in rows]
        cursor.execute(
            f"UPDATE {TABLE} SET due = %s, attempts = attempts + 1, version = version + 1 WHERE id IN ({listed(ids)})",
            [now + timedelta(minutes=5), *ids],
        )
        conn.commit()
        if pattern == "per_row":
            for row in rows:
                t1 = time.perf_counter()
                cursor.execute(
                    f"UPDATE {TABLE} SET writes = %s, due = %s, version = %s WHERE id = %s AND version = %s",
                    [1, None, row[4] + 2, row[0], row[4] + 1],
                )
                conn.commit()
                finishes.append(time.perf_counter() - t1)
        else:
            t1 = time.perf_counter()
            lock_sql = f"SELECT id FROM {TABLE} WHERE version = %s AND id IN ({listed(ids)}) FOR UPDATE"
            cursor.execute(lock_sql, [rows[0][4] + 1, *ids])
            locked = [row[0] for row in cursor.fetchall()]
            cursor.execute(
                f"UPDATE {TABLE} SET writes = %s, due = %s, version = version + 1 WHERE id IN ({listed(locked)})",
                [1, None, *locked],
            )
            conn.commit()
            finishes.append(time.perf_counter() - t1)
        batches.append(time.perf_counter() - t0)
        done += len(rows)
    conn.close()
    return {"rows": done, "elapsed": time.perf_counter() - started, "batches": batches, "finishes": finishes}


def _mariadb_due_index(cursor) -> str:
    cursor.execute(
        "SELECT index_name FROM information_schema.statistics WHERE table_schema = DATABASE() "
        "AND table_name = %s AND column_name = 'due' AND seq_in_index = 1",
        [TABLE],
    )
    return cursor.fetchone()[0]


# --- claim at scale (--scale) -------------------------------------------------------------------------------

# name: (due rows, dead rows, done rows). Dead rows are older than every due row (they were due first and
# failed), so an index that held them would make each claim walk past all of them; 1 % due rows are spread
# over the table (every 100th row), so each claimed row is on a heap page of its own at every size.
SCALES = {
    "dead 0": (20_000, 0, 0),
    "dead 100k": (20_000, 100_000, 0),
    "dead 1M": (20_000, 1_000_000, 0),
    "100k, 1% due": (1_000, 0, 99_000),
    "5M, 1% due": (50_000, 0, 4_950_000),
}
SCALE_TARGETS = {"dead 100k": ("dead 0", 1.2), "dead 1M": ("dead 0", 1.2), "5M, 1% due": ("100k, 1% due", 1.3)}
SCALE_ROUNDS, SCALE_CLAIMS = 10, 20  # claims timed per round; the claimed rows are made due again between rounds
SCALE_EXPLAINS = 21


def _child_scale() -> dict:
    """Time claim(limit=50) in rounds; between rounds put the claimed rows back as they were and VACUUM."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from fabrika_django._running import ActiveRun, running
    from fabrika_django.jobs import CronJob
    from fabrika_django.schedule import Schedule
    from testproject.lab.models import Item

    job = CronJob(name="bench_scale", func=lambda ctx: None, schedule=Schedule("*/5 * * * *"))
    claims: list[float] = []
    with running(ActiveRun(job=job)):
        for _round in range(SCALE_ROUNDS):
            claimed: list[int] = []
            for _claim in range(SCALE_CLAIMS):
                t0 = time.perf_counter()
                rows = Item.objects.claim(limit=50)
                claims.append(time.perf_counter() - t0)
                if len(rows) != 50:
                    raise SystemExit(f"a claim found {len(rows)} due rows, not 50: the table is too small")
                claimed += [row.pk for row in rows]
            _unclaim(connection, claimed)
        with CaptureQueriesContext(connection) as queries:
            Item.objects.claim(limit=50)
        # A plain claim on PostgreSQL is one prepared statement (its locking read in a WITH, with the lease's
        # UPDATE), run by EXECUTE, which EXPLAIN takes as it is; elsewhere the claim's locking SELECT.
        (select,) = [query["sql"] for query in queries if query["sql"].startswith(("SELECT", "EXECUTE"))]
        _unclaim(connection, [])
        # The server's own time for the claim's SELECT (the part dead rows and table size could change), free of
        # the client's noise: EXPLAIN ANALYZE of it, each in a transaction rolled back (its locks only).
        executions = []
        for _explain in range(SCALE_EXPLAINS):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {select}")
                plan = [row[0] for row in cursor.fetchall()]
                transaction.set_rollback(True)
            executions += [float(line.split()[-2]) / 1000 for line in plan if line.startswith("Execution Time")]
    return {"claims": claims, "executions": executions, "plan": plan}


def _unclaim(connection, pks: list[int]) -> None:
    """Make claimed rows due again as the fill made them (by n), then VACUUM away the versions claims left."""
    with connection.cursor() as cursor:
        if pks:
            cursor.execute(
                f"UPDATE {TABLE} SET attempts = 0, version = 0, "
                "due = now() - interval '1 hour' + n * interval '1 millisecond' WHERE id = ANY(%s)",
                [pks],
            )
        else:  # after the EXPLAIN's claim: whatever was claimed last
            cursor.execute(
                f"UPDATE {TABLE} SET attempts = 0, version = 0, "
                "due = now() - interval '1 hour' + n * interval '1 millisecond' WHERE attempts = 1"
            )
        cursor.execute(f"VACUUM {TABLE}")


def _fill_scale(url: str, due: int, dead: int, done: int) -> float:
    """Fill the table with ``dead`` old dead rows, then due and done rows mixed (every 100th due at 1 %).

    Answers the seconds the fill took (INSERT ... SELECT generate_series, then VACUUM ANALYZE).
    """
    import psycopg

    t0 = time.perf_counter()
    with psycopg.connect(_psql_url(url), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE}")
        if dead:
            conn.execute(
                f"INSERT INTO {TABLE} (n, writes, attempts, due, version, last_failure) "
                f"SELECT 100000000 + g, 0, {MAX_ATTEMPTS}, now() - interval '2 days' + g * interval '1 millisecond', "
                f"{MAX_ATTEMPTS}, 'bench' FROM generate_series(1, %s) AS g",
                [dead],
            )
        every = (due + done) // due
        conn.execute(
            f"INSERT INTO {TABLE} (n, writes, attempts, due, version, last_failure) "
            "SELECT g, 0, 0, CASE WHEN mod(g, %s) = 0 "
            "THEN now() - interval '1 hour' + g * interval '1 millisecond' END, 0, '' FROM generate_series(1, %s) AS g",
            [every, due + done],
        )
        conn.execute(f"VACUUM ANALYZE {TABLE}")
    return time.perf_counter() - t0


def _p50_ms(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] * 1000


def _scale(args) -> None:
    """Fill each SCALES table, time claim(50) on it in a child, print p50s, ratios and each claim's plan."""
    url = args.database_url
    _migrate(url)
    found = {}
    for name, (due, dead, done) in SCALES.items():
        if args.scales and name not in args.scales.split(","):
            continue
        filled = _fill_scale(url, due, dead, done)
        print(f"# {name}: filled {due + dead + done} rows in {filled:.0f} s", file=sys.stderr)
        argv = [sys.executable, "-m", "bench.claim", "--child", "scale", "--database-url", url]
        run = subprocess.run(argv, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
        if run.returncode:
            raise SystemExit(f"scale {name} failed: {run.stderr.strip()[-2000:]}")
        found[name] = json.loads(run.stdout)
    print(f"== claim(limit=50) at scale: {SCALE_ROUNDS * SCALE_CLAIMS} claims a table (client: claim() whole, ms), ")
    print(f"   and {SCALE_EXPLAINS} EXPLAIN ANALYZE of its SELECT (server: Execution Time, ms); ratios of the p50s")
    columns = f"{'table':14} {'due':>7} {'dead':>9} {'done':>9} {'client p50/p95':>15} {'server p50':>10}"
    print(f"{columns} {'ratio c/s':>11}  target")
    for name, figures in found.items():
        due, dead, done = SCALES[name]
        p50, server = _p50_ms(figures["claims"]), _p50_ms(figures["executions"])
        base, target = SCALE_TARGETS.get(name, (None, None))
        ratio, verdict = "", ""
        if base in found:
            client_ratio = p50 / _p50_ms(found[base]["claims"])
            server_ratio = server / _p50_ms(found[base]["executions"])
            ratio = f"{client_ratio:.2f}/{server_ratio:.2f}"
            verdict = f"<= {target}x of '{base}': {'meets' if client_ratio <= target else 'MISSES'}"
        client = f"{p50:.2f}/{_ms(figures['claims'], 0.95)}"
        print(f"{name:14} {due:>7} {dead:>9} {done:>9} {client:>15} {server:>10.3f} {ratio:>11}  {verdict}")
    for name, figures in found.items():
        print(f"\n-- {name}: EXPLAIN (ANALYZE, BUFFERS) of the claim's SELECT")
        print("\n".join(figures["plan"]))


def _child_profile(drain: int) -> dict:
    """The job way's per_row pattern under cProfile: where a claimed batch and its finishes spend the CPU."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    answer: dict = {}

    def profiled(rows, finish=None):
        profile.enable()
        try:
            return finish(rows)
        finally:
            profile.disable()

    from fabrika_django import cron
    from fabrika_django._handlers import handler_threads
    from fabrika_django.runner import run

    @cron("*/5 * * * *", name="bench_profile", timeout=timedelta(hours=1))
    def bench_job(ctx):
        finish = _finisher("per_row", ctx.transaction)
        from testproject.lab.models import Item

        claim = Item.objects.claim

        def claimed(limit):  # the claim profiled too
            profile.enable()
            try:
                return claim(limit=limit)
            finally:
                profile.disable()

        Item.objects.claim = claimed  # type: ignore[method-assign]
        try:
            answer.update(_drain("per_row", drain, lambda rows: profiled(rows, finish)))
        finally:
            del Item.objects.claim

    result = run(bench_job)
    handler_threads.drain()
    if not result.ok:
        raise SystemExit(f"the profiled job ended {result.outcome}")
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    return {"rows": answer["rows"], "elapsed": answer["elapsed"], "profile": out.getvalue()}


def _peak_rss_kb(pid: int | str) -> int:
    """Return a process's peak RSS since its exec (VmHWM; getrusage would count the forked parent's pages)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # the process just ended
        return 0
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


def _child(args) -> None:
    if args.child == "profile":
        _setup_django(args.database_url)
        answer = _child_profile(args.drain)
        print(f"{answer['rows']} rows in {answer['elapsed']:.2f} s under cProfile\n{answer['profile']}")
        return
    if args.child == "scale":
        _setup_django(args.database_url)
        json.dump(_child_scale(), sys.stdout)
        return
    if args.child == "psycopg":
        answer = _child_psycopg(args.pattern, args.drain, args.database_url)
    elif args.child == "mysqlclient":
        answer = _child_mysqlclient(args.pattern, args.drain, args.database_url)
    else:
        _setup_django(args.database_url)
        measure = _child_direct if args.child == "direct" else _child_job
        answer = measure(args.pattern, args.drain)
    answer["peak_rss_kb"] = _peak_rss_kb("self")
    json.dump(answer, sys.stdout)


# --- parent side: the table, pgbench, the report ------------------------------------------------------------


def _psql_url(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


def _ensure_database(url: str) -> None:
    if url.startswith("mysql"):
        name = url.rsplit("/", 1)[1].split("?")[0]
        conn = _mysql_connect(url, database=False)
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}`")
        conn.close()
        return
    import psycopg

    name = url.rsplit("/", 1)[1].split("?")[0]
    with psycopg.connect(_psql_url(url.rsplit("/", 1)[0] + "/postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')


def _fill(url: str, rows: int) -> None:
    """Make ``rows`` due rows, oldest first, in a table vacuumed and analysed as a running one would be."""
    if url.startswith("mysql"):
        conn = _mysql_connect(url)
        cursor = conn.cursor()
        cursor.execute(f"TRUNCATE {TABLE}")
        cursor.execute("SELECT VERSION()")
        depth = "max_recursive_iterations" if "MariaDB" in cursor.fetchone()[0] else "cte_max_recursion_depth"
        cursor.execute(f"SET SESSION {depth} = %s", [rows + 1])
        cursor.execute(
            f"INSERT INTO {TABLE} (n, writes, attempts, due, version, last_failure) "
            "WITH RECURSIVE g (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %s) "
            "SELECT n, 0, 0, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR + INTERVAL n * 1000 MICROSECOND, 0, '' FROM g",
            [rows],
        )
        conn.commit()
        cursor.execute(f"ANALYZE TABLE {TABLE}")
        cursor.fetchall()
        conn.close()
        return
    import psycopg

    with psycopg.connect(_psql_url(url), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE}")
        conn.execute(
            f"INSERT INTO {TABLE} (n, writes, attempts, due, version, last_failure) "
            "SELECT g, 0, 0, now() - interval '1 hour' + g * interval '1 millisecond', 0, '' "
            "FROM generate_series(1, %s) AS g",
            [rows],
        )
        conn.execute(f"VACUUM ANALYZE {TABLE}")


def _check_drained(url: str, drain: int) -> None:
    """Fail the bench unless exactly ``drain`` rows were finished, each once."""
    if url.startswith("mysql"):
        conn = _mysql_connect(url)
        cursor = conn.cursor()
        cursor.execute(
            f"SELECT count(*), coalesce(sum(writes), 0), coalesce(sum(version = 2), 0) FROM {TABLE} WHERE due IS NULL"
        )
        done, writes, versions = (int(value) for value in cursor.fetchone())
        conn.close()
    else:
        import psycopg

        with psycopg.connect(_psql_url(url)) as conn:
            done, writes, versions = conn.execute(
                f"SELECT count(*), coalesce(sum(writes), 0), count(*) FILTER (WHERE version = 2) "
                f"FROM {TABLE} WHERE due IS NULL"
            ).fetchone()
    if not done == writes == versions == drain:
        raise SystemExit(f"expected {drain} rows finished once, found done={done} writes={writes} v2={versions}")


_CLAIMED = (
    f"SELECT id, due, version FROM {TABLE} WHERE due IS NOT NULL AND attempts < {MAX_ATTEMPTS} AND due <= now() "
    f"ORDER BY due, id LIMIT {{limit}} FOR UPDATE OF {TABLE} SKIP LOCKED"
)


def _pgbench_script(pattern: str, fence: tuple[int, str] | None = None) -> str:
    """The SQL our code sends for one claimed batch, as one pgbench transaction (one script run).

    With ``fence`` (a Lease row's id and token), each finishing transaction's ``BEGIN`` carries the statements
    ``ctx.transaction()``'s fence sends with it in the same round trip (``_fence.LeaseFence._begin_with``): the
    shared advisory lock and the token check. That is the job way's own limit.
    """
    limit = PATTERNS[pattern]
    begin = "BEGIN;"
    if fence is not None:
        lease_id, token = fence
        begin = (
            f"BEGIN \\; SELECT pg_advisory_xact_lock_shared({FENCE_LOCK_CLASS}, {lease_id}) \\; "
            f"SELECT current_setting('transaction_isolation') FROM {LEASE_TABLE} "
            f"WHERE id = {lease_id} AND token = '{token}'::uuid;"
        )
    claim_update = (
        f"UPDATE {TABLE} SET attempts = attempts + 1, version = version + 1, "
        "due = now() + interval '5 minutes' WHERE {where};"
    )
    claimed = _CLAIMED.format(limit=limit)
    lines = ["BEGIN;"]
    if pattern == "per_row":
        # One variable per row, so each finish sends literal values, as Django's client-side binding does.
        columns = ", ".join(f"ids[{k}] AS id{k}, vs[{k}] AS v{k}" for k in range(1, limit + 1))
        lines.append(
            f"SELECT {columns} FROM (SELECT array_agg(id ORDER BY due, id) AS ids, "
            f"array_agg(version + 1 ORDER BY due, id) AS vs FROM ({claimed}) AS claimed) AS a \\gset"
        )
        ids = ", ".join(f":id{k}" for k in range(1, limit + 1))
        lines.append(claim_update.format(where=f"id IN ({ids})"))
        lines.append("COMMIT;")
        for k in range(1, limit + 1):
            lines += [
                begin,
                f"UPDATE {TABLE} SET writes = 1, due = NULL, version = :v{k} + 1 "
                f"WHERE id = :id{k} AND version = :v{k};",
                "COMMIT;",
            ]
    else:
        lines.append(f"SELECT array_agg(id) AS ids, min(version) + 1 AS v FROM ({claimed}) AS claimed \\gset")
        lines.append(claim_update.format(where="id = ANY(':ids'::bigint[])"))
        lines.append("COMMIT;")
        lines += [
            begin,
            f"UPDATE {TABLE} SET writes = 1, due = NULL, version = version + 1 "
            f"WHERE version = :v AND id = ANY(':ids'::bigint[]) RETURNING id;",
            "COMMIT;",
        ]
    return "\n".join(lines) + "\n"


def _pgbench_one_statement_script() -> str:
    """The per_row limit with each finish one statement, as one pgbench transaction: the claim of 50 and their
    lease in one autocommit statement (the locking read in a WITH, as fabrika's own claim on PostgreSQL), then each
    row's finish as one autocommit ``UPDATE ... WHERE id AND version`` (no BEGIN, no COMMIT: one round trip a row).
    Run with ``-M prepared``: each statement is parsed once, its values sent as parameters."""
    limit = PATTERNS["per_row"]
    claimed = _CLAIMED.format(limit=limit).replace(", due, version", "")
    leased = (
        f"UPDATE {TABLE} SET attempts = attempts + 1, version = version + 1, due = now() + interval '5 minutes' "
        f"FROM claimed WHERE {TABLE}.id = claimed.id RETURNING {TABLE}.id, {TABLE}.version"
    )
    columns = ", ".join(f"ids[{k}] AS id{k}, vs[{k}] AS v{k}" for k in range(1, limit + 1))
    lines = [
        f"WITH claimed AS ({claimed}), leased AS ({leased}) SELECT {columns} FROM (SELECT array_agg(id ORDER BY id) "
        "AS ids, array_agg(version ORDER BY id) AS vs FROM leased) AS a \\gset"
    ]
    lines += [
        f"UPDATE {TABLE} SET writes = 1, due = NULL, version = :v{k} + 1 WHERE id = :id{k} AND version = :v{k};"
        for k in range(1, limit + 1)
    ]
    return "\n".join(lines) + "\n"


def _fence_lease(url: str) -> tuple[int, str]:
    """A Lease row with a token for pgbench_fenced's token check, as a running attempt holds one: (id, token)."""
    import psycopg

    with psycopg.connect(_psql_url(url), autocommit=True) as conn:
        lease_id, token = conn.execute(
            f"INSERT INTO {LEASE_TABLE} (job, lane, token, holder, attempt) "
            "VALUES (%s, 0, gen_random_uuid(), 'pgbench', 1) "
            "ON CONFLICT (job, lane) DO UPDATE SET token = EXCLUDED.token RETURNING id, token",
            [FENCED_JOB],
        ).fetchone()
    return lease_id, str(token)


def _drop_fence_lease(url: str) -> None:
    """Delete pgbench_fenced's Lease row: no job of that name exists for a worker or the admin to show."""
    import psycopg

    with psycopg.connect(_psql_url(url), autocommit=True) as conn:
        conn.execute(f"DELETE FROM {LEASE_TABLE} WHERE job = %s", [FENCED_JOB])  # noqa: S608  a constant name


def _pgbench(url: str, way: str, pattern: str, drain: int, clients: int) -> dict:
    fenced = way == "pgbench_fenced"
    try:
        if way == "pgbench_prepared":
            return _run_pgbench(url, pattern, drain, clients, _pgbench_one_statement_script(), mode="prepared")
        script = _pgbench_script(pattern, _fence_lease(url) if fenced else None)
        return _run_pgbench(url, pattern, drain, clients, script, mode="simple")
    finally:
        if fenced:
            _drop_fence_lease(url)


def _run_pgbench(url: str, pattern: str, drain: int, clients: int, sql: str, *, mode: str) -> dict:
    batches = drain // PATTERNS[pattern]
    if batches % clients:
        raise SystemExit(f"--clients must divide the {batches} batches of {pattern}")
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch, f"{pattern}.sql")
        script.write_text(sql)
        prefix = str(Path(scratch, "log"))
        argv = ["pgbench", "-n", "-M", mode, "-f", str(script), "-c", str(clients), "-j", str(clients)]
        argv += ["-t", str(batches // clients), "-l", "--log-prefix", prefix, "-d", _psql_url(url)]
        out_path, err_path = Path(scratch, "out"), Path(scratch, "err")
        t0 = time.perf_counter()
        peak_kb = 0
        with out_path.open("w") as out, err_path.open("w") as err:
            process = subprocess.Popen(argv, stdout=out, stderr=err)
            while process.poll() is None:
                peak_kb = max(peak_kb, _peak_rss_kb(process.pid))
                time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        out = out_path.read_text()
        if process.returncode:
            raise SystemExit(f"pgbench failed: {err_path.read_text().strip()}")
        tps = float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", out).group(1))
        latencies = []
        for log in Path(scratch).glob("log*"):
            latencies += [int(line.split()[2]) / 1e6 for line in log.read_text().splitlines()]
    return {
        "rows": batches * PATTERNS[pattern],
        "rows_per_s": tps * PATTERNS[pattern],
        "elapsed": elapsed,
        "batches": latencies,
        "peak_rss_kb": peak_kb,
    }


def _python(url: str, way: str, pattern: str, drain: int) -> dict:
    argv = [sys.executable, "-m", "bench.claim", "--child", way, "--pattern", pattern, "--drain", str(drain)]
    argv += ["--database-url", url]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if done.returncode:
        raise SystemExit(f"{way} {pattern} failed: {done.stderr.strip()[-2000:]}")
    answer = json.loads(done.stdout)
    answer["rows_per_s"] = answer["rows"] / answer["elapsed"]
    return answer


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.2f}"


def _median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda figures: figures["rows_per_s"])[len(runs) // 2]


def _report(runs: dict, args, database: str) -> None:
    """Print one database's table: each way's rows/s as a share of the database's limit and of the plain driver."""
    limit_way, floor_way = ("pgbench", "psycopg") if database == "postgresql" else ("mysqlclient", "mysqlclient")
    print(
        f"== {database}: {args.rows} due rows; per_row finishes {args.per_row_drain}, batch {args.batch_drain}; "
        f"median of {args.repeat} interleaved runs"
        + (
            f"; pgbench -c {args.clients} -M simple (pgbench_prepared: -M prepared, each finish one statement)"
            if database == "postgresql"
            else ""
        )
    )
    header = (
        f"{'pattern':8} {'way':16} {'rows/s':>7} {'(min-max)':>13} {'of limit':>8} {'of fenced':>9} {'of 1-stmt':>9} "
        f"{'of driver':>9} "
        f"{'batch ms p50/p95/p99':>20} {'finish tx ms p50/p99':>20} {'peak RSS':>8}"
    )
    print(header)
    print("-" * len(header))
    medians = {pattern: {way: _median_run(found) for way, found in ways.items()} for pattern, ways in runs.items()}
    for pattern, ways in runs.items():
        limit = medians[pattern].get(limit_way, {}).get("rows_per_s")
        fenced = medians[pattern].get("pgbench_fenced", {}).get("rows_per_s")
        one_statement = medians[pattern].get("pgbench_prepared", {}).get("rows_per_s")
        floor = medians[pattern].get(floor_way, {}).get("rows_per_s")
        for way, found in ways.items():
            figures = medians[pattern][way]
            speed = figures["rows_per_s"]
            spread = f"({min(f['rows_per_s'] for f in found):.0f}-{max(f['rows_per_s'] for f in found):.0f})"
            of_limit = f"{speed / limit:.0%}" if limit else "-"
            of_fenced = f"{speed / fenced:.0%}" if fenced and way != "pgbench_fenced" else "-"
            of_one = f"{speed / one_statement:.0%}" if one_statement and way != "pgbench_prepared" else "-"
            of_floor = f"{speed / floor:.0%}" if floor and way not in (limit_way, *LIMIT_WAYS) else "-"
            batch = "/".join(_ms(figures["batches"], q) for q in (0.5, 0.95, 0.99))
            finish = "/".join(_ms(figures.get("finishes", []), q) for q in (0.5, 0.99))
            rss = f"{max(f['peak_rss_kb'] for f in found) / 1024:.0f} MB"
            print(
                f"{pattern:8} {way:16} {speed:>7.0f} {spread:>13} {of_limit:>8} {of_fenced:>9} {of_one:>9} "
                f"{of_floor:>9} {batch:>20} {finish:>20} {rss:>8}"
            )
    print()
    for pattern, target in (("per_row", 0.60), ("batch", 0.40)):
        if pattern not in medians:
            continue
        # The job way sends the fence's statements too: pgbench_fenced is "the same statements" for it, and
        # the plain pgbench (which the direct way matches) is printed beside it, so neither ratio is hidden.
        # The next per-row target is 60 % of pgbench_prepared (each finish one statement) for both ways.
        for way, limits in (
            ("direct", (limit_way, "pgbench_prepared")),
            ("job", (limit_way, "pgbench_fenced", "pgbench_prepared")),
        ):
            figures = medians[pattern].get(way)
            for against in limits:
                limit = medians[pattern].get(against, {}).get("rows_per_s")
                if limit and figures:
                    ratio = figures["rows_per_s"] / limit
                    verdict = "meets" if ratio >= target else "MISSES"
                    named = " (next target)" if against == "pgbench_prepared" else ""
                    print(
                        f"{database} {pattern} {way}: {ratio:.0%} of {against}, {verdict} the target of {target:.0%}"
                        + named
                    )
    print()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claim", description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--mariadb-url", default=os.environ.get("BENCH_MARIADB_URL", DEFAULT_MARIADB_URL))
    parser.add_argument("--databases", default="postgresql,mariadb", help="a subset of postgresql,mariadb")
    parser.add_argument("--rows", type=int, default=100_000, help="due rows the table is filled with")
    parser.add_argument("--per-row-drain", type=int, default=30_000, help="rows the per_row pattern finishes")
    parser.add_argument("--batch-drain", type=int, default=100_000, help="rows the batch pattern finishes")
    parser.add_argument("--clients", type=int, default=1, help="pgbench connections (our side: one)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each way, interleaved; the median counts")
    every = dict.fromkeys((*WAYS, *MARIADB_WAYS))
    parser.add_argument("--ways", default=",".join(every), help=f"a subset of {','.join(every)}")
    parser.add_argument("--patterns", default=",".join(PATTERNS), help=f"a subset of {','.join(PATTERNS)}")
    parser.add_argument("--scale", action="store_true", help="claim(50) as dead rows pile up and the table grows")
    parser.add_argument("--profile", action="store_true", help="the job way's per_row drain under cProfile")
    parser.add_argument("--scales", default="", help=f"with --scale, a subset of {','.join(SCALES)}".replace("%", "%%"))
    children = (*(way for way in WAYS if way not in LIMIT_WAYS), "mysqlclient", "scale", "profile")
    parser.add_argument("--child", choices=children, help=argparse.SUPPRESS)
    parser.add_argument("--pattern", choices=tuple(PATTERNS), help=argparse.SUPPRESS)
    parser.add_argument("--drain", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return
    if args.scale:
        _scale(args)
        return
    if args.profile:
        _migrate(args.database_url)
        _fill(args.database_url, args.rows)
        argv = [sys.executable, "-m", "bench.claim", "--child", "profile", "--drain", str(args.per_row_drain)]
        subprocess.run(
            [*argv, "--database-url", args.database_url], check=True, cwd=Path(__file__).resolve().parent.parent
        )
        return
    for database in args.databases.split(","):
        url, ways = (args.database_url, WAYS) if database == "postgresql" else (args.mariadb_url, MARIADB_WAYS)
        wanted = [way for way in ways if way in args.ways.split(",")]
        _report(_measure(url, wanted, args), args, database)


def _migrate(url: str) -> None:
    _ensure_database(url)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
        env=dict(os.environ, DATABASE_URL=url, FABRIKA_LAB="1"),
    )


def _measure(url: str, ways: list[str], args) -> dict[str, dict[str, list[dict]]]:
    _migrate(url)
    drains = {"per_row": args.per_row_drain, "batch": args.batch_drain}
    patterns = args.patterns.split(",")
    runs: dict[str, dict[str, list[dict]]] = {
        pattern: {way: [] for way in ways if pattern == "per_row" or way not in PER_ROW_ONLY} for pattern in patterns
    }
    for pattern in patterns:
        # Interleaved, so that whatever else the machine does weighs on every way alike.
        for repeat in range(1, args.repeat + 1):
            for way in runs[pattern]:
                _fill(url, args.rows)
                print(f"# {pattern} {way} run {repeat}: {drains[pattern]} of {args.rows} due rows", file=sys.stderr)
                if way in LIMIT_WAYS:
                    figures = _pgbench(url, way, pattern, drains[pattern], args.clients)
                else:
                    figures = _python(url, way, pattern, drains[pattern])
                _check_drained(url, drains[pattern])
                runs[pattern][way].append(figures)
    return runs


if __name__ == "__main__":
    main()
