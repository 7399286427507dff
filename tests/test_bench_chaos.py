"""CI-sized runs of ``bench/chaos.py``'s experiments that stop, restart or promote servers.

The bench restarts only a server of its own: the machine's clusters run on untouched.

``bench/chaos.py``'s restart experiment used to restart the machine's ``main`` cluster whatever database it was
told to use, ending every other session of that server. It now makes a private cluster (``bench/_cluster.py``)
and drops it at the end. A CI-sized run here: one restart during a 2,000-row drain, then the server the test suite
runs on must have the same start time, and no private cluster may be left behind.

The failover experiment (a primary and a synchronous standby of the bench's own, the primary stopped with
``-m immediate`` mid-drain, the standby promoted): the workers reconnect through their multi-host connection by
themselves, and no row is lost or its effect acknowledged twice.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db]


def _can_make_clusters() -> str | None:
    if not shutil.which("pg_createcluster"):
        return "needs Debian's pg_createcluster (postgresql-common) to make a private cluster"
    if os.geteuid() != 0:
        return "needs root to make a private PostgreSQL cluster"
    return None


def _server_started_at():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time()")
        return cursor.fetchone()[0]


def _bench_clusters():
    listing = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True).stdout
    return [line.split()[1] for line in listing.splitlines() if "fabrika_bench_" in line]


def _chaos(*arguments: str) -> subprocess.CompletedProcess:
    """Run ``python -m bench.chaos`` with ``arguments``; it must succeed."""
    reason = _can_make_clusters()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
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


def test_the_restart_experiment_restarts_its_own_cluster_and_no_other():
    before = _server_started_at()
    done = _chaos("--experiments", "restart", "--rows", "2000", "--restarts", "1")
    [line] = [line for line in done.stdout.splitlines() if line.startswith("restart the server x1")]
    lost = line.split()[5]
    assert lost == "0", line
    assert "rows doubled (a second effect refused by the unique key): 0" in done.stdout
    assert _server_started_at() == before
    assert _bench_clusters() == []


def test_a_failover_to_a_synchronous_standby_loses_and_doubles_nothing():
    before = _server_started_at()
    done = _chaos("--experiments", "failover", "--rows", "1800")
    [line] = [line for line in done.stdout.splitlines() if line.startswith("failover lost=")]
    assert line.startswith("failover lost=0 doubled=0 longest_stall="), line
    assert line.endswith("recovered=yes"), line
    assert _server_started_at() == before
    assert _bench_clusters() == []
