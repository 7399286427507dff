"""``python -m tests_upstream [--require] [pytest args...]``: run django-tasks-db's tests against fabrika's backend.

Fetches the pinned sdist once into ``var/upstream/`` with pip (checked against its sha256), extracts its
``tests/tests.py`` and runs it with pytest, ``tests_upstream.settings`` and ``-p tests_upstream.plugin``. Without a
network the run is skipped with one line, or fails with ``--require``. The exit code is pytest's.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

PACKAGE = "django-tasks-db"
VERSION = "0.13.0"
SDIST = f"django_tasks_db-{VERSION}.tar.gz"
SHA256 = "09630d417cf722b07e1439b837403e18e86455908ba532fa6795b0d23dc3ff23"
ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "var" / "upstream"
#: The one file of theirs that runs; the rest of the sdist (their package) is never imported.
TESTS = f"django_tasks_db-{VERSION}/tests/tests.py"


def main(argv: list[str]) -> int:
    require = "--require" in argv
    pytest_args = [arg for arg in argv if arg != "--require"]
    try:
        sdist = fetch()
    except RuntimeError as exc:
        if require:
            sys.stderr.write(f"{exc}\n")
            return 1
        sys.stdout.write(f"== {PACKAGE} {VERSION}'s tests skipped: {exc}\n")
        return 0
    tests = extract(sdist)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests_upstream.settings"}
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(tests),
        "-c",
        os.devnull,  # not the project's [tool:pytest]: its testpaths, settings and warnings-as-errors are ours
        "--rootdir",
        str(tests.parent.parent),  # their module is then ``tests.tests``, beside the alias ``tests.tasks``
        "--import-mode=importlib",  # their tests/ is not a package; the name ``tests`` is an alias (aliases.py)
        "-p",
        "tests_upstream.plugin",
        "-p",
        "no:cacheprovider",
        "-rxs",
        *pytest_args,
    ]
    return subprocess.call(command, cwd=ROOT, env=env)


def fetch() -> Path:
    """Return the pinned sdist in the cache, downloading it with pip first when it is not there."""
    sdist = CACHE / SDIST
    if not sdist.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
        answer = subprocess.run(
            [*download, "--dest", str(CACHE), f"{PACKAGE}=={VERSION}"], capture_output=True, text=True, check=False
        )
        if answer.returncode != 0 or not sdist.exists():
            raise RuntimeError(f"pip could not download {PACKAGE}=={VERSION}'s sdist (no network?).")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SHA256:
        sdist.unlink()
        raise RuntimeError(f"{SDIST} has sha256 {digest}, not the pinned {SHA256}: removed; not run.")
    return sdist


def extract(sdist: Path) -> Path:
    """Extract their tests module next to the sdist (once) and return its path."""
    target = CACHE / TESTS
    if not target.exists():
        with tarfile.open(sdist) as archive:
            archive.extract(TESTS, CACHE, filter="data")
    return target


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
