"""The soak experiment of ``bench/chaos.py``: mixed load for ``--minutes``, a worker SIGKILLed every two minutes.

A private cluster (``bench/_cluster.py``) and two workers serving a lanes job (``lab_lanes``, 4 lanes, claiming
``lab.Item`` rows and making one ``lab.Effect`` each), the Django tasks queue ``tasks.default.default`` (the task
``lab.tasks.effect`` makes one Effect per task) and a cron job firing every minute (``lab_minutely``). This
process is the client: every 0.2 s it records rows and kicks, and enqueues tasks. One worker lives for the whole
soak; the other is SIGKILLed every ``--kill-every`` seconds and replaced.

At the end: every row and every task done exactly once (lost, doubled), the longest time without an effect while
work was waiting (longest stall), every minute's fire served, the long-lived worker's RSS after the warm-up (its
spread must stay within 10 MB), the database's connections over the soak (flat), and the history pruned as
``RUN_HISTORY_DAYS`` says (the built-in prune run as if 31 days later leaves none of the soak's attempts).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

from ._cluster import PrivateCluster
from ._setup import create_database, out, setup_django

RSS_SPREAD_MB = 10


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _connections() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


class _Client:
    """Records rows and kicks, and enqueues tasks, at a steady pace; remembers what it asked for."""

    def __init__(self) -> None:
        self.rows = 0
        self.tasks = 0

    def step(self) -> None:
        from django.db import transaction
        from django.utils import timezone

        from fabrika_django import kick
        from testproject.lab.models import Item
        from testproject.lab.tasks import effect

        with transaction.atomic():
            Item.objects.bulk_create([Item(n=self.rows + k, due=timezone.now()) for k in range(5)])
            kick("lab_lanes")
        self.rows += 5
        for _ in range(2):
            self.tasks += 1
            effect.enqueue(self.tasks)


def soak(minutes: float, kill_every: float) -> dict:
    with PrivateCluster("soak") as cluster:
        url = cluster.url("fabrika_chaos")
        create_database(url)
        setup_django(url, lab=True)
        return _soak(url, minutes, kill_every)


def _soak(url: str, minutes: float, kill_every: float) -> dict:  # noqa: PLR0915 - one experiment, read top to bottom
    from django.utils import timezone

    from testproject.lab.models import Effect, Mark

    from .chaos import Lab, Worker, _longest_gap, _reset

    env = {"LAB_LANES": 4, "LAB_ITEM_SECONDS": 0.005, "LAB_MINUTELY_SCHEDULE": "* * * * *"}
    only = "lab_lanes,lab_minutely,tasks.default.default"

    def worker() -> Worker:
        started = Worker(url, only=only, **env)
        lab.workers.append(started)
        lab.wait(started.started, f"worker {started.pid} to start")
        return started

    lab = Lab(url, time.monotonic() + (minutes + 5) * 60)
    _reset()
    Effect.objects.all().delete()
    steady, victim = worker(), worker()
    client = _Client()
    began = timezone.now()
    start = time.monotonic()
    warm = start + min(300.0, minutes * 60 / 3)
    next_kill = start + kill_every
    rss: list[float] = []
    connections: list[int] = []
    kills = 0
    while time.monotonic() < start + minutes * 60:
        client.step()
        if time.monotonic() >= next_kill:
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(30)
            victim = worker()
            kills += 1
            next_kill += kill_every
        if time.monotonic() >= warm and int(time.monotonic() - start) % 30 == 0:
            rss.append(_rss_mb(steady.pid))
            connections.append(_connections())
        time.sleep(0.2)
    ended = timezone.now()
    done = _drained(lab, client)
    stall = _longest_gap(began, ended)
    minutes_served = Mark.objects.filter(job="lab_minutely").values_list("note", flat=True).distinct().count()
    for started in (steady, victim):
        started.end()
    pruned = _prune_later()
    lost, doubled = done
    spread = max(rss) - min(rss) if rss else 0.0
    return {
        "minutes": minutes,
        "kills": kills,
        "rows": client.rows,
        "tasks": client.tasks,
        "lost": lost,
        "doubled": doubled,
        "stall": stall,
        "fires": minutes_served,
        "rss": (min(rss, default=0.0), max(rss, default=0.0)),
        "rss_flat": spread <= RSS_SPREAD_MB,
        "connections": (min(connections, default=0), max(connections, default=0)),
        "pruned": pruned,
        "logs": [started.log.name for started in lab.workers],
    }


def _drained(lab, client: _Client) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """Wait until every row and task is done; (lost, doubled) once the system settled."""
    from testproject.lab.models import Effect, Item

    from .chaos import _settle_job

    _settle_job(lab, "lab_lanes")
    lab.wait(lambda: Effect.objects.filter(item__lt=0).count() >= client.tasks, "the tasks to be done", 300)
    lost = Item.objects.waiting().count() + (client.tasks - Effect.objects.filter(item__lt=0).count())
    done = set(Item.objects.done().values_list("pk", flat=True))
    effects = set(Effect.objects.filter(item__gt=0).values_list("item", flat=True))
    return lost + len(done ^ effects), lab.doubles()


def _prune_later() -> bool:
    """The built-in prune, run as if 31 days later, leaves none of the soak's attempts (RUN_HISTORY_DAYS = 30)."""
    from django.utils import timezone

    from fabrika_django.models import Attempt
    from fabrika_django.testing import run_job

    before = Attempt.objects.count()
    result = run_job("fabrika_prune_history", now=timezone.now() + timedelta(days=31))
    return before > 0 and result.ok and not Attempt.objects.exclude(job="fabrika_prune_history").exists()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="the soak experiment alone (python -m bench.chaos runs it)")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=120.0, help="seconds between SIGKILLs of a worker")
    parser.add_argument("--rows", type=int, default=0, help="ignored (bench.chaos passes it to every experiment)")
    args = parser.parse_args()
    result = soak(args.minutes, args.kill_every)
    low, high = result["rss"]
    out(
        f"soak {result['minutes']:g} min, {result['kills']} SIGKILLs: {result['rows']} rows, {result['tasks']} tasks, "
        f"{result['fires']} minutes' fires served; steady worker RSS {low:.1f}-{high:.1f} MB after warm-up "
        f"({'flat' if result['rss_flat'] else 'GREW'}); connections {result['connections'][0]}-"
        f"{result['connections'][1]}; history pruned: {'yes' if result['pruned'] else 'NO'}"
    )
    recovered = result["rss_flat"] and result["pruned"] and result["lost"] == 0
    out(
        f"soak lost={result['lost']} doubled={result['doubled']} longest_stall={result['stall']:.2f} "
        f"recovered={'yes' if recovered else 'no'}"
    )
    for log in result["logs"]:
        os.unlink(log)
    if result["lost"] or result["doubled"] or not recovered:
        sys.exit(1)


if __name__ == "__main__":
    main()
