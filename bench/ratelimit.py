"""Shared rate limits on real workers and PostgreSQL: ``python -m bench.ratelimit`` (about 2 minutes; not part of
the suite).

The lab job ``lab_rated`` (``@cron(rate_limit=LAB_RATE, lanes=LAB_RATE_LANES)``) claims ``lab.Item`` rows
(``--claim`` a batch), records each claim (``lab.Taken``: the row and the ``due`` its claim wrote, the claim's
time plus the same first backoff for every row) and finishes them in one fenced transaction. For each rate of
``--rates`` (10/s, 100/s, 1,000/s) and each lane count of ``--lanes`` (1, 4, 16), two workers (each with
``--concurrency`` of half the lanes, at least 1) drain N·(1 + ``--seconds``) rows, N the rate: the full bucket's
burst, then ``--seconds`` of refill. Printed per cell:

- the achieved rate: the rows past the burst over the time from the first claim to the last, against the limit
  and against the same lanes' unlimited rate (the same job without ``rate_limit``, measured first);
- whether every window held at most what the bucket allows: over any t seconds at most N·(1 + t) claims (checked
  at t = 1 and over the whole drain).

Target: at least 95 % of the limit, or of the unlimited rate where that is lower; never above N·(1 + t).
The bench's own database is ``fabrika_bench_ratelimit`` (``--database-url``); its lab tables are emptied. Every row
is checked afterwards: claimed once, finished once.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from datetime import timedelta

from ._setup import WorkerProcess, create_database, out, setup_django

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/fabrika_bench_ratelimit"
JOB = "lab_rated"


class Worker(WorkerProcess):
    def __init__(self, url: str, concurrency: int, **env: object) -> None:
        arguments = ["-v", "1", "--only", JOB, "--concurrency", str(concurrency)]
        env = {"DEBUG": "0", "FABRIKA_LOG_LEVEL": "WARNING", "FABRIKA_POLL_INTERVAL": 0.2, **env}
        super().__init__(url, arguments, prefix="ratelimit-worker-", env=env)

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        os.unlink(self.log.name)


def _reset() -> None:
    from django.db import connection

    from fabrika_django.models import Attempt, Job, Lease, RateBucket

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE lab_item, lab_taken")
    Attempt.objects.filter(job=JOB).delete()
    Lease.objects.filter(job=JOB).update(token=None, holder="", run_id=None, expires=None, attempt=0)
    Job.objects.filter(name=JOB).update(pending_since=None, lane_asked=None)
    RateBucket.objects.filter(job=JOB).delete()  # each cell's bucket starts full


def _fill(count: int) -> None:
    from django.db import connection
    from django.utils import timezone

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO lab_item (n, writes, attempts, due, version, last_failure) "
            "SELECT n, 0, 0, %s, 0, '' FROM generate_series(1, %s) AS n",
            [timezone.now() - timedelta(seconds=1), count],
        )
        cursor.execute("ANALYZE lab_item")


def _drain(url: str, rows: int, lanes: int, rate: str, args: argparse.Namespace) -> list[float]:
    """Drain ``rows`` rows in ``lanes`` lanes over two workers at ``rate`` ("" for none); the claims' times, sorted."""
    from fabrika_django import kick
    from testproject.lab.models import Item, Taken

    _reset()
    _fill(rows)
    env = {"LAB_RATE": rate, "LAB_RATE_LANES": lanes, "LAB_CLAIM": args.claim}
    workers = [Worker(url, max(1, lanes // 2), **env) for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        while not all("Worker started" in worker.output() for worker in workers):
            if time.monotonic() > deadline or any(worker.proc.poll() is not None for worker in workers):
                raise SystemExit("a worker did not start:\n" + "\n".join(w.output()[-2000:] for w in workers))
            time.sleep(0.05)
        kick(JOB)
        deadline = time.monotonic() + args.minutes * 60
        while Item.objects.filter(due__isnull=True).count() < rows:
            if time.monotonic() > deadline or any(worker.proc.poll() is not None for worker in workers):
                raise SystemExit("the drain stalled:\n" + "\n".join(w.output()[-4000:] for w in workers))
            time.sleep(0.1)
    finally:
        for worker in workers:
            worker.end()
    writes = sorted(Item.objects.values_list("writes", "attempts").distinct())
    if writes != [(1, 1)] or Taken.objects.count() != rows:
        raise SystemExit(f"rows not claimed and done exactly once: (writes, attempts) {writes}")
    return sorted(due.timestamp() for due in Taken.objects.values_list("due", flat=True))


def _most_within(times: list[float], seconds: float) -> int:
    most, low = 0, 0
    for high, instant in enumerate(times):
        while instant - times[low] > seconds:
            low += 1
        most = max(most, high - low + 1)
    return most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("RATELIMIT_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--rates", default="10,100,1000", help="rows a second, comma-separated")
    parser.add_argument("--lanes", default="1,4,16", help="lane counts, comma-separated (over two workers)")
    parser.add_argument("--seconds", type=float, default=3.0, help="each cell's refill time after the burst")
    parser.add_argument("--unlimited-rows", type=int, default=4000, help="rows of each unlimited drain")
    parser.add_argument("--claim", type=int, default=50, help="the handler's claim(limit=...)")
    parser.add_argument("--minutes", type=float, default=3.0, help="give up a drain after this long")
    args = parser.parse_args()
    create_database(args.database_url)
    setup_django(args.database_url, lab=True)
    out(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    out(f"two workers, claim(limit={args.claim}), N·(1 + {args.seconds:g}) rows a cell")
    out(
        f"{'rate/s':>7} {'lanes':>5} {'rows':>6} {'achieved/s':>10} {'of limit':>8} {'of unlimited':>12} "
        f"{'max 1 s':>7} {'bound':>5} {'target':>6}"
    )
    lanes_list = [int(n) for n in args.lanes.split(",")]
    unlimited: dict[int, float] = {}
    for lanes in lanes_list:
        times = _drain(args.database_url, args.unlimited_rows, lanes, "", args)
        unlimited[lanes] = (len(times) - 1) / (times[-1] - times[0])
        out(f"{'none':>7} {lanes:>5} {len(times):>6} {unlimited[lanes]:>10.1f} {'':>8} {'':>12} {'':>7} {'':>5}")
    for rate in (int(n) for n in args.rates.split(",")):
        rows = int(rate * (1 + args.seconds))
        for lanes in lanes_list:
            times = _drain(args.database_url, rows, lanes, f"{rate}/s", args)
            span = times[-1] - times[0]
            achieved = (rows - rate) / span  # past the full bucket's burst, at the refill
            # The claims' instants are the bucket's own (the claim's now is the bucket's): the bound is exact.
            within = _most_within(times, 1.0) <= 2 * rate and rows <= rate * (1 + span) + 1e-6
            met = achieved >= 0.95 * min(rate, unlimited[lanes])
            out(
                f"{rate:>7} {lanes:>5} {rows:>6} {achieved:>10.1f} {achieved / rate:>8.0%} "
                f"{achieved / unlimited[lanes]:>12.0%} {_most_within(times, 1.0):>7} {'ok' if within else 'OVER':>5} "
                f"{'ok' if met else 'LOW':>6}"
            )
    out(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
