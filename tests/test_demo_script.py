"""``bin/demo``: a SIGINT or SIGTERM to the script's own pid stops the site and the worker, and waits for both.

The script runs in a session of its own, so the test finds every process it started (the worker, runserver and
the autoreloader's server child) by their session id, and kills what is left if the test fails.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .processes import ROOT

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to find the demo's processes")


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _session(sid):
    """Return the pids of the live (not zombie) processes of session ``sid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        # pid (comm) state ppid pgrp session ...: comm may hold spaces, so split after its closing parenthesis.
        state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state != "Z":
            pids.append(int(entry.name))
    return pids


def _commands(pids):
    found = []
    for pid in pids:
        try:
            found.append((Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def _wait_until_serving(demo, url, deadline):
    while time.monotonic() < deadline:
        assert demo.poll() is None, demo.stdout.read()
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return answer.status
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"bin/demo did not serve {url} in time")


@pytest.fixture
def demo(tmp_path):
    port = _free_port()
    env = dict(
        os.environ,
        DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}",  # the demo's own, not the test database
        DEMO_ADDR=f"127.0.0.1:{port}",
        FABRIKA_VENV=sys.prefix,  # this test's virtualenv: bin/_env installs nothing
        FABRIKA_LAB="0",
        PYTHONUNBUFFERED="1",
    )
    started = subprocess.Popen(
        [str(ROOT / "bin" / "demo")],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    started.url = f"http://127.0.0.1:{port}/"
    try:
        yield started
    finally:
        for pid in _session(started.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        started.wait(timeout=10)
        started.stdout.close()


def _worker_and_server(sid, deadline):
    while time.monotonic() < deadline:
        commands = _commands(_session(sid))
        worker = [command for command in commands if "fabrika_job worker" in command]
        servers = [command for command in commands if "runserver" in command]
        if worker and len(servers) == 2:  # the autoreloader and the server it runs
            return commands
        time.sleep(0.2)
    pytest.fail(f"bin/demo did not start its worker and server: {_commands(_session(sid))}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_demo_script_stops_the_site_and_the_worker_promptly(demo, signum):
    deadline = time.monotonic() + 120  # the first run migrates a new database
    assert _wait_until_serving(demo, demo.url, deadline) == 200
    _worker_and_server(demo.pid, deadline)

    signalled = time.monotonic()
    os.kill(demo.pid, signum)  # the script's own pid, not its process group: what `kill PID` does
    demo.wait(timeout=15)
    took = time.monotonic() - signalled
    # The script returns only after waiting for both: whatever of its session is left is a leak, now.
    assert _commands(_session(demo.pid)) == []
    assert demo.returncode == 128 + signum
    assert took < 8, f"bin/demo took {took:.1f} s to stop"
    with pytest.raises(OSError):
        urllib.request.urlopen(demo.url, timeout=2)
