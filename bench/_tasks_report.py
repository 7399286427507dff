"""bench/tasks.py's report: each way's figure, and fabrika's as a ratio of each peer's (fabrika / peer) beside
the targets: the tasks backend's against django-tasks-db, the performance targets against both peers."""

from __future__ import annotations

from bench._setup import out

PGQUEUER_ENQUEUES = ("PgQueuer (asyncpg)", "PgQueuer sync (psycopg)")
FABRIKA_ENQUEUES = ("fabrika task", "queue row + kick()", "row + kick(), atomic")
LATENCY_TITLES = (
    ("fabrika", "fabrika (LISTEN)"),
    ("floor", "PostgreSQL alone (floor)"),
    ("db", "django-tasks-db (0.1 s poll)"),
    ("pgqueuer", "PgQueuer (LISTEN)"),
)


def report(rates: dict[str, float], drains: dict[str, float], latencies: dict[str, list[float]]) -> None:
    out()
    if rates:
        _enqueue(rates)
    if drains:
        _drain(drains)
    if latencies:
        _latency(latencies)


def _verdict(ratio: float, target: float, *, at_most: bool = False) -> str:
    met = ratio <= target if at_most else ratio >= target
    return "meets" if met else "MISSES"


def _enqueue(rates: dict[str, float]) -> None:
    theirs, atomic = rates["django-tasks-db task"], rates["theirs, atomic"]
    pgqueuer = max(rates[name] for name in PGQUEUER_ENQUEUES)  # the peer's faster API is the one to reach
    out("enqueue, one at a time (median of 3 rounds)")
    for name, rate in rates.items():
        if name == "theirs, atomic" or name in PGQUEUER_ENQUEUES:
            out(f"  {name:<24} {rate:8.0f} /s")
            continue
        line = f"  {name:<24} {rate:8.0f} /s   {rate / theirs:5.2f}x django-tasks-db   (target >= 0.90x)"
        if name in FABRIKA_ENQUEUES:
            ratio = rate / pgqueuer
            line += f"   {ratio:5.2f}x PgQueuer (next target: >= 1.0x, {_verdict(ratio, 1.0)})"
        out(line)
    row = rates["row + kick(), atomic"]
    out(f"  in one atomic() each: row + kick() {row / atomic:5.2f}x their task enqueued in one atomic()")
    out(f"  PgQueuer's enqueue, the faster of its two APIs: {pgqueuer:.0f} /s")


def _drain(drains: dict[str, float]) -> None:
    out("drain, one worker")
    fabrika, theirs, pgqueuer = drains["fabrika"], drains["db"], drains["pgqueuer"]
    out(
        f"  fabrika                  {fabrika:8.0f} /s   {fabrika / theirs:5.2f}x django-tasks-db   (target >= 5x; "
        f"the next target too, {_verdict(fabrika / theirs, 5.0)})   {fabrika / pgqueuer:5.2f}x PgQueuer "
        f"(next target: >= 0.5x, {_verdict(fabrika / pgqueuer, 0.5)})"
    )
    out(f"  django-tasks-db          {theirs:8.0f} /s")
    out(f"  PgQueuer, batch 10       {pgqueuer:8.0f} /s")


def _latency(latencies: dict[str, list[float]]) -> None:
    out("enqueue-to-start latency, idle worker (ms)")
    figures = {}
    for way, title in LATENCY_TITLES:
        figures[way] = [_percentile(latencies[way], f) * 1000 for f in (0.5, 0.95, 0.99)]
        p50, p95, p99 = figures[way]
        out(f"  {title:<28} p50 {p50:6.1f}  p95 {p95:6.1f}  p99 {p99:6.1f}   (fabrika target p50 <= 3, p99 <= 12)")
    ratios = "  ".join(
        f"{name} {f / o:.0%}"
        for name, f, o in zip(("p50", "p95", "p99"), figures["floor"], figures["fabrika"], strict=True)
    )
    out(f"  floor / fabrika: {ratios}")
    (p50, _p95, p99), peer_p50 = figures["fabrika"], figures["pgqueuer"][0]
    behind, spread = p50 / peer_p50, p99 / p50
    out(
        f"  fabrika / PgQueuer p50: {behind:.2f}x (next target: <= 1.0x, {_verdict(behind, 1.0, at_most=True)});"
        f"  fabrika p99 / p50: {spread:.1f}x (next target: <= 3x, {_verdict(spread, 3.0, at_most=True)})"
    )


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
