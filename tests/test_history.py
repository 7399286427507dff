"""The last day by hour: attempts by outcome band and duration percentiles (PostgreSQL computes them, other
databases here, with the same interpolation), queue samples, and the charts drawn from them."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from fabrika_django._charts import Series, lines, stacked_bars
from fabrika_django._history import HOURS, hour_slots, job_hours, queue_hours
from fabrika_django.models import Attempt, QueueSample

NOW = datetime(2026, 12, 3, 20, 30, tzinfo=UTC)


def _attempt(job, started, seconds, outcome="succeeded"):
    return Attempt(
        job=job,
        run_id=uuid.uuid4(),
        trigger="schedule",
        number=1,
        outcome=outcome,
        started=started,
        finished=started + timedelta(seconds=seconds),
    )


@pytest.mark.django_db
def test_attempts_are_counted_per_hour_and_band_with_duration_percentiles():
    this_hour, earlier = datetime(2026, 12, 3, 20, 5, tzinfo=UTC), datetime(2026, 12, 3, 9, 10, tzinfo=UTC)
    Attempt.objects.bulk_create(
        [
            *(_attempt("a", this_hour + timedelta(minutes=n), seconds) for n, seconds in enumerate((1, 2, 3, 4))),
            _attempt("a", earlier, 10, "handler_failed"),
            _attempt("a", earlier, 1, "lease_lost"),
            _attempt("a", earlier, 1, "capability_refused"),
            _attempt("a", NOW - timedelta(hours=25), 1),  # older than the day: not counted
            _attempt("b", this_hour, 5, "timed_out"),
        ]
    )
    hours = job_hours(["a", "b", "c"], NOW)
    a = hours["a"]
    assert hour_slots(NOW)[-1] == datetime(2026, 12, 3, 20, tzinfo=UTC) and len(hour_slots(NOW)) == HOURS
    assert a.counts["succeeded"][-1] == 4 and sum(a.counts["succeeded"]) == 4
    assert [a.counts[band][-12] for band in ("handler_failed", "interrupted", "other")] == [1, 1, 1]
    assert (a.p50[-1], round(a.p95[-1], 6)) == (2.5, 3.85)
    assert hours["b"].counts["timed_out"][-1] == 1 and hours["b"].p50[-1] == 5.0
    assert sum(sum(values) for values in hours["c"].counts.values()) == 0 and hours["c"].p50 == [None] * HOURS


@pytest.mark.django_db
def test_queue_hours_keep_the_largest_sample_of_each_hour():
    QueueSample.objects.bulk_create(
        [
            QueueSample(queue="q.Q", sampled=NOW - timedelta(minutes=5), due_now=3, dead=1),
            QueueSample(queue="q.Q", sampled=NOW - timedelta(minutes=10), due_now=7, dead=0),
            QueueSample(queue="q.Q", sampled=NOW - timedelta(hours=2), due_now=2, dead=2),
        ]
    )
    hours = queue_hours(["q.Q"], NOW)["q.Q"]
    assert (hours.due_now[-1], hours.dead[-1], hours.due_now[-3], hours.dead[-3]) == (7, 1, 2, 2)
    assert hours.due_now[-2] is None


def test_charts_are_labelled_images_with_a_title_per_bar_and_point():
    slots = hour_slots(NOW)
    bars = stacked_bars("c1", "Attempts <a>", "3 attempts & more", slots, [Series("ok", "ok", [0] * 23 + [3])])
    assert bars.startswith('<svg class="fabrika-chart" id="c1" viewBox="0 0 480 150" role="img"')
    assert '<title id="c1-title">Attempts &lt;a&gt;</title><desc id="c1-desc">3 attempts &amp; more</desc>' in bars
    assert bars.count("<rect ") == 1 and "<title>20:00 UTC: 3 ok</title>" in bars
    drawn = lines("c2", "T", "S", slots, [Series("p50", "p50", [None] * 22 + [1.5, 2.0])], "s")
    assert drawn.count("<circle ") == 2 and "<title>20:00 UTC: p50 2 s</title>" in drawn
    assert ">2 s</text>" in drawn  # the axis top


@pytest.mark.django_db
def test_samples_are_taken_by_the_built_in_job_and_pruned_with_the_history():
    from django.utils import timezone

    from fabrika_django.testing import run_job
    from testproject.reminders.models import Reminder

    Reminder.objects.create(note="due", email="a@example.com", due=timezone.now() - timedelta(minutes=3))
    old = QueueSample.objects.create(queue="reminders.Reminder", sampled=timezone.now() - timedelta(days=31))
    assert run_job("fabrika_sample_queues").ok
    taken = QueueSample.objects.exclude(pk=old.pk).get(queue="reminders.Reminder")
    assert (taken.waiting, taken.due_now, taken.dead) == (1, 1, 0)
    assert run_job("fabrika_prune_history").ok
    assert not QueueSample.objects.filter(pk=old.pk).exists()
    assert QueueSample.objects.filter(pk=taken.pk).exists()
