"""The failover experiment of ``bench/chaos.py``: the primary dies mid-drain and its standby is promoted.

Two private clusters (``bench/_cluster.py``): a primary and a streaming standby made from its base backup, with
synchronous replication (``synchronous_standby_names = '*'``) or, with ``asynchronous``, without. The workers and
this process (the client that records rows and kicks) reach them through one multi-host connection
(``HOST=127.0.0.1,127.0.0.1``, ``PORT=primary,standby``, ``target_session_attrs=read-write``), as a project behind
a pair of servers does. Mid-drain the primary stops with ``-m immediate`` and the standby is promoted; nobody
restarts a worker.

What counts:
- lost: rows neither done nor dead once the system settled, and done rows without their one effect;
- doubled: rows whose effect a worker saw commit more than once (its ``LAB_ACK_LOG``: the outside world's view),
  plus second effects the unique key refused. A commit the worker saw succeed on the old primary but which the
  standby never received is redone on the new primary, and counts here;
- longest stall: the longest time without an effect from the drain's start to its end, the failover included;
- recovered: the workers drained every row, the ones recorded after the promotion too, by themselves.

With asynchronous replication the walsender is paused (SIGSTOP) for ``lag_seconds`` before the primary dies, so
the standby lacks the last commits, as a standby that fell behind does; the line says how many acknowledged
commits were missing on the new primary and the replication lag an operator would have seen
(``pg_stat_replication``) at the failover.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ._cluster import PrivateCluster
from ._setup import create_database, out, setup_django


def _replication(primary_url: str) -> tuple[int, str, int] | None:
    """The standby's walsender on the primary: (pid, sync_state, bytes the standby has not replayed)."""
    import psycopg

    with psycopg.connect(primary_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid, sync_state, pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint "
            "FROM pg_stat_replication WHERE state = 'streaming'"
        ).fetchone()
    return (int(row[0]), str(row[1]), int(row[2] or 0)) if row else None


def _wait_streaming(primary: PrivateCluster, synchronous: bool, timeout: float = 60.0) -> None:
    limit = time.monotonic() + timeout
    wanted = "sync" if synchronous else "async"
    while (state := _replication(primary.url())) is None or state[1] != wanted:
        if time.monotonic() > limit:
            raise SystemExit(f"bench: the standby did not stream from the primary ({wanted}) within {timeout:.0f}s")
        time.sleep(0.1)


def _acknowledged(folder: Path) -> Counter[int]:
    acks: Counter[int] = Counter()
    for log in folder.glob("ack-*.log"):
        acks.update(int(line) for line in log.read_text().split())
    return acks


def failover(rows: int, *, asynchronous: bool, lag_seconds: float, minutes: float) -> dict:
    """Run one failover drain and return its figures (see the module's docstring)."""
    primary_settings = {
        "wal_level": "replica",
        "max_wal_senders": "5",
        "wal_keep_size": "256MB",
        "synchronous_standby_names": "" if asynchronous else "*",
    }
    with (
        PrivateCluster("primary", settings=primary_settings) as primary,
        PrivateCluster("standby", standby_of=primary) as standby,
    ):
        _wait_streaming(primary, synchronous=not asynchronous)
        create_database(primary.url("fabrika_chaos"))
        url = (
            f"postgres://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/fabrika_chaos"
            "?target_session_attrs=read-write"
        )
        setup_django(url, lab=True)
        with tempfile.TemporaryDirectory(prefix="chaos-acks-") as folder:
            return _drain_through_failover(
                url, primary, standby, Path(folder), rows, asynchronous, lag_seconds, time.monotonic() + minutes * 60
            )


def _drain_through_failover(  # noqa: PLR0913 - the experiment's whole setting, passed once
    url: str,
    primary: PrivateCluster,
    standby: PrivateCluster,
    folder: Path,
    rows: int,
    asynchronous: bool,
    lag_seconds: float,
    deadline: float,
) -> dict:
    from django.db import connection
    from django.utils import timezone

    from fabrika_django import kick
    from testproject.lab.models import Effect

    from .chaos import Lab, _fill, _longest_gap, _lost_and_dead, _reset, _settle

    lab = Lab(url, deadline)
    _reset()
    _fill(rows)
    workers = [lab.worker(LAB_ACK_LOG=folder / f"ack-{n}.log") for n in range(2)]
    began = timezone.now()
    kick("lab_chaos")
    lab.wait(lambda: Effect.objects.count() >= rows // 3, "a third of the drain")
    lag = 0
    if asynchronous:
        walsender = _replication(primary.url())
        if walsender is not None:
            os.kill(walsender[0], signal.SIGSTOP)  # the standby falls behind, as one on a slow link does
            time.sleep(lag_seconds)
            lag = (_replication(primary.url()) or walsender)[2]
    connection.close()
    primary.stop("immediate")
    standby.promote()
    promoted = timezone.now()
    resumed = lab.wait(lambda: Effect.objects.filter(at__gt=promoted).exists(), "work to resume on the new primary")
    recovery = (timezone.now() - promoted).total_seconds() if resumed else None
    _fill(rows // 10)  # the client records rows on the new primary through the same connection settings
    kick("lab_chaos")
    _settle(lab)
    ended = timezone.now()
    lost, unmatched, dead = _lost_and_dead()
    acks = _acknowledged(folder)
    redone = sum(1 for count in acks.values() if count > 1)
    alive = all(worker.proc.poll() is None for worker in workers)  # nobody restarted them, nor did they die
    for worker in workers:
        worker.end()
    return {
        "experiment": "failover (asynchronous)" if asynchronous else "failover (synchronous)",
        "rows": rows + rows // 10,
        "lost": lost + unmatched,
        "doubled": redone + lab.doubles(),
        "stall": _longest_gap(began, ended),
        "recover": [recovery] if recovery is not None else [],
        "dead": dead,
        "recovered": alive and resumed is not None and lost + unmatched == 0,
        "lag_bytes": lag,
        "acked_missing": redone,
        "logs": [worker.log.name for worker in lab.workers],
    }


def summary(result: dict) -> str:
    name = "failover-async" if "asynchronous" in result["experiment"] else "failover"
    return (
        f"{name} lost={result['lost']} doubled={result['doubled']} longest_stall={result['stall']:.2f} "
        f"recovered={'yes' if result['recovered'] else 'no'}"
    )


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="the failover experiment alone (python -m bench.chaos runs it)")
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--asynchronous", action="store_true", help="asynchronous replication (the standby lags)")
    parser.add_argument("--lag-seconds", type=float, default=3.0)
    parser.add_argument("--minutes", type=float, default=5.0)
    args = parser.parse_args()
    result = failover(args.rows, asynchronous=args.asynchronous, lag_seconds=args.lag_seconds, minutes=args.minutes)
    recover = result["recover"]
    out(
        f"{result['experiment']}: {result['rows']} rows, dead {result['dead']}, work resumed "
        f"{recover[0]:.2f}s after the promotion"
        if recover
        else f"{result['experiment']}: work never resumed"
    )
    if "asynchronous" in result["experiment"]:
        out(
            f"  acknowledged commits missing on the new primary (redone there): {result['acked_missing']}; "
            f"replication lag at the failover: {result['lag_bytes']} bytes (pg_stat_replication on the primary)"
        )
    out(summary(result))
    for log in result["logs"]:
        os.unlink(log)
    # Synchronous replication must lose and double nothing; asynchronous replication's losses are its figures.
    if not args.asynchronous and (result["lost"] or result["doubled"] or not result["recovered"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
