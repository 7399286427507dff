"""bin/release-check's look inside the artefacts: the wheel must carry every template, static file and migration
of the checkout's package, its ``py.typed`` and the licence; the sdist the licence too.

Usage: python bin/_wheel_contents.py ROOT WHEEL SDIST. Exit 1 names every file missing, one line each.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path


def needed_in_wheel(root: Path) -> list[str]:
    """The package files a project needs at run time that are not plain modules: data and migrations."""
    package = root / "fabrika_django"
    wanted = [package / "py.typed"]
    for folder in ("templates", "static"):
        wanted += [path for path in (package / folder).rglob("*") if path.is_file()]
    wanted += [path for path in (package / "migrations").glob("*.py")]
    return sorted(str(path.relative_to(root)) for path in wanted if "__pycache__" not in path.parts)


def main(root: Path, wheel: Path, sdist: Path) -> int:
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    missing = [f"{wheel.name} lacks {name}" for name in needed_in_wheel(root) if name not in in_wheel]
    if not any(
        name.endswith(".dist-info/licenses/LICENSE") or name.endswith(".dist-info/LICENSE") for name in in_wheel
    ):
        missing.append(f"{wheel.name} lacks LICENSE")
    if "LICENSE" not in in_sdist:
        missing.append(f"{sdist.name} lacks LICENSE")
    for line in missing:
        sys.stderr.write(f"release-check: {line}\n")
    if not missing:
        sys.stdout.write(f"{wheel.name}: every template, static file, migration, py.typed and LICENSE is there\n")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
