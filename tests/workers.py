"""Start, watch and stop real worker processes (``manage.py fabrika_job worker``) against the test database."""

import os
import signal
import subprocess
import sys
import tempfile
import time

from django.db import connection

from .processes import ROOT, manage_env


class WorkerProcess:
    """A ``fabrika_job worker`` process; its log goes to a file (a full pipe would stall it)."""

    def __init__(self, *args, **env):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="fabrika-worker-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "fabrika_job", "worker", "-v", "2", *args],
            cwd=ROOT,
            env=manage_env(**env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.proc.pid

    def output(self):
        with open(self.log.name) as log:
            return log.read()

    def alive(self):
        return self.proc.poll() is None

    def signal(self, signum):
        self.proc.send_signal(signum)

    def wait(self, timeout):
        return self.proc.wait(timeout)

    def kill(self):
        """End the process if it still runs (tests call it in a finally) and remove its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.log.close()
        os.unlink(self.log.name)


def _post_mortem(workers):
    """What a timed-out test needs to tell a hang from slowness: the sessions that are not idle, and the
    workers' logs ending with every thread's stack (SIGABRT with PYTHONFAULTHANDLER)."""
    parts = []
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid), left(query, 160) "
                "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND state <> 'idle'"
            )
            parts += ["sessions not idle:", *(repr(row) for row in cursor.fetchall())]
    elif connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, command, state, time, left(info, 160) FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID() AND command <> 'Sleep'"
            )
            parts += ["sessions not idle:", *(repr(row) for row in cursor.fetchall())]
    for worker in workers:
        if worker.alive():
            worker.signal(signal.SIGABRT)
            try:
                worker.wait(5)
            except subprocess.TimeoutExpired:
                pass
        parts.append(worker.output()[-12000:])
    return "\n".join(parts)


def wait_until(predicate, *, timeout=30.0, workers=(), what="the condition"):
    """Poll ``predicate`` until it is true; fail saying ``what`` (and the workers' logs) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for worker in workers:
            assert worker.alive(), f"worker {worker.pid} exited ({worker.proc.returncode}):\n{worker.output()}"
        if time.monotonic() > deadline:
            raise AssertionError(f"Timed out waiting for {what}.\n{_post_mortem(workers)}")
        time.sleep(0.02)
