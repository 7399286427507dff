"""A real PgBouncer in transaction mode in front of the test database, for the tests that must pass behind one."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from django.conf import settings

BINARY = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)


class PgBouncer:
    """``pool_mode = transaction`` with two server sessions: consecutive transactions of one client land on
    either, and sessions are shared between clients, as in production behind a transaction pooler."""

    def __init__(self, pool_size=2):
        self.dir = Path(tempfile.mkdtemp(prefix="fabrika-pgbouncer-"))
        self.port = _free_port()
        user = settings.DATABASES["default"].get("USER") or "postgres"
        (self.dir / "users.txt").write_text(f'"{user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            "* = host=127.0.0.1 port=5432\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'users.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 200\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\npidfile = {self.dir / 'pgbouncer.pid'}\n"
        )
        os.chmod(self.dir, 0o755)
        command = [BINARY, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            shutil.chown(self.dir, "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self._wait_listening()

    def url(self):
        db = settings.DATABASES["default"]
        user = db.get("USER") or "postgres"
        return f"postgres://{user}@127.0.0.1:{self.port}/{db['NAME']}"

    def log(self):
        path = self.dir / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _wait_listening(self):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self.proc.returncode}):\n{self.log()}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen on {self.port}:\n{self.log()}")


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def pgbouncer():
    """A PgBouncer for the test; skipped where it is not installed, a failure under FABRIKA_REQUIRE_PGBOUNCER."""
    if BINARY is None:
        if os.environ.get("FABRIKA_REQUIRE_PGBOUNCER"):
            pytest.fail("pgbouncer is not installed (apt-get install pgbouncer)")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    bouncer = PgBouncer()
    try:
        yield bouncer
    finally:
        bouncer.stop()
