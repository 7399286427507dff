"""The last day by hour: attempts by outcome band and duration percentiles (folded into hourly rows by the
sampling job, from a fixed-bucket histogram), queue samples, and the charts drawn from them."""

import math
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from fabrika_django import _digest
from fabrika_django.admin._pictures import job_pictures
from fabrika_django.models import Attempt, AttemptHour, FoldedHour, QueueSample
from fabrika_django.ops import _history
from fabrika_django.ops._charts import Series, lines, stacked_bars
from fabrika_django.ops._history import FOLD_GRACE, HOURS, fold_hours, hour_slots, job_hours, queue_hours

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


def _exact(values, fraction):
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low), ordered[low], ordered[high]


def _width(seconds):
    low, high = _digest.bounds(_digest.bucket_of(seconds))
    return high - low


def _assert_close(estimate, values, fraction):
    """Within the width of the wider bucket of the two ranks the exact percentile lies between."""
    exact, below, above = _exact(values, fraction)
    assert abs(estimate - exact) <= max(_width(below), _width(above)), (estimate, exact, fraction, len(values))


@pytest.mark.parametrize("seed", range(40))
def test_digest_percentiles_are_within_a_buckets_width_of_the_exact_ones(seed):
    chance = random.Random(seed)
    size = chance.choice([1, 2, 3, 5, 20, 101, 1000])
    spread = chance.choice(["tight", "wide", "ties", "tiny"])
    if spread == "tight":
        values = [chance.gauss(2.0, 0.05) for _ in range(size)]
    elif spread == "wide":
        values = [math.exp(chance.uniform(math.log(0.0005), math.log(3600))) for _ in range(size)]
    elif spread == "ties":
        values = [chance.choice([0.25, 1.0, 7.5]) for _ in range(size)]
    else:
        values = [chance.uniform(0, 0.002) for _ in range(size)]
    values = [max(0.0, value) for value in values]
    counts = {}
    for value in values:
        counts[_digest.bucket_of(value)] = counts.get(_digest.bucket_of(value), 0) + 1
    counts = _digest.decode(_digest.encode(counts))  # as stored
    for fraction in (0.0, 0.5, 0.95, 1.0):
        _assert_close(_digest.percentile(counts, fraction), values, fraction)
    assert _digest.percentile({}, 0.5) is None


def test_buckets_are_nine_percent_wide_from_a_millisecond_to_twelve_days():
    assert _digest.bucket_of(-1.0) == _digest.bucket_of(0.0) == _digest.bucket_of(0.000999) == 0
    assert _digest.bucket_of(0.001) == 1 and _digest.bounds(1) == (0.001, 0.001 * 2 ** (1 / 8))
    for seconds in (0.0013, 0.5, 1.0, 59.9, 3600.0, 86400.0):
        low, high = _digest.bounds(_digest.bucket_of(seconds))
        assert low <= seconds < high and high / low == pytest.approx(2 ** (1 / 8))
    assert _digest.bucket_of(10**9) == _digest.LAST


def _history_of_two_jobs():
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


def _assert_two_jobs(hours):
    a = hours["a"]
    assert hour_slots(NOW)[-1] == datetime(2026, 12, 3, 20, tzinfo=UTC) and len(hour_slots(NOW)) == HOURS
    assert a.counts["succeeded"][-1] == 4 and sum(a.counts["succeeded"]) == 4
    assert [a.counts[band][-12] for band in ("handler_failed", "interrupted", "other")] == [1, 1, 1]
    _assert_close(a.p50[-1], [1, 2, 3, 4], 0.5)  # exact: 2.5 and 3.85
    _assert_close(a.p95[-1], [1, 2, 3, 4], 0.95)
    _assert_close(a.p50[-12], [10, 1, 1], 0.5)
    assert hours["b"].counts["timed_out"][-1] == 1
    _assert_close(hours["b"].p50[-1], [5], 0.5)
    assert sum(sum(values) for values in hours["c"].counts.values()) == 0 and hours["c"].p50 == [None] * HOURS


@pytest.mark.django_db
def test_attempts_are_counted_per_hour_and_band_with_duration_percentiles():
    _history_of_two_jobs()
    _assert_two_jobs(job_hours(["a", "b", "c"], NOW))


@pytest.mark.django_db
def test_folded_hours_draw_the_same_and_are_read_instead_of_the_attempts():
    _history_of_two_jobs()
    live = job_hours(["a", "b", "c"], NOW)
    assert fold_hours(NOW) == HOURS - 1  # every hour of the day that is over, empty ones too
    assert FoldedHour.objects.count() == HOURS - 1 and AttemptHour.objects.count() == 1  # a's hour at 09:00
    assert fold_hours(NOW) == 0  # nothing left to fold
    # The folded hour is read from its row: the attempts behind it no longer matter.
    Attempt.objects.filter(started__lt=datetime(2026, 12, 3, 20, tzinfo=UTC)).delete()
    folded = job_hours(["a", "b", "c"], NOW)
    assert folded == live
    _assert_two_jobs(folded)


@pytest.mark.django_db
def test_an_hour_is_folded_after_its_grace_and_again_while_attempts_of_it_were_running():
    hour = datetime(2026, 12, 3, 19, tzinfo=UTC)
    Attempt.objects.bulk_create([_attempt("a", hour + timedelta(minutes=10), 2)])
    running = Attempt.objects.create(
        job="a", run_id=uuid.uuid4(), trigger="schedule", number=1, started=hour + timedelta(minutes=50)
    )
    before_grace = hour + timedelta(hours=1) + FOLD_GRACE - timedelta(seconds=1)
    fold_hours(before_grace)
    assert not FoldedHour.objects.filter(hour=hour).exists()
    at = hour + timedelta(hours=1) + FOLD_GRACE
    fold_hours(at)
    assert FoldedHour.objects.get(hour=hour).running == 1
    assert job_hours(["a"], at)["a"].counts["succeeded"][-2] == 1
    Attempt.objects.filter(pk=running.pk).update(outcome="succeeded", finished=hour + timedelta(minutes=70))
    assert fold_hours(at + timedelta(minutes=5)) == 1  # only that hour, again
    assert FoldedHour.objects.get(hour=hour).running == 0
    drawn = job_hours(["a"], at + timedelta(minutes=5))["a"]
    assert drawn.counts["succeeded"][-2] == 2
    _assert_close(drawn.p95[-2], [2, 1200], 0.95)
    assert fold_hours(at + timedelta(minutes=10)) == 0


@pytest.mark.django_db
def test_the_database_puts_each_duration_in_the_bucket_python_does():
    """On PostgreSQL the buckets are computed in SQL (``_digest.bucket_sql``): the same as ``bucket_of``."""
    start = datetime(2026, 12, 3, 19, tzinfo=UTC)
    durations = [0.0, 0.0004, 0.001, 0.00123, 0.004, 0.0999, 0.5, 1.0, 1.024, 1.5, 2.0, 59.9, 61.0, 3599.0, 86400.0]
    Attempt.objects.bulk_create([_attempt(f"j{n}", start, seconds) for n, seconds in enumerate(durations)])
    Attempt.objects.bulk_create([_attempt("late", start + timedelta(seconds=1), -1.0)])  # two hosts' clocks
    grouped = {job: bucket for job, _hour, _outcome, bucket, _count in _history._grouped_attempts(start, NOW)}
    expected = {f"j{n}": _digest.bucket_of(seconds) for n, seconds in enumerate(durations)}
    assert grouped == {**expected, "late": 0}


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
    before = timezone.now()
    assert run_job("fabrika_sample_queues").ok
    after = timezone.now()
    taken = QueueSample.objects.exclude(pk=old.pk).get(queue="reminders.Reminder")
    assert (taken.waiting, taken.due_now, taken.dead) == (1, 1, 0)

    def over(moment):  # the day's hours that ended FOLD_GRACE before ``moment``: 22 in an hour's first minutes
        return sum(1 for hour in hour_slots(moment) if hour + timedelta(hours=1) + FOLD_GRACE <= moment)

    # The same run folded the day's hours that are over (the job read its clock between before and after).
    folded = FoldedHour.objects.count()
    assert folded in {over(before), over(after)}
    stale = timezone.now() - timedelta(days=31)
    FoldedHour.objects.create(hour=stale, folded=stale)
    AttemptHour.objects.create(hour=stale, job="gone")
    assert run_job("fabrika_prune_history").ok
    assert not QueueSample.objects.filter(pk=old.pk).exists()
    assert QueueSample.objects.filter(pk=taken.pk).exists()
    assert not FoldedHour.objects.filter(hour=stale).exists() and not AttemptHour.objects.filter(job="gone").exists()
    assert FoldedHour.objects.count() == folded  # the day's folds are kept


@pytest.mark.django_db
@pytest.mark.parametrize(("count", "said"), [(1, "1 attempt in the last 24 hours"), (2, "2 attempts in the last")])
def test_the_attempts_summary_counts_in_the_plural_only_past_one(count, said):
    Attempt.objects.bulk_create(_attempt("a", NOW - timedelta(minutes=10 + n), 0.2) for n in range(count))
    summary = job_pictures(["a"], NOW)["a"]["attempts_summary"]
    assert summary.startswith(said), summary
