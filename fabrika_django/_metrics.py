"""The worker's own metrics (prometheus-client, the extra ``prometheus``): off until a worker serves them.

``fabrika_job worker --metrics-port PORT [--metrics-addr ADDR]`` calls ``serve(PORT, ADDR)``, which makes the
instruments and serves them at ``/metrics`` (``_metrics_http``: bounded connections, the metrics token); until
then every ``observe_*`` is one ``None`` test, so a project without the extra (or a worker without the flag, or
``run_job`` in a test) pays nothing. Names are public; labels are the job and the outcome, never a row id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, TypeVar

from django.core.exceptions import ImproperlyConfigured

from . import _metrics_http

try:  # an optional dependency: fabrika works without it, only the metrics need it
    import prometheus_client
except ImportError:  # pragma: no cover  exercised by projects without the extra
    prometheus_client = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_CLAIM_BUCKETS = (0, 1, 5, 10, 25, 50, 100, 250, 500)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def require_prometheus() -> ModuleType:
    """Return the prometheus_client module, or say how to install it."""
    if prometheus_client is None:
        raise ImproperlyConfigured(
            'fabrika_django\'s metrics need prometheus-client: pip install "fabrika-django[prometheus]".'
        )
    return prometheus_client


@dataclass
class _Instruments:
    registry: CollectorRegistry
    attempts: Counter
    duration: Histogram
    claim_rows: Histogram
    kick_latency: Histogram
    in_progress: Gauge
    rate_limited: Counter


def _make_instruments() -> _Instruments:
    client = require_prometheus()
    registry = client.CollectorRegistry(auto_describe=True)
    return _Instruments(
        registry=registry,
        attempts=client.Counter(
            "fabrika_attempts", "Attempts that ended, by job and outcome.", ["job", "outcome"], registry=registry
        ),
        duration=client.Histogram(
            "fabrika_attempt_duration_seconds",
            "How long attempts took, by job.",
            ["job"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        ),
        claim_rows=client.Histogram(
            "fabrika_claim_rows", "Rows each claim took, by job.", ["job"], buckets=_CLAIM_BUCKETS, registry=registry
        ),
        kick_latency=client.Histogram(
            "fabrika_kick_start_latency_seconds",
            "From a kick to the start of the run that served it, by job.",
            ["job"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        ),
        in_progress=client.Gauge(
            "fabrika_runs_in_progress", "Runs this worker executes now, by job.", ["job"], registry=registry
        ),
        # prometheus-client serves a counter with ``_total`` appended: fabrika_job_rate_limited_seconds_total.
        rate_limited=client.Counter(
            "fabrika_job_rate_limited_seconds",
            "Seconds the claims of a rate-limited job waited for its rate, by job.",
            ["job"],
            registry=registry,
        ),
    )


_instruments: _Instruments | None = None
_server: _metrics_http.Server | None = None


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Turn the worker's instruments on and serve them at ``http://addr:port/metrics`` (see ``_metrics_http``)."""
    global _instruments, _server
    instruments = _make_instruments()

    def render() -> tuple[bytes, str]:
        return prometheus_client.generate_latest(instruments.registry), prometheus_client.CONTENT_TYPE_LATEST

    _server = _metrics_http.Server(addr, port, render)
    _instruments = instruments
    logger.info("Metrics served addr=%s port=%d", addr, port)


def stop() -> None:
    """Turn the instruments off and stop serving them: the worker's end (``fabrika_job worker``)."""
    global _instruments, _server
    _instruments = None
    if _server is not None:
        _server.close()
        _server = None


def observe_attempt(job: str, outcome: str, seconds: float) -> None:
    """Count an ended attempt of ``job`` by its outcome, and its duration."""
    instruments = _instruments
    if instruments is None:
        return
    instruments.attempts.labels(job, outcome).inc()
    instruments.duration.labels(job).observe(max(0.0, seconds))


def observe_claim(job: str, rows: int) -> None:
    """Record how many rows a claim took."""
    instruments = _instruments
    if instruments is not None:
        instruments.claim_rows.labels(job).observe(rows)


def observe_rate_limited(job: str, seconds: float) -> None:
    """Count the seconds a rate-limited job's claim waited for a token (``_runs.ratelimit``)."""
    instruments = _instruments
    if instruments is not None:
        instruments.rate_limited.labels(job).inc(max(0.0, seconds))


class KickReads(Protocol):
    """The two reads that time a kick's wait for its run's start (``_runs.reads.KickWait``)."""

    def kicked(self) -> datetime | None: ...

    def started(self, kicked: datetime) -> datetime | None: ...


@contextmanager
def run_in_progress(job: str, kick: KickReads | None) -> Iterator[None]:
    """Count the run as in progress; for a kick's run (``kick``), record how long the kick waited for its start.

    The wait is the first attempt's ``started`` less when the kick came as the run found it (the job's
    ``pending_since``, else its oldest kick row's ``created``): written by the database's clock on PostgreSQL,
    so hosts' clocks do not skew it. Two or three reads, only while metrics are on.
    """
    instruments = _instruments
    if instruments is None:
        yield
        return
    kicked = _quietly(kick.kicked) if kick is not None else None
    gauge = instruments.in_progress.labels(job)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()
        if kick is not None and kicked is not None:
            started = _quietly(kick.started, kicked)
            if started is not None:
                instruments.kick_latency.labels(job).observe((started - kicked).total_seconds())


def _quietly(read: Callable[..., _T], *args: object) -> _T | None:
    """Run a metrics read; a failure costs the observation, never the run (the worker sees the database's)."""
    try:
        return read(*args)
    except Exception as exc:
        logger.warning("Metrics read failed error=%s", type(exc).__name__)
        return None
