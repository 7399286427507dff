"""A private PostgreSQL cluster for a bench that stops, restarts or promotes its server.

Such a bench never touches a server it did not make: it makes a cluster of its own with Debian's
``pg_createcluster`` on a free port (trust authentication, listening on 127.0.0.1 only), uses it, and drops it at
the end, also when the bench fails. The machine's own clusters (``main`` and any other) are never named.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

#: Every private cluster's name starts with this, so one left by a killed bench is recognisable.
PREFIX = "fabrika_bench_"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _version() -> str:
    versions = sorted(os.listdir("/usr/lib/postgresql"), key=lambda name: int(name) if name.isdigit() else 0)
    if not versions:
        raise SystemExit("bench: no PostgreSQL server is installed here (/usr/lib/postgresql is empty)")
    return versions[-1]


class PrivateCluster:
    """``with PrivateCluster() as cluster:`` a started cluster of this process's own; ``cluster.url(name)``."""

    def __init__(
        self, role: str = "db", *, settings: dict[str, str] | None = None, standby_of: PrivateCluster | None = None
    ) -> None:
        self.version = _version()
        self.name = f"{PREFIX}{os.getpid()}_{role}"
        #: A streaming standby of that cluster (a base backup of it, following its WAL) instead of a new one.
        self.standby_of = standby_of
        self.port = _free_port()
        self.settings = {"listen_addresses": "127.0.0.1", **(settings or {})}

    @property
    def config_dir(self) -> Path:
        return Path("/etc/postgresql") / self.version / self.name

    @property
    def data_dir(self) -> Path:
        return Path("/var/lib/postgresql") / self.version / self.name

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def __enter__(self) -> PrivateCluster:
        self._run("pg_createcluster", self.version, self.name, "-p", str(self.port), "--", "--auth=trust")
        try:
            # Debian's postgresql.conf reads conf.d/ last: the bench's own settings win there.
            lines = "".join(f"{key} = '{value}'\n" for key, value in self.settings.items())
            (self.config_dir / "conf.d" / "bench.conf").write_text(lines)
            if self.standby_of is not None:
                self._copy_primary(self.standby_of)
            self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._run("pg_dropcluster", "--stop", self.version, self.name, check=False)

    def _copy_primary(self, primary: PrivateCluster) -> None:
        """Replace the new cluster's data with a base backup of ``primary`` that follows its WAL (``-R``)."""
        for entry in self.data_dir.iterdir():  # the folder stays: it is the postgres user's, with its mode
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        binary = f"/usr/lib/postgresql/{self.version}/bin/pg_basebackup"
        self._run("runuser", "-u", "postgres", "--", binary, "-h", "127.0.0.1", "-p", str(primary.port),
                  "-U", "postgres", "-D", str(self.data_dir), "-R", "-X", "stream", "-c", "fast")  # fmt: skip

    def promote(self) -> None:
        """End recovery: the standby takes writes (``pg_ctlcluster promote``, which waits for it)."""
        self._ctl("promote")

    def start(self) -> None:
        self._ctl("start")
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        self._ctl("stop", "-m", mode)

    def restart(self, mode: str = "fast") -> None:
        self._ctl("restart", "-m", mode)
        self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        limit = time.monotonic() + timeout
        while subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)], check=False).returncode:
            if time.monotonic() > limit:
                raise SystemExit(f"bench: the private cluster on port {self.port} did not start")
            time.sleep(0.1)

    def _ctl(self, *arguments: str) -> None:
        self._run("pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, *arguments)

    @staticmethod
    def _run(*command: str, check: bool = True) -> None:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if check and done.returncode:
            raise SystemExit(f"bench: {' '.join(command[:1])} failed: {done.stderr.strip().splitlines()[-1:]}")
