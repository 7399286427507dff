"""PgQueuer 1.6, bench/tasks.py's second peer, through its own API on the bench's PostgreSQL (never a dependency of
fabrika: the ``bench`` extra installs it, with asyncpg, the driver its documentation leads with).

bench/tasks.py calls this module, in the same run and on the same database as fabrika and django-tasks-db:
- ``install()``: PgQueuer's own installer (``Queries.install()``, what ``pgq install`` runs) in the bench's database;
- ``enqueue_loops()``: one-at-a-time enqueue (``Queries.enqueue(entrypoint, None)``, each its own autocommit
  statement), from its async API on asyncpg under uvloop (as ``pgq run`` runs) and from its sync API
  (``SyncQueries`` on psycopg, what a Django view would call);
- ``drain()``: N no-op jobs enqueued in one statement, then one consumer (``QueueManager.run(batch_size=10,
  mode=drain)`` in a process of its own), jobs/s from the first ``picked`` to the last ``successful`` row of
  PgQueuer's own log table (``pgqueuer_log.created``: the server's clock, as our rows' ``started_at`` and
  ``finished_at``);
- ``latency()``: enqueue-to-start with an idle consumer (LISTEN/NOTIFY, its default): the job's ``picked`` log row
  minus the moment just before ``enqueue()``, looked for as bench/tasks.py looks for ours.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = "bench_noop"
BATCH_SIZE = 10
TABLES = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")


def available() -> bool:
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
    except ImportError:
        return False
    return True


def install(url: str) -> None:
    """PgQueuer's schema (tables, types, trigger), made by its own installer."""

    async def installed() -> None:
        import asyncpg
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(url)
        try:
            await Queries.from_asyncpg_connection(conn).install()
        finally:
            await conn.close()

    _run(installed())


def clear(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(TABLES)}")


# -- 1. enqueue ---------------------------------------------------------------------------------------------


class Enqueuer:
    """PgQueuer's one-at-a-time enqueue, both of its APIs, each enqueue one autocommit statement."""

    def __init__(self, url: str) -> None:
        import psycopg
        from pgqueuer.db import SyncPsycopgDriver
        from pgqueuer.queries import SyncQueries

        self._loop = _new_loop()
        self._async_conn, self._queries = self._loop.run_until_complete(_async_queries(url))
        self._sync_conn = psycopg.connect(url, autocommit=True)
        self._sync_queries = SyncQueries(SyncPsycopgDriver(self._sync_conn))

    def enqueue(self) -> int:
        """One job through the async API (the latency's enqueue); its id."""
        (job_id,) = self._loop.run_until_complete(self._queries.enqueue(ENTRYPOINT, None))
        return int(job_id)

    def loops(self) -> dict[str, Callable[[int], None]]:
        """Each way as ``loop(count)``: the async one awaits its enqueues inside one coroutine, so the event loop is
        entered once per round, not once per enqueue."""

        async def awaited(count: int) -> None:
            for _ in range(count):
                await self._queries.enqueue(ENTRYPOINT, None)

        def synchronous(count: int) -> None:
            for _ in range(count):
                self._sync_queries.enqueue(ENTRYPOINT, None)

        return {
            "PgQueuer (asyncpg)": lambda count: self._loop.run_until_complete(awaited(count)),
            "PgQueuer sync (psycopg)": synchronous,
        }

    def close(self) -> None:
        self._loop.run_until_complete(self._async_conn.close())
        self._loop.close()
        self._sync_conn.close()


async def _async_queries(url: str):
    import asyncpg
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(url)
    return conn, Queries.from_asyncpg_connection(conn)


# -- 2. drain -----------------------------------------------------------------------------------------------


def drain(url: str, count: int) -> float:
    """Jobs/s of one consumer, batch size 10, over ``count`` no-op jobs enqueued beforehand."""
    import psycopg

    _enqueue_many(url, count)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE pgqueuer")  # the planner sees the filled table, as bench/tasks.py does for ours
    consumer = _consumer(url, "drain")
    if consumer.wait(2400):
        raise RuntimeError(f"PgQueuer's consumer failed: {Path(consumer.log_name).read_text()[-2000:]}")  # type: ignore[attr-defined]
    with psycopg.connect(url, autocommit=True) as conn:
        done, first, last = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'successful'), min(created) FILTER (WHERE status = 'picked'), "
            "max(created) FILTER (WHERE status = 'successful') FROM pgqueuer_log"
        ).fetchone()
        left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0]
    assert done == count and not left, f"PgQueuer: {done} of {count} jobs succeeded, {left} left in its queue"
    clear(url)
    return count / (last - first).total_seconds()


def _enqueue_many(url: str, count: int) -> None:
    async def enqueued() -> None:
        conn, queries = await _async_queries(url)
        try:
            for start in range(0, count, 2000):
                size = min(2000, count - start)
                await queries.enqueue([ENTRYPOINT] * size, [None] * size, [0] * size)
        finally:
            await conn.close()

    _run(enqueued())


# -- 3. latency ---------------------------------------------------------------------------------------------


def latency(url: str, count: int) -> list[float]:
    """Enqueue-to-start (seconds) of ``count`` jobs, one at a time, with an idle consumer; 10 more warm it up."""
    import psycopg

    consumer = _consumer(url, "continuous")
    enqueuer = Enqueuer(url)
    reader = psycopg.connect(url, autocommit=True, prepare_threshold=0)
    picked = "SELECT created FROM pgqueuer_log WHERE job_id = %s AND status = 'picked'"
    seen = []
    try:
        for n in range(count + 10):
            time.sleep(random.uniform(0, 0.02))
            began = time.time()
            job_id = enqueuer.enqueue()
            time.sleep(0.015)  # as bench/tasks.py: its own polling would take a core from the consumer
            started = _wait(lambda job_id=job_id: reader.execute(picked, [job_id]).fetchone(), consumer, 60)
            if n >= 10:
                seen.append(started[0].timestamp() - began)
    finally:
        consumer.kill()
        consumer.wait()
        enqueuer.close()
        reader.close()
    clear(url)
    return seen


def _wait(predicate, consumer: subprocess.Popen[bytes], timeout: float):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if consumer.poll() is not None:
            raise RuntimeError(f"PgQueuer's consumer ended: {Path(consumer.log_name).read_text()[-2000:]}")  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise TimeoutError("the bench waited too long for PgQueuer")
        time.sleep(0.005)
    return value


# -- the consumer: a process of its own, as `pgq run` would be ------------------------------------------------


def _consumer(url: str, mode: str) -> subprocess.Popen[bytes]:
    import tempfile

    log = tempfile.NamedTemporaryFile("w+", prefix="fabrika-bench-pgqueuer-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.pgqueuer_peer", "--consumer", mode, "--postgres", url],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    process.log_name = log.name  # type: ignore[attr-defined]
    return process


async def _consume(url: str, mode: str) -> None:
    import asyncpg
    from pgqueuer import types
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(url)
    manager = QueueManager(Queries.from_asyncpg_connection(conn))

    @manager.entrypoint(ENTRYPOINT)
    async def noop(job) -> None:
        pass

    await manager.run(batch_size=BATCH_SIZE, mode=types.QueueExecutionMode[mode])
    sys.stdout.write(json.dumps({"ended": mode}) + "\n")


def _new_loop() -> asyncio.AbstractEventLoop:
    import uvloop  # PgQueuer's own dependency, its CLI's loop

    return uvloop.new_event_loop()


def _run(coroutine) -> None:
    loop = _new_loop()
    try:
        loop.run_until_complete(coroutine)
    finally:
        loop.close()


def main() -> int:
    parser = argparse.ArgumentParser(description="PgQueuer's consumer, started by bench/tasks.py")
    parser.add_argument("--consumer", choices=("drain", "continuous"), required=True)
    parser.add_argument("--postgres", required=True)
    args = parser.parse_args()
    _run(_consume(args.postgres, args.consumer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
