"""The overview's pictures of the last 24 hours: per job, attempts by outcome and duration p50/p95; per queue,
the due and dead backlog from the samples. Read by ``_history`` (bounded by time), drawn by ``_charts``, each
with a sentence that says what the chart shows (shown under it, and the SVG's description)."""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from django.utils.safestring import SafeString
from django.utils.text import slugify
from django.utils.translation import ngettext

from ..models import Outcome
from ..ops._charts import Series, legend, lines, stacked_bars
from ..ops._history import JobHours, QueueHours, hour_slots, job_hours, queue_hours

_BAND_LABELS = {
    Outcome.SUCCEEDED: "succeeded",
    Outcome.HANDLER_FAILED: "handler failed",
    Outcome.TIMED_OUT: "timed out",
    "interrupted": "interrupted (lease lost, shutdown, crash)",
    "other": "other failure",
}
_BAND_CSS = {
    Outcome.SUCCEEDED: "ok",
    Outcome.HANDLER_FAILED: "fail",
    Outcome.TIMED_OUT: "timeout",
    "interrupted": "interrupted",
    "other": "other",
}


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value < 100 else f"{value:.0f} s"


def _attempts_summary(hours: JobHours, slots: list[datetime]) -> str:
    totals = [sum(band[index] for band in hours.counts.values()) for index in range(len(slots))]
    total = sum(totals)
    if not total:
        return "No attempt in the last 24 hours."
    by_band = {band: sum(values) for band, values in hours.counts.items() if sum(values)}
    failed = total - by_band.get(Outcome.SUCCEEDED, 0)
    parts = ", ".join(f"{count} {_BAND_LABELS[band]}" for band, count in by_band.items())
    busiest = max(range(len(slots)), key=lambda index: totals[index])
    counted = ngettext("%(count)d attempt", "%(count)d attempts", total) % {"count": total}
    return (
        f"{counted} in the last 24 hours ({parts}); {failed} failed. "
        f"Busiest hour {slots[busiest]:%H:%M} UTC with {totals[busiest]}."
    )


def _duration_summary(hours: JobHours) -> str:
    p50 = [value for value in hours.p50 if value is not None]
    p95 = [value for value in hours.p95 if value is not None]
    if not p50:
        return "No attempt finished in the last 24 hours."
    return (
        f"Median attempt per hour between {_seconds(min(p50))} and {_seconds(max(p50))}; "
        f"the slowest 5% took up to {_seconds(max(p95))} (p95)."
    )


def _backlog_summary(hours: QueueHours, slots: list[datetime]) -> str:
    seen = [index for index, value in enumerate(hours.due_now) if value is not None]
    if not seen:
        return "No sample in the last 24 hours: the built-in job fabrika_sample_queues takes one every five minutes."

    def peak(values: list[int | None]) -> str:
        index = max(seen, key=lambda position: values[position] or 0)
        return f"{values[index]} at {slots[index]:%H:%M} UTC"

    last = seen[-1]
    return (
        f"Due now peaked at {peak(hours.due_now)} and was {hours.due_now[last]} at the last sample; "
        f"dead peaked at {peak(hours.dead)} and was {hours.dead[last]}."
    )


class JobPicture(TypedDict):
    """A job's two charts on the overview, with their legends and summaries; ``empty``: no attempt in the window."""

    attempts: SafeString
    attempts_legend: SafeString
    attempts_summary: str
    duration: SafeString
    duration_legend: SafeString
    duration_summary: str
    empty: bool


class QueuePicture(TypedDict):
    """A queue table's backlog chart on the overview; ``empty``: no sample in the window."""

    backlog: SafeString
    legend: SafeString
    summary: str
    empty: bool


def job_pictures(names: list[str], now: datetime) -> dict[str, JobPicture]:
    """Return per job its two charts (attempts, duration) with their legends and summaries."""
    slots = hour_slots(now)
    pictures: dict[str, JobPicture] = {}
    for name, hours in job_hours(names, now).items():
        key = slugify(name) or "job"
        bands = [Series(_BAND_LABELS[band], _BAND_CSS[band], hours.counts[band]) for band in _BAND_LABELS]
        shown = [band for band in bands if any(band.values)] or bands[:1]
        attempts_summary = _attempts_summary(hours, slots)
        durations = [Series("p50", "p50", hours.p50), Series("p95", "p95", hours.p95)]
        duration_summary = _duration_summary(hours)
        pictures[name] = {
            "attempts": stacked_bars(
                f"fabrika-attempts-{key}", f"{name}: attempts per hour by outcome", attempts_summary, slots, bands
            ),
            "attempts_legend": legend(shown),
            "attempts_summary": attempts_summary,
            "duration": lines(
                f"fabrika-duration-{key}",
                f"{name}: attempt duration p50 and p95",
                duration_summary,
                slots,
                durations,
                "s",
            ),
            "duration_legend": legend(durations),
            "duration_summary": duration_summary,
            "empty": not any(any(values) for values in hours.counts.values()),
        }
    return pictures


def queue_pictures(labels: list[str], now: datetime) -> dict[str, QueuePicture]:
    """Return per queue table its backlog chart (due now and dead) with its legend and summary."""
    slots = hour_slots(now)
    pictures: dict[str, QueuePicture] = {}
    for label, hours in queue_hours(labels, now).items():
        series = [Series("due now", "due", hours.due_now), Series("dead", "dead", hours.dead)]
        summary = _backlog_summary(hours, slots)
        pictures[label] = {
            "backlog": lines(
                f"fabrika-backlog-{slugify(label)}", f"{label}: due and dead rows per hour", summary, slots, series
            ),
            "legend": legend(series),
            "summary": summary,
            "empty": all(value is None for value in hours.due_now),
        }
    return pictures
