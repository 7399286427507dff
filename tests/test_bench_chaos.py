"""CI-sized runs of ``bench/chaos.py``'s experiments that stop, restart or promote servers.

The bench restarts only a server of its own: the machine's clusters run on untouched.

``bench/chaos.py``'s restart experiment used to restart the machine's ``main`` cluster whatever database it was
told to use, ending every other session of that server. It now makes a private cluster (``bench/_cluster.py``)
and drops it at the end. A CI-sized run here: one restart during a 2,000-row drain, then the server the test suite
runs on must have the same start time, and no private cluster may be left behind.

The kill experiment counts a kill as recovered only by an effect another process made after it (checked here on
that count alone, with no workers); its loop kills the next holder only once that recovery is seen.

The failover experiment (a primary and a synchronous standby of the bench's own, the primary stopped with
``-m immediate`` mid-drain, the standby promoted): the workers reconnect through their multi-host connection by
themselves, and no row is lost or its effect acknowledged twice.

The partition experiment (a worker in a network namespace of its own loses its link for three leases while it
holds the lease): the other worker takes over within a lease and a poll, the fence refuses the cut-off worker's
late writes, and once healed it works again by itself. Then a holder cut off inside ``ctx.transaction()`` with no
other worker running: the server's keepalives end its session, and free its locks, within their bound.
"""

import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

ROOT = Path(__file__).resolve().parent.parent


def _can_make_clusters() -> str | None:
    if not shutil.which("pg_createcluster"):
        return "needs Debian's pg_createcluster (postgresql-common) to make a private cluster"
    if os.geteuid() != 0:
        return "needs root to make a private PostgreSQL cluster"
    return None


@pytest.mark.django_db
def test_a_kill_is_recovered_only_by_another_process_s_effect_after_it():
    # The killed holder's last effect, committed just before its SIGKILL, is no sign that anyone took over: counted
    # as the recovery, the next kill hit the new holder before its first effect (two takeovers in one "stall").
    from bench.chaos import _effect_after
    from testproject.lab.models import Effect

    killed_at = timezone.now() - timedelta(seconds=5)
    Effect.objects.create(item=1, pid=101)
    Effect.objects.filter(item=1).update(at=killed_at + timedelta(milliseconds=1))
    assert _effect_after(killed_at, not_by=101) is None
    Effect.objects.create(item=2, pid=202)
    assert _effect_after(killed_at, not_by=101) == Effect.objects.get(item=2).at


def _cannot_make_namespaces() -> str | None:
    """Why this machine cannot make a network namespace (no iproute2, no CAP_SYS_ADMIN in a container), or None."""
    if not shutil.which("ip"):
        return "needs iproute2's ip to make a network namespace"
    name = f"fabrika_probe_{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode:
        return f"cannot make a network namespace here: {made.stderr.strip()[:100]}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=True)
    return None


def _impossible(reason: str) -> None:
    """Skip with the reason, or fail where these runs are required (.ci/run sets FABRIKA_REQUIRE_CHAOS=1)."""
    if os.environ.get("FABRIKA_REQUIRE_CHAOS") == "1" or os.environ.get("CI"):
        pytest.fail(f"{reason} (FABRIKA_REQUIRE_CHAOS=1)", pytrace=False)
    pytest.skip(reason)


def _server_started_at():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time()")
        return cursor.fetchone()[0]


def _bench_clusters():
    """The bench's clusters left on this machine: listed ones, and configuration folders without a cluster."""
    listing = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True).stdout
    listed = [line.split()[1] for line in listing.splitlines() if "fabrika_bench_" in line]
    return listed + sorted(path.name for path in Path("/etc/postgresql").glob("*/fabrika_bench_*"))


def _chaos(*arguments: str) -> subprocess.CompletedProcess:
    """Run ``python -m bench.chaos`` with ``arguments``; it must succeed."""
    reason = _can_make_clusters()
    if reason:
        _impossible(reason)
    done = subprocess.run(
        [sys.executable, "-m", "bench.chaos", *arguments, "--minutes", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "FABRIKA_LAB"}},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.postgresql
@pytest.mark.django_db
def test_the_restart_experiment_restarts_its_own_cluster_and_no_other():
    before = _server_started_at()
    done = _chaos("--experiments", "restart", "--rows", "2000", "--restarts", "1")
    [line] = [line for line in done.stdout.splitlines() if line.startswith("restart the server x1")]
    lost = line.split()[5]
    assert lost == "0", line
    assert "rows doubled (a second effect refused by the unique key): 0" in done.stdout
    assert _server_started_at() == before
    assert _bench_clusters() == []


@pytest.mark.postgresql
@pytest.mark.django_db
def test_a_failover_to_a_synchronous_standby_loses_and_doubles_nothing():
    before = _server_started_at()
    done = _chaos("--experiments", "failover", "--rows", "1800")
    [line] = [line for line in done.stdout.splitlines() if line.startswith("failover lost=")]
    assert line.startswith("failover lost=0 doubled=0 longest_stall="), line
    assert line.endswith("recovered=yes"), line
    assert _server_started_at() == before
    assert _bench_clusters() == []


@pytest.mark.postgresql
@pytest.mark.django_db
def test_a_partitioned_holder_is_taken_over_fenced_and_recovers_by_itself():
    reason = _can_make_clusters() or _cannot_make_namespaces()
    if reason:
        _impossible(reason)
    done = _chaos("--experiments", "partition", "--rows", "1800")
    [line] = [line for line in done.stdout.splitlines() if line.startswith("partition lost=")]
    assert line.startswith("partition lost=0 doubled=0 longest_stall="), line
    assert line.endswith("recovered=yes"), line
    stall = float(line.split("longest_stall=")[1].split()[0])
    # A lease, a poll and a run's start (about 2 s) when the cut finds the holder between transactions; the cut's
    # 3 leases at most when it finds it inside one (the takeover ends the cut-off session).
    assert stall < 3 * 2 + 1, line
    # With nobody to take over, the server's keepalives (set for every fabrika session) end the cut-off session
    # within their bound, about two leases; without them it kept its locks until the link came back.
    [alone] = [line for line in done.stdout.splitlines() if "with nobody to take over" in line]
    held = alone.split("locks for ")[1].split()[0]
    assert held.endswith("s") and float(held[:-1]) <= 5.0, alone
    assert alone.endswith("its transaction's commits seen 0"), alone
    assert _bench_clusters() == []
    assert "fabrika_bench_" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
