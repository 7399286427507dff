"""``fabrika_django.metrics.view``: the database's gauges for Prometheus, computed at scrape time.

Route it in the project (``path("metrics/fabrika/", fabrika_django.metrics.view)``). It answers a staff user's
session, or a scraper that sends ``Authorization: Bearer <FABRIKA["METRICS_TOKEN"]>``. Every gauge comes from
the overview's bounded reads: one counting statement per queue table, and one read each of the jobs and their
leases. Needs the extra ``fabrika-django[prometheus]``.

Gauges (public names: dashboards and alerts match them): ``fabrika_queue_rows{queue, state}`` (waiting includes
due now; done is counted up to 10,000, and 10,001 means more), ``fabrika_queue_oldest_due_age_seconds{queue}``,
``fabrika_job_active_lanes{job}``, ``fabrika_job_pending{job}``, ``fabrika_job_failures_in_row{job}``,
``fabrika_job_last_success_age_seconds{job}`` (absent until the job first succeeds).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from ._metrics import require_prometheus
from ._metrics_http import bearer_matches
from .ops._counts import count_queue, queue_models
from .ops._report import job_states

_client = require_prometheus()  # routing the view without the extra fails at start-up, saying what to install
from prometheus_client.core import GaugeMetricFamily  # noqa: E402  after the check above

#: Done rows are counted up to this many, as the overview does: 10,001 means "more".
_DONE_CAP = 10_000


class _DatabaseGauges:
    """A collector that reads the database each time it is collected (each scrape)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._queues()
        yield from self._jobs()

    def _queues(self) -> Iterator[GaugeMetricFamily]:
        rows = GaugeMetricFamily(
            "fabrika_queue_rows",
            "Rows of a queue table by state (waiting includes due_now).",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "fabrika_queue_oldest_due_age_seconds", "Age of the oldest due row (0: none due).", labels=["queue"]
        )
        for model in queue_models():
            counts = count_queue(model, self.now, cap=_DONE_CAP)
            label = model._meta.label
            for state in ("waiting", "due_now", "dead", "done"):
                rows.add_metric([label, state], getattr(counts, state))
            age = (self.now - counts.oldest_due).total_seconds() if counts.oldest_due else 0.0
            oldest.add_metric([label], max(0.0, age))
        yield rows
        yield oldest

    def _jobs(self) -> Iterator[GaugeMetricFamily]:
        active = GaugeMetricFamily("fabrika_job_active_lanes", "Runs of the job active now.", labels=["job"])
        pending = GaugeMetricFamily("fabrika_job_pending", "1 when the job waits for one more run.", labels=["job"])
        failures = GaugeMetricFamily(
            "fabrika_job_failures_in_row", "Runs that failed since the last success.", labels=["job"]
        )
        since = GaugeMetricFamily(
            "fabrika_job_last_success_age_seconds", "Seconds since the job last succeeded.", labels=["job"]
        )
        for state in job_states(self.now):
            name = state.name
            active.add_metric([name], state.active_lanes)
            pending.add_metric([name], 1 if state.pending else 0)
            failures.add_metric([name], state.failures_in_row)
            if state.last_success is not None:
                since.add_metric([name], max(0.0, (self.now - state.last_success).total_seconds()))
        yield from (active, pending, failures, since)


@never_cache
@require_GET
def view(request: HttpRequest) -> HttpResponse:
    """Serve fabrika's database gauges in Prometheus' text format, to staff or to the bearer of METRICS_TOKEN."""
    user: Any = getattr(request, "user", None)
    staff = bool(user is not None and user.is_active and user.is_staff)
    if not staff and not bearer_matches(request.headers.get("Authorization", "")):
        if user is not None and user.is_authenticated:
            return HttpResponse("Staff only.\n", status=403, content_type="text/plain")
        response = HttpResponse(
            "Log in as staff, or send Authorization: Bearer with FABRIKA['METRICS_TOKEN'].\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="fabrika metrics"'
        return response
    registry_ = _client.CollectorRegistry(auto_describe=False)
    registry_.register(_DatabaseGauges(timezone.now()))
    return HttpResponse(_client.generate_latest(registry_), content_type=_client.CONTENT_TYPE_LATEST)


__all__ = ["view"]
