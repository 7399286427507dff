"""What the benches share: printing a line, making their PostgreSQL database, setting Django up on it, and
starting the test project's worker."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def create_database(url: str) -> None:
    """Create the database ``url`` names, if it does not exist yet."""
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(url: str, *, lab: bool) -> None:
    """Set Django up on ``url`` as in production (DEBUG off) and migrate; ``lab`` installs the lab app."""
    os.environ["DATABASE_URL"] = url
    if lab:
        os.environ["FABRIKA_LAB"] = "1"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("FABRIKA_LOG_LEVEL", "WARNING")
    os.environ["DEBUG"] = "0"  # DEBUG keeps every statement in connection.queries
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class WorkerProcess:
    """A ``manage.py fabrika_job worker`` process of the test project on ``url`` (the lab app installed), its
    output in a log file of its own; ``env`` adds to its environment, and ``wrapper`` runs it through another command
    (``ip netns exec NAME``: a worker on a host of its own)."""

    def __init__(
        self, url: str, arguments: list[str], *, prefix: str, env: dict[str, object], wrapper: tuple[str, ...] = ()
    ) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", prefix=prefix, suffix=".log", delete=False)  # noqa: SIM115
        environ = dict(
            os.environ,
            DATABASE_URL=url,
            FABRIKA_LAB="1",
            PYTHONUNBUFFERED="1",
            PYTHONFAULTHANDLER="1",  # a worker that hangs is sent SIGABRT and writes every thread's stack
        )
        environ.update({key: str(value) for key, value in env.items()})
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, str(ROOT / "manage.py"), "fabrika_job", "worker", *arguments],
            cwd=ROOT,
            env=environ,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.proc.pid

    def output(self) -> str:
        return Path(self.log.name).read_text()
