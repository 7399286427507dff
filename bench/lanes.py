"""Lanes on real workers and PostgreSQL: ``python -m bench.lanes`` (about 3 minutes; not part of the suite).

I/O-bound work in lanes (``@cron(lanes=N)``): the lab job ``lab_lanes`` claims ``lab.Item`` rows (``--claim`` a
batch) and for each waits ``--item-ms`` (20 ms: a time.sleep, the wait of a call to a mail provider or an HTTP API,
which uses no CPU), then finishes the row in one fenced transaction: the handler of a mail or API job. ``--effects``
also makes one ``lab.Effect`` (unique on the row) in that transaction, as the bench did before (an INSERT of the
bench's own). A drain of ``--rows`` rows (4,000) runs in each configuration of ``--configs``: ``LANESxWORKERS``,
each worker with ``--concurrency LANES/WORKERS``. It prints rows/s from the kick to the end of the last attempt (the
drain's runs recorded in the attempt history), and its share of the ideal, ``lanes x 1000 / item-ms`` rows/s (50
rows/s a lane at 20 ms). Target: at least 75 % up to 16 lanes.

``--drain N`` runs instead one drain of N rows (1,000,000) in 8 lanes on one worker without the wait, and prints
the worker's resident memory (VmRSS) when ``--rss-at`` rows (100,000) are done and at the end. Target: growth
at most 20 MB.

It uses its own database, ``fabrika_bench_lanes`` (``--database-url``), whose lab tables it empties. Every row
is checked afterwards: claimed once and finished once (version 2: one claim's bump, one finish's; a row claimed
by two lanes would be at 3 or more, its older claim's finish failing with a VersionConflict), with no failed or
retried attempt; with ``--effects``, one Effect each too.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

from ._setup import WorkerProcess, create_database, out, setup_django

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/fabrika_bench_lanes"
JOB = "lab_lanes"


class Worker(WorkerProcess):
    """A ``fabrika_job worker --only lab_lanes`` process; its log in a file of its own."""

    def __init__(self, url: str, concurrency: int, **env: object) -> None:
        arguments = ["-v", "1", "--only", JOB, "--concurrency", str(concurrency)]
        env = {"DEBUG": "0", "FABRIKA_LOG_LEVEL": "WARNING", **env}
        super().__init__(url, arguments, prefix="lanes-worker-", env=env)

    def cpu_seconds(self) -> float:
        """The process's CPU time so far (user and system), in seconds."""
        return _cpu_of(self.pid)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

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


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int | str) -> float:
    """User and system CPU seconds of process ``pid`` (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _server_cpu() -> float:
    """CPU seconds of every PostgreSQL server process on this machine (its sessions and its own processes)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith("postgres"):
                total += _cpu_of(entry.name)
    return total


def _machine_cpu() -> float:
    """CPU seconds the whole machine spent busy (every core: /proc/stat's first line, idle and iowait left out)."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / _TICKS


def _reset() -> None:
    from django.db import connection

    from fabrika_django.models import Attempt, Job, Lease

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE lab_item, lab_effect")
    Attempt.objects.filter(job=JOB).delete()
    Lease.objects.filter(job=JOB).update(token=None, holder="", run_id=None, expires=None, attempt=0)
    Job.objects.filter(name=JOB).update(pending_since=None, lane_asked=None)


def _fill(count: int) -> None:
    from django.db import connection
    from django.utils import timezone

    due = timezone.now() - timedelta(seconds=1)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO lab_item (n, writes, attempts, due, version, last_failure) "
            "SELECT n, 0, 0, %s, 0, '' FROM generate_series(1, %s) AS n",
            [due, count],
        )
        cursor.execute("ANALYZE lab_item")


def _done() -> int:
    from testproject.lab.models import Item

    return Item.objects.filter(due__isnull=True).count()


def _check(count: int, *, effects: bool, strict: bool = True) -> None:
    """Fail unless every row was done exactly once.

    ``strict``: each row was also claimed exactly once (version 2, attempts 1) and no attempt of the drain
    failed or was retried. A row two lanes claimed at once gets two claim bumps and a finish (version 3 or
    more), and the older claim's finish fails with a VersionConflict, failing its attempt; so this catches a
    double claim without an effect table. Not strict: the long drain, where an attempt past its timeout leaves
    rows claimed and the next claim takes them again (retried, as it should).
    """
    from fabrika_django.models import Attempt
    from testproject.lab.models import Effect, Item

    done = _done()
    found = {
        "done": done,
        "writes": sorted(Item.objects.values_list("writes", flat=True).distinct()),
        "effects": Effect.objects.count() if effects else count,
    }
    wanted = {"done": count, "writes": [1], "effects": count}
    if strict:
        found["versions"] = sorted(Item.objects.values_list("version", "attempts", "last_failure").distinct())
        wanted["versions"] = [(2, 1, "")]
        attempts = Attempt.objects.filter(job=JOB)
        found["failed or retried attempts"] = attempts.exclude(outcome="succeeded", number=1).count()
        wanted["failed or retried attempts"] = 0
    if found != wanted:
        raise SystemExit(f"rows not done exactly once: found {found}, wanted {wanted}")


def _started(workers: list[Worker]) -> None:
    deadline = time.monotonic() + 60
    while not all("Worker started" in worker.output() for worker in workers):
        if time.monotonic() > deadline or any(worker.proc.poll() is not None for worker in workers):
            raise SystemExit("a worker did not start:\n" + "\n".join(worker.output()[-2000:] for worker in workers))
        time.sleep(0.05)


def _wait_for(count: int, workers: list[Worker], *, minutes: float, every: float = 0.25) -> None:
    from fabrika_django import kick
    from fabrika_django.models import Lease

    deadline = time.monotonic() + minutes * 60
    idle_since = None
    while _done() < count:
        if time.monotonic() > deadline or any(worker.proc.poll() is not None for worker in workers):
            raise SystemExit("the drain stalled:\n" + "\n".join(worker.output()[-4000:] for worker in workers))
        # Rows an attempt cut off had claimed (one past its timeout) come due after their backoff; the job has
        # no schedule to pick them up, so kick it while it is idle, as a schedule would.
        if Lease.objects.filter(job=JOB, token__isnull=False).exists():
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > 5:
            kick(JOB)
            idle_since = None
        time.sleep(every)


def _throughput(url: str, lanes: int, workers_count: int, args: argparse.Namespace) -> tuple[float, int, str]:
    """Drain ``args.rows`` rows in ``lanes`` lanes over ``workers_count`` workers.

    Return rows/s, the lanes used, and the CPU each row cost during the drain: the workers', the PostgreSQL
    server's, and the machine's whole (the rest is this process, other people's and the kernel's).
    """
    from django.db.models import Max

    from fabrika_django import kick
    from fabrika_django.models import Attempt
    from testproject.lab.models import Effect

    _reset()
    _fill(args.rows)
    env = {"LAB_LANES": lanes, "LAB_ITEM_SECONDS": args.item_ms / 1000, "LAB_CLAIM": args.claim}
    env["LAB_EFFECTS"] = int(args.effects)
    workers = [Worker(url, max(1, lanes // workers_count), **env) for _ in range(workers_count)]
    try:
        _started(workers)
        cpu_before = sum(worker.cpu_seconds() for worker in workers), _server_cpu(), _machine_cpu()
        began = time.time()
        kick(JOB)
        _wait_for(args.rows, workers, minutes=args.minutes)
        cpu_after = sum(worker.cpu_seconds() for worker in workers), _server_cpu(), _machine_cpu()
    finally:
        for worker in workers:
            worker.end()
    _check(args.rows, effects=args.effects)
    # The drain ends with the last attempt: the one whose claim came back empty after the last row's finish.
    last = Attempt.objects.filter(job=JOB).aggregate(last=Max("finished"))["last"]
    seconds = last.timestamp() - began
    if args.effects:  # the end as this bench measured it before: the last effect
        effect_seconds = Effect.objects.aggregate(last=Max("at"))["last"].timestamp() - began
        out(f"# {lanes}x{workers_count}: last effect {effect_seconds:.3f} s, last attempt's end {seconds:.3f} s")
    used = Attempt.objects.filter(job=JOB).values("lane").distinct().count()
    worker_ms, server_ms, machine_ms = ((a - b) * 1000 / args.rows for a, b in zip(cpu_after, cpu_before, strict=True))
    return args.rows / seconds, used, f"{worker_ms:.2f} / {server_ms:.2f} / {machine_ms:.2f}"


def _drain(url: str, args: argparse.Namespace) -> None:
    from fabrika_django import kick

    _reset()
    out(f"filling {args.drain:,} rows ...")
    _fill(args.drain)
    worker = Worker(url, 8, LAB_LANES=8, LAB_ITEM_SECONDS=0, LAB_CLAIM=args.claim, LAB_EFFECTS=int(args.effects))
    try:
        _started([worker])
        began = time.monotonic()
        kick(JOB)
        _wait_for(min(args.rss_at, args.drain), [worker], minutes=args.minutes, every=0.5)
        at_mark = worker.rss_mb()
        marked = time.monotonic()
        out(f"{args.rss_at:,} rows done after {marked - began:.0f} s: worker RSS {at_mark:.1f} MB")
        _wait_for(args.drain, [worker], minutes=args.minutes, every=0.5)
        at_end = worker.rss_mb()
        ended = time.monotonic()
    finally:
        worker.end()
    _check(args.drain, effects=args.effects, strict=False)
    out(f"{args.drain:,} rows done after {ended - began:.0f} s ({args.drain / (ended - began):,.0f} rows/s)")
    out(
        f"worker RSS at the end {at_end:.1f} MB: growth {at_end - at_mark:+.1f} MB from {args.rss_at:,} rows in "
        f"(target: at most 20 MB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("LANES_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--item-ms", type=float, default=20.0, help="each row's wait without CPU")
    parser.add_argument("--claim", type=int, default=10, help="the handler's claim(limit=...)")
    parser.add_argument("--configs", default="1x1,4x1,8x1,16x1,16x2", help="LANESxWORKERS, comma-separated")
    parser.add_argument("--drain", type=int, default=0, help="instead: one drain of this many rows in 8 lanes")
    parser.add_argument("--rss-at", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=10.0, help="give up after this long")
    parser.add_argument(
        "--effects", action="store_true", help="the handler also inserts one lab.Effect a row (the bench's old handler)"
    )
    args = parser.parse_args()
    create_database(args.database_url)
    setup_django(args.database_url, lab=True)
    out(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.drain:
        _drain(args.database_url, args)
        return
    handler = "wait, Effect INSERT, finish" if args.effects else "wait, finish"
    out(f"{args.rows:,} rows, {args.item_ms:g} ms of waiting a row, claim(limit={args.claim}), handler: {handler}")
    out(
        f"{'lanes':>5} {'workers':>7} {'rows/s':>8} {'ideal':>6} {'of ideal':>8} {'lanes used':>10}"
        "  CPU ms a row: workers / server / machine"
    )
    for config in args.configs.split(","):
        lanes, workers = (int(part) for part in config.split("x"))
        rate, used, cpu = _throughput(args.database_url, lanes, workers, args)
        ideal = lanes * 1000 / args.item_ms
        out(f"{lanes:>5} {workers:>7} {rate:>8.1f} {ideal:>6.0f} {rate / ideal:>8.0%} {used:>10}  {cpu}")
    out(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
