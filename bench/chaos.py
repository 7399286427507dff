"""Chaos on real workers and PostgreSQL: ``python -m bench.chaos`` (about 5 minutes; not part of the suite).

Four experiments against worker processes serving the lab job ``lab_chaos``, which claims ``lab.Item`` rows
and, for each, makes one ``lab.Effect`` (a table whose unique key is the row) and finishes the row in the same
fenced transaction, inside ``ctx.row``:

  kills   SIGKILL the lease holder N times (default 20) during a 20,000-row drain with two workers
  cuts    end every worker session (``pg_terminate_backend``) N times (default 10) during a drain
  restart restart the PostgreSQL server N times (default 2) during a drain (``pg_ctlcluster … restart``)
  freeze  SIGSTOP a holder inside an open ``ctx.transaction()`` beyond its lease (``lab_hold``), 3 times
  poison  one poison row in a batch of 50, run until every row is done or dead

It prints, per experiment: rows lost (neither done nor dead once the system settled), rows doubled (a second
effect refused by the unique key, as the workers log it), the longest stall (the longest gap between two
effects, or from a freeze to the takeover's start), the time to recover after each fault (fault to the next
effect), and dead rows. Targets: 0 lost, 0 doubled, stalls within LEASE_SECONDS + one poll (plus the start
of a run), exactly one dead row for the one poison row.

It makes a PostgreSQL cluster of its own on a free port (``bench/_cluster.py``, with Debian's
``pg_createcluster``; run it as root or as the ``postgres`` user), runs every experiment there and drops the cluster at
the end: the restarts never touch another server. Its database's sessions commit without waiting for the WAL flush
(a restart is a clean shutdown, which flushes). ``--experiments kills,poison`` runs some of them.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

from ._cluster import PrivateCluster
from ._setup import WorkerProcess, create_database, out, setup_django

#: Run in this process, on one private cluster.
EXPERIMENTS = ("kills", "cuts", "restart", "freeze", "poison")
#: Each run in a process of its own, on servers of its own; the module, its arguments.
SEPARATE = {
    "failover": ("bench._failover", []),
    "failover-async": ("bench._failover", ["--asynchronous"]),
}
LEASE_SECONDS = 2
POLL_INTERVAL = 0.25
ITEM_SECONDS = 0.003  # a row's own work besides its transaction: the 20,000-row drain outlasts 20 kills


class Worker(WorkerProcess):
    """A ``fabrika_job worker`` process serving the chaos jobs; its log in a file of its own."""

    def __init__(self, url: str, **env: object) -> None:
        settings = {
            "FABRIKA_LEASE_SECONDS": LEASE_SECONDS,
            "FABRIKA_POLL_INTERVAL": POLL_INTERVAL,
            "FABRIKA_LOG_LEVEL": "INFO",
            "LAB_ITEM_SECONDS": ITEM_SECONDS,
        }
        super().__init__(url, ["--only", "lab_chaos,lab_hold"], prefix="chaos-worker-", env={**settings, **env})

    def started(self) -> bool:
        return "Worker started" in self.output()

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(30)


class Lab:
    """The experiments' shared state: the workers ever started (their logs count doubles) and the clock."""

    def __init__(self, url: str, deadline: float) -> None:
        self.url = url
        self.deadline = deadline
        self.workers: list[Worker] = []

    def worker(self, *, wait: bool = True, **env: object) -> Worker:
        worker = Worker(self.url, **env)
        self.workers.append(worker)
        if wait:
            self.wait(worker.started, f"worker {worker.pid} to start", 60)
        return worker

    def wait(self, predicate, what: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
        limit = min(time.monotonic() + timeout, self.deadline)
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > limit:
                what = what() if callable(what) else what
                self.post_mortem()
                raise SystemExit(f"chaos: gave up waiting for {what} (the bench's time ran out or it hung)")
            time.sleep(0.02)

    def post_mortem(self) -> None:
        """Print the sessions that are not idle, then the live workers' stacks (SIGABRT) and log tails."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid), left(query, 200) "
                "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND state <> 'idle'"
            )
            for row in cursor.fetchall():
                out(f"session {row!r}")
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGCONT)
                worker.proc.send_signal(signal.SIGABRT)
                try:
                    worker.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
                out(f"--- worker {worker.pid}\n{worker.output()[-6000:]}")

    def end_all(self) -> None:
        for worker in self.workers:
            worker.end()

    def doubles(self) -> int:
        return sum(worker.output().count("error=IntegrityError") for worker in self.workers)


# --- what the database says ----------------------------------------------------------------------------


def _reset() -> None:
    from fabrika_django.models import Attempt, Job, Lease
    from testproject.lab.models import Effect, Item, Mark

    for model in (Item, Effect, Mark, Attempt):
        model.objects.all().delete()
    Lease.objects.update(token=None, holder="", run_id=None, expires=None, attempt=0)
    Job.objects.update(pending_since=None)


def _fill(count: int, *, poison: int = 0) -> None:
    from django.utils import timezone

    from testproject.lab.jobs import POISON
    from testproject.lab.models import Item

    due = timezone.now() - timedelta(seconds=1)
    rows = [Item(n=POISON if n < poison else n, due=due) for n in range(count)]
    Item.objects.bulk_create(rows, batch_size=5000)


def _holder_pid(job: str) -> int | None:
    from fabrika_django.models import Lease

    holder = Lease.objects.filter(job=job, token__isnull=False).values_list("holder", flat=True).first()
    return int(holder.split(":")[1]) if holder else None


def _effect_after(moment):  # type: ignore[no-untyped-def]
    from testproject.lab.models import Effect

    return Effect.objects.filter(at__gt=moment).order_by("at").values_list("at", flat=True).first()


def _settle(lab: Lab) -> None:
    """Bring the claimed-but-unfinished rows' backoff forward, as the clock would, until none waits."""
    from django.utils import timezone

    from fabrika_django import kick
    from fabrika_django.models import Lease
    from testproject.lab.models import Item

    def idle() -> bool:
        return not Lease.objects.filter(job="lab_chaos", token__isnull=False).exists()

    for _ in range(12):
        lab.wait(
            lambda: not Item.objects.due_now().exists() and idle(),
            lambda: f"the drain to end ({Item.objects.due_now().count()} rows due)",
            300,
        )
        if not Item.objects.waiting().exists():
            return
        Item.objects.waiting().update(due=timezone.now())
        kick("lab_chaos")
        lab.wait(lambda: not Item.objects.due_now().exists(), "the requeued rows to be taken", 60)


def _lost_and_dead() -> tuple[int, int, int]:
    """Rows neither done nor dead; done rows without their one effect; dead rows."""
    from testproject.lab.models import Effect, Item

    lost = Item.objects.waiting().count()
    done = set(Item.objects.done().values_list("pk", flat=True))
    effects = set(Effect.objects.values_list("item", flat=True))
    return lost, len(done ^ effects), Item.objects.dead().count()


def _longest_gap(since, until) -> float:  # type: ignore[no-untyped-def]
    """The longest time without an effect while the faults went on (the settling after them not counted)."""
    from testproject.lab.models import Effect

    moments = list(Effect.objects.filter(at__gte=since, at__lte=until).order_by("at").values_list("at", flat=True))
    gaps = [(b - a).total_seconds() for a, b in zip(moments, moments[1:], strict=False)]
    return max(gaps, default=0.0)


def _cut_sessions() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


# --- the experiments -----------------------------------------------------------------------------------


def _drain_under(lab: Lab, name: str, rows: int, faults: int, fault, *, recover_from_end: bool = False) -> dict:  # type: ignore[no-untyped-def]
    """Drain ``rows`` with two workers, calling ``fault(workers)`` ``faults`` times once work has resumed.

    Recovery counts from the fault, or with ``recover_from_end`` from the end of a fault that lasts (a restart:
    from the server's being back); the stall counts the whole gap either way.
    """
    from django.utils import timezone

    from fabrika_django import kick
    from fabrika_django.models import Attempt
    from testproject.lab.models import Item

    _reset()
    _fill(rows)
    workers = [lab.worker(), lab.worker()]
    began = timezone.now()
    kick("lab_chaos")
    lab.wait(lambda: _effect_after(began), "the first effect")
    recoveries = []
    done = 0
    while done < faults:
        if not Item.objects.due_now().exists():
            break
        time.sleep(0.5)  # some work between faults, as a real outage leaves
        at = timezone.now()
        if not fault(workers):
            continue  # nobody held the lease at that instant (a run was starting): try again, it does not count
        if recover_from_end:
            at = timezone.now()
        done += 1
        after = lab.wait(
            lambda at=at: _effect_after(at) or (not Item.objects.due_now().exists() and "drained"),
            f"work to resume after {name} {done}",
            60,
        )
        if after != "drained":
            recoveries.append((after - at).total_seconds())
    ended = timezone.now()
    _settle(lab)
    lost, unmatched, dead = _lost_and_dead()
    crashed = Attempt.objects.filter(job="lab_chaos", outcome="crashed").count()
    outcomes = Counter(Attempt.objects.filter(job="lab_chaos").values_list("outcome", flat=True))
    for worker in workers:
        worker.end()
    return {
        "experiment": f"{name} x{done}",
        "rows": rows,
        "lost": lost + unmatched,
        "stall": _longest_gap(began, ended),
        "recover": recoveries,
        "dead": dead,
        "crashed": crashed,
        "outcomes": dict(sorted(outcomes.items())),
    }


def kills(lab: Lab, rows: int, count: int) -> dict:
    def kill_holder(workers: list[Worker]) -> bool:
        pid = _holder_pid("lab_chaos")
        victim = next((worker for worker in workers if worker.pid == pid), None)
        if victim is None:
            return False
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(30)
        workers[workers.index(victim)] = lab.worker(wait=False)  # two workers again, once it has started
        return True

    return _drain_under(lab, "SIGKILL the holder", rows, count, kill_holder)


def cuts(lab: Lab, rows: int, count: int) -> dict:
    return _drain_under(lab, "cut every session", rows, count, lambda workers: _cut_sessions() > 0)


def _restart_server(cluster: PrivateCluster) -> bool:
    """A clean restart of the bench's own cluster; this process reconnects after it."""
    from django.db import connection

    cluster.restart("fast")
    connection.close()  # the old session died with the server: the next query opens a new one
    return True


def restarts(lab: Lab, cluster: PrivateCluster, rows: int, count: int) -> dict:
    return _drain_under(
        lab, "restart the server", rows, count, lambda workers: _restart_server(cluster), recover_from_end=True
    )


def freeze(lab: Lab, count: int) -> dict:
    """SIGSTOP a holder inside ctx.transaction(); time from the stop to the other worker's start of the job."""
    from fabrika_django import kick
    from testproject.lab.models import Mark

    stalls, stale = [], 0
    for _ in range(count):
        _reset()
        with tempfile.TemporaryDirectory() as folder:
            hold = Path(folder) / "hold"
            hold.touch()
            frozen = lab.worker(LAB_HOLD_FILE=hold)
            kick("lab_hold")
            lab.wait(lambda hold=hold: hold.read_text(), "the holder inside its transaction")
            other = lab.worker()
            frozen.proc.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            lab.wait(lambda other=other: Mark.objects.filter(job="lab_hold", pid=other.pid).exists(), "the takeover")
            stalls.append(time.monotonic() - stopped)
            frozen.end()
            other.end()
            # The frozen transaction must never commit: its start mark never appears.
            stale += Mark.objects.filter(job="lab_hold", pid=frozen.pid).count()
    return {"experiment": f"SIGSTOP in a transaction x{count}", "rows": 0, "lost": stale, "stall": max(stalls),
            "recover": stalls, "dead": 0, "crashed": 0}  # fmt: skip


def poison(lab: Lab) -> dict:
    from fabrika_django import kick
    from testproject.lab.models import Item

    _reset()
    _fill(50, poison=1)
    workers = [lab.worker(), lab.worker()]
    kick("lab_chaos")
    _settle(lab)
    lost, unmatched, dead = _lost_and_dead()
    for worker in workers:
        worker.end()
    poisoned = Item.objects.dead().values_list("n", flat=True)
    return {"experiment": "a poison row in 50", "rows": 50, "lost": lost + unmatched, "stall": 0.0, "recover": [],
            "dead": dead, "crashed": 0, "poison_dead": list(poisoned)}  # fmt: skip


def _commit_without_flush(url: str) -> None:
    """Sessions of the chaos database commit without waiting for the WAL flush (``synchronous_commit=off``).

    No experiment crashes the server, so durability is not what is measured; on a shared machine whose disk
    is busy, a commit waiting for its flush stalled every worker for seconds and hid the stalls that are ours.
    """
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit TO off')


# --- main ----------------------------------------------------------------------------------------------


def _header() -> None:
    out(f"LEASE_SECONDS={LEASE_SECONDS} POLL_INTERVAL={POLL_INTERVAL}s target stall <= {LEASE_SECONDS + POLL_INTERVAL}s"
        " (+ the start of a run)")  # fmt: skip
    out(f"{'experiment':32} {'rows':>6} {'lost':>5} {'stall s':>8} {'recover s (median / max)':>26} {'dead':>5}"
        f" {'crashed':>8}")  # fmt: skip


def _line(result: dict) -> None:
    recover = result["recover"]
    spans = f"{statistics.median(recover):.2f} / {max(recover):.2f}" if recover else "-"
    out(
        f"{result['experiment']:32} {result['rows']:>6} {result['lost']:>5} {result['stall']:>8.2f} "
        f"{spans:>26} {result['dead']:>5} {result['crashed']:>8}"
    )
    sys.stdout.flush()


def _footer(results: list[dict], doubles: int) -> None:
    for result in results:
        if result.get("outcomes"):
            out(f"  {result['experiment']}: attempts {result['outcomes']}")
    out(f"rows doubled (a second effect refused by the unique key): {doubles}")
    out("lost: rows neither done nor dead after settling, done rows without their one effect, and (freeze) a")
    out("frozen transaction's commit; crashed: attempts recorded 'crashed' (a SIGKILL's are; a cut's should not be)")


_ALL = (*EXPERIMENTS, *SEPARATE)


def _experiments(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in _ALL]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown experiment {unknown[0] if unknown else value!r}: "
                                         f"choose from {', '.join(_ALL)}")  # fmt: skip
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=_experiments, default=list(_ALL),
                        help=f"comma-separated, of {','.join(_ALL)} (default: all)")  # fmt: skip
    parser.add_argument("--rows", type=int, default=20_000, help="rows of the kill experiment's drain")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--cuts", type=int, default=10)
    parser.add_argument("--restarts", type=int, default=2, help="server restarts of the restart experiment")
    parser.add_argument("--freezes", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=10.0, help="give up after this long")
    parser.add_argument("--keep-logs", action="store_true", help="keep the workers' logs and print their paths")
    args = parser.parse_args()
    here = [name for name in args.experiments if name in EXPERIMENTS]
    if here:
        with PrivateCluster() as cluster:
            out(f"a private PostgreSQL {cluster.version} cluster on port {cluster.port} (dropped at the end)")
            _run(args, here, cluster)
    failed = 0
    for name in (name for name in args.experiments if name in SEPARATE):
        module, extra = SEPARATE[name]
        out(f"--- {name} (its own servers, in a process of its own)")
        sys.stdout.flush()
        rows = ["--rows", str(max(300, args.rows // 6)), "--minutes", str(args.minutes)]
        failed |= subprocess.run(
            [sys.executable, "-m", module, *rows, *extra], cwd=Path(__file__).parent.parent
        ).returncode
    sys.exit(1 if failed else 0)


def _run(args: argparse.Namespace, names: list[str], cluster: PrivateCluster) -> None:
    url = cluster.url("fabrika_chaos")
    create_database(url)
    _commit_without_flush(url)
    setup_django(url, lab=True)
    lab = Lab(url, time.monotonic() + args.minutes * 60)
    started = time.monotonic()
    results: list[dict] = []
    experiments = {
        "kills": lambda: kills(lab, args.rows, args.kills),
        "cuts": lambda: cuts(lab, max(2_000, args.rows // 4), args.cuts),
        "restart": lambda: restarts(lab, cluster, max(2_000, args.rows // 4), args.restarts),
        "freeze": lambda: freeze(lab, args.freezes),
        "poison": lambda: poison(lab),
    }
    _header()
    try:
        for name in names:
            result = experiments[name]()
            results.append(result)
            _line(result)
    finally:
        lab.end_all()
        from django.db import connections

        connections.close_all()  # the cluster is dropped next: no session of ours may hold it
        _footer(results, lab.doubles())
        poisoned = next((result["poison_dead"] for result in results if "poison_dead" in result), None)
        out(f"poison rows dead (n): {poisoned}; took {time.monotonic() - started:.0f}s")
        for worker in lab.workers:
            if args.keep_logs:
                out(f"log of worker {worker.pid}: {worker.log.name}")
            else:
                os.unlink(worker.log.name)


if __name__ == "__main__":
    main()
