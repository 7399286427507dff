"""bin/release-check's look inside the artefacts names each file a wheel lacks: a template, a static file, a
migration, ``py.typed`` or the licence. Checked on artefacts made here from the checkout's own file list, whole
and with one file left out, so the check is shown to fail (the full release-check builds the real ones in CI)."""

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "bin" / "_wheel_contents.py"
PACKAGE = ROOT / "fabrika_django"


def _package_files() -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(".pyc")
    )


def _artefacts(tmp_path: Path, leave_out: str | None) -> tuple[Path, Path]:
    wheel = tmp_path / "fabrika_django-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in _package_files():
            if name != leave_out:
                archive.writestr(name, "")
        if leave_out != "LICENSE":
            archive.writestr("fabrika_django-0.dist-info/licenses/LICENSE", "MIT")
    sdist = tmp_path / "fabrika_django-0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(ROOT / "LICENSE", arcname="fabrika_django-0/LICENSE")
    return wheel, sdist


def _check(wheel: Path, sdist: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(CHECK), str(ROOT), str(wheel), str(sdist)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_whole_wheel_passes(tmp_path):
    done = _check(*_artefacts(tmp_path, None))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "left_out",
    [
        "fabrika_django/migrations/0001_initial.py",
        "fabrika_django/templates/admin/fabrika_django/overview.html",
        "fabrika_django/static/fabrika_django/admin.css",
        "fabrika_django/py.typed",
        "LICENSE",
    ],
)
def test_a_wheel_without_a_needed_file_fails_naming_it(tmp_path, left_out):
    done = _check(*_artefacts(tmp_path, left_out))
    assert done.returncode == 1
    assert f"lacks {left_out}" in done.stderr, done.stderr
