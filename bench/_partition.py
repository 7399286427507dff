"""The partition experiment of ``bench/chaos.py``: a lease holder's host loses the network, then gets it back.

One worker runs in a network namespace of its own (a host of the bench's own: a veth pair with addresses in
``10.231.N.0/30``, traffic only between the two ends), the other on this host; both serve ``lab_chaos`` from a
private cluster (``bench/_cluster.py``) that listens on 127.0.0.1 and on the veth's host end. While the namespaced
worker holds the job's lease, its link goes down for ``3 × LEASE_SECONDS``, then comes back.

What it shows:
- the other worker takes the job over within a lease and a poll (the longest stall);
- the cut-off worker's writes after the heal are refused by the fence (lost 0, doubled 0: no row's effect is
  acknowledged twice, and the unique key refused no second effect);
- it recovers by itself: once the link is back, it drains a second batch of rows alone;
- the server's own bound on a cut-off holder's locks: a namespaced worker cut off inside ``ctx.transaction()``
  (``lab_hold``) while no other worker runs, so no takeover ends its session; the link stays down until the
  server's keepalives (the settings every fabrika session sets, ``fabrika_django/_sessions.py``) end that session.
  It prints how long the session kept its locks (sampled from ``pg_locks`` every 50 ms) beside the bound those
  settings give, ``tcp_keepalives_idle + tcp_keepalives_count × tcp_keepalives_interval``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ._cluster import PrivateCluster
from ._setup import create_database, out, setup_django


class Namespace:
    """``with Namespace() as host:`` a network namespace joined to this host by a veth pair; ``host.cut()``."""

    def __init__(self) -> None:
        number = os.getpid() % 250 + 1
        self.name = f"fabrika_bench_{os.getpid()}"
        self.outside, self.inside = f"fbh{os.getpid()}", f"fbn{os.getpid()}"
        self.network = f"10.231.{number}.0/30"
        self.host_address, self.address = f"10.231.{number}.1", f"10.231.{number}.2"

    def __enter__(self) -> Namespace:
        self._ip("netns", "add", self.name)
        try:
            self._ip("link", "add", self.outside, "type", "veth", "peer", "name", self.inside)
            self._ip("link", "set", self.inside, "netns", self.name)
            self._ip("addr", "add", f"{self.host_address}/30", "dev", self.outside)
            self._ip("link", "set", self.outside, "up")
            self._inside("ip", "addr", "add", f"{self.address}/30", "dev", self.inside)
            self._inside("ip", "link", "set", self.inside, "up")
            self._inside("ip", "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        subprocess.run(["ip", "link", "del", self.outside], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)

    @property
    def wrapper(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def cut(self) -> None:
        """Packets stop both ways, without a word to either end, as a failed switch does."""
        self._ip("link", "set", self.outside, "down")

    def heal(self) -> None:
        self._ip("link", "set", self.outside, "up")

    def _inside(self, *command: str) -> None:
        self._ip("netns", "exec", self.name, *command)

    @staticmethod
    def _ip(*arguments: str) -> None:
        command = ("ip", *arguments)
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"bench: {' '.join(command)} failed: {done.stderr.strip()}")


def _cut_off_session_locks(address: str) -> int:
    """Locks held by the server sessions of the client at ``address``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE a.client_addr = %s::inet AND l.granted AND l.locktype <> 'virtualxid'",
            [address],
        )
        return int(cursor.fetchone()[0])


def partition(rows: int, *, minutes: float) -> dict:
    """Run the experiment once and return its figures (see the module's docstring)."""
    from .chaos import LEASE_SECONDS

    with Namespace() as host:
        settings = {"listen_addresses": f"127.0.0.1,{host.host_address}"}
        with PrivateCluster("partition", settings=settings, trusted=(f"{host.address}/32",)) as cluster:
            create_database(cluster.url("fabrika_chaos"))
            url = cluster.url("fabrika_chaos")
            setup_django(url, lab=True)
            with tempfile.TemporaryDirectory(prefix="chaos-acks-") as folder:
                remote_url = url.replace("127.0.0.1", host.host_address)
                result = _cut_the_holder(url, remote_url, host, Path(folder), rows, LEASE_SECONDS, minutes)
                alone = _cut_with_nobody_to_take_over(url, remote_url, host, Path(folder), LEASE_SECONDS, minutes)
                return {**result, **alone, "logs": result["logs"] + alone["logs"]}


def _cut_the_holder(  # noqa: PLR0913 - the experiment's whole setting, passed once
    url: str, remote_url: str, host: Namespace, folder: Path, rows: int, lease: float, minutes: float
) -> dict:
    from django.utils import timezone

    from fabrika_django import kick
    from testproject.lab.models import Effect

    from ._failover import _acknowledged
    from .chaos import Lab, Worker, _fill, _holder_pid, _longest_gap, _lost_and_dead, _reset, _settle

    lab = Lab(url, time.monotonic() + minutes * 60)
    _reset()
    _fill(rows)
    # 20 ms a row: the drain outlasts the other worker's start and the cut, however small the run.
    pace = {"LAB_ITEM_SECONDS": 0.02}
    remote = Worker(remote_url, wrapper=host.wrapper, LAB_ACK_LOG=folder / "ack-remote.log", **pace)
    lab.workers.append(remote)
    lab.wait(remote.started, "the namespaced worker to start")
    began = timezone.now()
    kick("lab_chaos")
    lab.wait(lambda: _holder_pid("lab_chaos") == remote.pid and Effect.objects.exists(), "the remote holder")
    local = lab.worker(LAB_ACK_LOG=folder / "ack-local.log", **pace)
    time.sleep(lease / 2)  # the holder goes on working; the other worker waits its turn
    host.cut()
    cut_at = time.monotonic()
    takeover = locks_until = None
    while time.monotonic() < cut_at + 3 * lease:  # the cut lasts three leases; sample what the server sees
        if takeover is None and _holder_pid("lab_chaos") == local.pid:
            takeover = time.monotonic() - cut_at
        if locks_until is None and _cut_off_session_locks(host.address) == 0:
            locks_until = time.monotonic() - cut_at
        time.sleep(0.05)
    host.heal()
    healed = timezone.now()
    _settle(lab)
    ended = timezone.now()
    local.end()
    # Recovered by itself: the cut-off worker, now alone, drains new rows.
    _fill(rows // 10)
    kick("lab_chaos")
    recovered = lab.wait(
        lambda: Effect.objects.filter(at__gt=healed, pid=remote.pid).count() >= rows // 10, "the healed worker", 60
    )
    _settle(lab)
    lost, unmatched, dead = _lost_and_dead()
    acks = _acknowledged(folder)
    redone = sum(1 for count in acks.values() if count > 1)
    remote.end()
    return {
        "experiment": f"partition for {3 * lease:.0f}s",
        "rows": rows + rows // 10,
        "lost": lost + unmatched,
        "doubled": redone + lab.doubles(),
        "stall": _longest_gap(began, ended),
        "takeover": takeover if takeover is not None else float("inf"),
        "locks_held": locks_until if locks_until is not None else float(3 * lease),
        "dead": dead,
        "recovered": takeover is not None and bool(recovered) and lost + unmatched == 0,
        "logs": [worker.log.name for worker in lab.workers],
    }


def keepalive_bound(lease: float) -> float:
    """The longest a silent client's session lives on the server with the keepalives a fabrika session sets
    (``_sessions.dead_client_settings`` for that lease): the idle time, then every probe unanswered."""
    from django.conf import settings
    from django.test import override_settings

    from fabrika_django._sessions import dead_client_settings

    with override_settings(FABRIKA={**getattr(settings, "FABRIKA", {}), "LEASE_SECONDS": lease}):
        idle, interval, count, _user_timeout_ms = (float(value) for value in dead_client_settings())
    return idle + count * interval


def _cut_with_nobody_to_take_over(  # noqa: PLR0913 - the experiment's whole setting, passed once
    url: str, remote_url: str, host: Namespace, folder: Path, lease: float, minutes: float
) -> dict:
    """Cut a holder off inside ``ctx.transaction()`` with no other worker running; the seconds its server session
    kept its locks (``inf``: longer than twice the bound, when the link came back anyway)."""
    from fabrika_django import kick
    from testproject.lab.models import Mark

    from .chaos import Lab, Worker, _reset

    lab = Lab(url, time.monotonic() + minutes * 60)
    _reset()
    hold = folder / "hold"
    hold.write_text("")
    holder = Worker(remote_url, wrapper=host.wrapper, only="lab_hold", LAB_HOLD_FILE=hold, LAB_HOLD_SECONDS=120)
    lab.workers.append(holder)
    lab.wait(holder.started, "the namespaced holder to start")
    kick("lab_hold")
    lab.wait(lambda: hold.read_text() and _cut_off_session_locks(host.address), "the holder inside its transaction")
    bound = keepalive_bound(lease)
    host.cut()
    cut_at = time.monotonic()
    held = math.inf
    while time.monotonic() < cut_at + 2 * bound:  # the link stays down until the server has let go
        if _cut_off_session_locks(host.address) == 0:
            held = time.monotonic() - cut_at
            break
        time.sleep(0.05)
    host.heal()
    holder.end()
    # The server rolled the cut-off transaction back: its start mark never appears.
    stale = Mark.objects.filter(job="lab_hold", pid=holder.pid).count()
    return {"alone_locks_held": held, "keepalive_bound": bound, "lost_hold": stale, "logs": [holder.log.name]}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="the partition experiment alone (python -m bench.chaos runs it)")
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--minutes", type=float, default=5.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench: the partition experiment makes a network namespace: run it as root")
    result = partition(args.rows, minutes=args.minutes)
    out(
        f"{result['experiment']}: {result['rows']} rows, dead {result['dead']}; taken over {result['takeover']:.2f}s "
        f"after the cut; the cut-off session held locks for {result['locks_held']:.2f}s of it (sampled every 50 ms)"
    )
    bound, held = result["keepalive_bound"], result["alone_locks_held"]
    out(
        f"cut off inside ctx.transaction() with nobody to take over: the server kept its session's locks for "
        f"{f'{held:.2f}s' if held <= 2 * bound else f'over {2 * bound:.0f}s'} (bound: the keepalives' {bound:.0f}s), "
        f"its transaction's commits seen {result['lost_hold']}"
    )
    lost = result["lost"] + result["lost_hold"]  # a frozen transaction's commit counts as the freeze's does
    out(
        f"partition lost={lost} doubled={result['doubled']} longest_stall={result['stall']:.2f} "
        f"recovered={'yes' if result['recovered'] else 'no'}"
    )
    for log in result["logs"]:
        os.unlink(log)
    if lost or result["doubled"] or not result["recovered"] or held > bound:
        sys.exit(1)


if __name__ == "__main__":
    main()
