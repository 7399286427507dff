"""Benchmark the file sweep on a large ``FileSystemStorage``: files/s, and peak RSS that does not grow with the files.

    .venv/bin/python -m bench.sweep [--files 100000] [--small 10000] [--database-url postgres://…/fabrika_bench_sweep]

A temporary MEDIA_ROOT gets ``--files`` small files in 100 folders, all older than the grace period; every other one
is referenced by a row of ``reports.ReportRequest`` (its ``result`` column), the rest are orphans. Two ways, each in
a fresh process so its peak RSS (``VmHWM``) is its own:

- ``floor``: ``os.scandir`` of every folder, ``lstat`` and ``unlink`` of each orphan, knowing the orphans in advance
  (no database): the file system's own limit for the same deletions;
- ``sweep``: ``fabrika_django.ops._sweep.sweep()`` as the built-in job runs it: the streamed listing,
  the reference check of each batch of 500, and the deleting step (``LOCK TABLE … IN SHARE MODE NOWAIT``,
  the re-check, the unlinks).

It prints files examined per second, the sweep's share of the floor's, and peak RSS at ``--small`` and ``--files``
files, against a process that only sets Django up: bounded memory means the same peak at both sizes. It checks that
exactly the orphans went. A benchmark, not a test: apart from that check it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench._setup import create_database, out, setup_django

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/fabrika_bench_sweep"
FOLDERS = 100
OLD = time.time() - 30 * 24 * 3600


def _name(number: int) -> str:
    return f"bench/{number % FOLDERS:03d}/file-{number:07d}.bin"


def _make_files(root: str, count: int) -> None:
    for folder in range(FOLDERS):
        os.makedirs(os.path.join(root, "bench", f"{folder:03d}"), exist_ok=True)
    for number in range(count):
        path = os.path.join(root, *_name(number).split("/"))
        with open(path, "wb") as handle:
            handle.write(b"x" * 64)
        os.utime(path, (OLD, OLD))


def _peak_rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _child(way: str, media: str, url: str, count: int) -> None:
    """One measured way, in a fresh process; prints a JSON line."""
    os.environ["MEDIA_ROOT"] = media
    setup_django(url, lab=True)
    started = time.perf_counter()
    deleted = 0
    if way == "floor":
        orphans = {_name(number) for number in range(1, count, 2)}
        for folder in range(FOLDERS):
            prefix = f"bench/{folder:03d}/"
            with os.scandir(os.path.join(media, "bench", f"{folder:03d}")) as entries:
                for entry in entries:
                    entry.stat(follow_symlinks=False)
                    if prefix + entry.name in orphans:
                        os.unlink(entry.path)
                        deleted += 1
    elif way == "sweep":
        from fabrika_django.ops import _sweep

        report = _sweep.sweep({"storages": ["default"], "older_than_days": 7})
        deleted = report.deleted
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "deleted": deleted, "peak_kib": _peak_rss_kib()}))


def _measure(way: str, media: str, url: str, count: int) -> dict:
    command = [sys.executable, "-m", "bench.sweep", "--child", way, "--media", media, "--database-url", url]
    command += ["--files", str(count)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _reset(media: str, count: int) -> None:
    from testproject.reports.models import ReportRequest

    shutil.rmtree(media, ignore_errors=True)
    _make_files(media, count)
    ReportRequest.objects.all().delete()
    ReportRequest.objects.bulk_create(
        (ReportRequest(result=_name(number)) for number in range(0, count, 2)), batch_size=5000
    )


def _left(media: str) -> int:
    return sum(len(files) for _, _, files in os.walk(media))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--child", choices=["floor", "sweep", "idle"], help=argparse.SUPPRESS)
    parser.add_argument("--media", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        _child(options.child, options.media, options.database_url, options.files)
        return

    create_database(options.database_url)
    media = tempfile.mkdtemp(prefix="fabrika-bench-sweep-")
    os.environ["MEDIA_ROOT"] = media
    setup_django(options.database_url, lab=True)
    try:
        idle = _measure("idle", media, options.database_url, 0)
        out(
            f"file sweep bench: {FOLDERS} folders, half the files referenced; peak RSS of Django alone "
            f"{idle['peak_kib'] / 1024:.1f} MiB"
        )
        out(f"{'files':>8} {'way':>6} {'files/s':>9} {'deleted':>8} {'of floor':>9} {'peak RSS':>10}")
        for count in (options.small, options.files):
            figures = {}
            for way in ("floor", "sweep"):
                _reset(media, count)
                figures[way] = _measure(way, media, options.database_url, count)
                left = _left(media)
                if left != count - count // 2:
                    raise SystemExit(f"{way} left {left} files, not the {count - count // 2} referenced ones")
            for way, figure in figures.items():
                rate = count / figure["seconds"]
                share = figure["seconds"] and figures["floor"]["seconds"] / figure["seconds"]
                out(
                    f"{count:>8} {way:>6} {rate:>9.0f} {figure['deleted']:>8} {share:>8.0%} "
                    f"{figure['peak_kib'] / 1024:>7.1f} MiB"
                )
    finally:
        shutil.rmtree(media, ignore_errors=True)
        from testproject.reports.models import ReportRequest

        ReportRequest.objects.all().delete()


if __name__ == "__main__":
    main()
