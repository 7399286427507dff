"""QueueQuerySet: the state filters, claim() (order, backoff, dead rows, refusals, statements) and finish_all()."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import F, Q
from django.test.utils import CaptureQueriesContext

from fabrika_django import queues
from fabrika_django.exceptions import ClaimInsideTransaction, ClaimOutsideJob
from fabrika_django.testing import run_job
from testproject.outbox.models import OutboxMail
from testproject.reminders.models import Reminder
from testproject.reports.models import ReportRequest

from .conftest import make_job
from .factories import OutboxMailFactory, PersonFactory, ReminderFactory, ReportRequestFactory
from .jobs_helpers import temporary_job

pytestmark = pytest.mark.django_db

NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def _verbs(queries):
    """The first word of each statement, savepoints left out: what a claim costs however it is wrapped."""
    verbs = [query["sql"].split(None, 1)[0].upper() for query in queries]
    return [verb for verb in verbs if verb not in ("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT")]


def _claim_statements(*, found=True):
    """A plain claim's statements: with no row found, the long way stops after its read."""
    if connection.vendor == "postgresql":
        return ["WITH"]  # the read, the lease and the lane ask in one statement (_runs.claim._claim_in_one)
    # SQLite has no row locks: it takes the database write lock (an UPDATE that matches nothing) first.
    statements = ["SELECT", "UPDATE"] if connection.vendor != "sqlite" else ["UPDATE", "SELECT", "UPDATE"]
    return statements if found else statements[:-1]


def _fields(row):
    return (row.attempts, row.due, row.version, row.last_failure)


# --- state filters ---------------------------------------------------------------------------------------


def test_state_filters_and_row_state_split_rows_into_waiting_dead_and_done():
    waiting_due = ReminderFactory(due=NOON - MINUTE)
    waiting_later = ReminderFactory(due=NOON + MINUTE, attempts=2)
    dead = ReminderFactory(due=NOON - MINUTE, attempts=3)  # Reminder.Queue.max_attempts = 3
    done = ReminderFactory(due=None, attempts=1)

    assert list(Reminder.objects.waiting().order_by("pk")) == [waiting_due, waiting_later]
    assert list(Reminder.objects.due_now(NOON)) == [waiting_due]
    assert list(Reminder.objects.dead()) == [dead]
    assert list(Reminder.objects.done()) == [done]
    assert [row.state for row in (waiting_due, waiting_later, dead, done)] == ["waiting", "waiting", "dead", "done"]


def test_state_filters_use_the_model_s_max_attempts_or_ten_by_default():
    nine = ReportRequestFactory(due=NOON - MINUTE, attempts=9)
    ten = ReportRequestFactory(due=NOON - MINUTE, attempts=10)

    assert list(ReportRequest.objects.waiting()) == [nine]
    assert list(ReportRequest.objects.dead()) == [ten]
    assert (nine.state, ten.state) == ("waiting", "dead")


def test_state_filters_chain_with_other_filters():
    mine = OutboxMailFactory(kind="welcome", due=NOON - MINUTE)
    OutboxMailFactory(kind="digest", due=NOON - MINUTE)

    assert list(OutboxMail.objects.filter(kind="welcome").due_now(NOON)) == [mine]
    assert list(OutboxMail.objects.due_now(NOON).filter(kind="welcome")) == [mine]


def test_due_now_reads_the_run_s_clock_inside_a_run(job_run):
    row = ReminderFactory(due=NOON)

    with job_run(now=NOON - MINUTE):
        assert list(Reminder.objects.due_now()) == []
    with job_run(now=NOON):
        assert list(Reminder.objects.due_now()) == [row]


# --- claim -----------------------------------------------------------------------------------------------


def test_claim_takes_the_oldest_due_rows_first_then_by_pk(job_run):
    later = ReminderFactory(due=NOON - MINUTE)
    oldest = ReminderFactory(due=NOON - 3 * MINUTE)
    tie_first = ReminderFactory(due=NOON - 2 * MINUTE)
    tie_second = ReminderFactory(due=NOON - 2 * MINUTE)
    ReminderFactory(due=NOON + MINUTE)  # not due yet

    with job_run(now=NOON):
        claimed = Reminder.objects.claim(limit=3)

    assert claimed == [oldest, tie_first, tie_second]
    assert Reminder.objects.get(pk=later.pk).attempts == 0


def test_claim_answers_rows_with_their_new_attempts_due_and_version_as_written(job_run):
    ReminderFactory.create_batch(3, due=NOON - MINUTE)

    with job_run(make_job(schedule="*/5 * * * *"), now=NOON):
        claimed = Reminder.objects.claim()

    expected = (1, NOON + timedelta(minutes=5), 1, "")
    assert [_fields(row) for row in claimed] == [expected] * 3
    assert [row.get_deferred_fields() for row in claimed] == [set()] * 3  # nothing left to load
    assert [_fields(row) for row in Reminder.objects.order_by("pk")] == [expected] * 3


def test_claim_of_no_due_rows_answers_an_empty_list_and_writes_nothing(job_run):
    ReminderFactory(due=NOON + MINUTE)

    with job_run(now=NOON), CaptureQueriesContext(connection) as queries:
        assert Reminder.objects.claim() == []

    assert _verbs(queries) == _claim_statements(found=False)


def test_claim_costs_the_same_statements_for_one_row_and_for_five_hundred(job_run):
    ReminderFactory(due=NOON - MINUTE)
    with job_run(now=NOON), CaptureQueriesContext(connection) as one:
        assert len(Reminder.objects.claim(limit=1)) == 1

    Reminder.objects.bulk_create([Reminder(note=str(i), email="x@example.com", due=NOON - MINUTE) for i in range(500)])
    Reminder.objects.filter(pk__in=list(Reminder.objects.values_list("pk", flat=True)[:250])).update(attempts=1)
    with job_run(now=NOON), CaptureQueriesContext(connection) as many:
        assert len(Reminder.objects.claim(limit=500)) == 500

    assert _verbs(one) == _verbs(many) == _claim_statements()


def test_claim_moves_due_by_the_period_then_twice_then_four_times(job_run):
    row = ReportRequestFactory(due=NOON)
    job = make_job(schedule="*/5 * * * *")
    now, dues = NOON, []
    for _ in range(4):
        with job_run(job, now=now):
            (claimed,) = ReportRequest.objects.claim()
        dues.append(claimed.due - now)
        now = claimed.due

    assert dues == [timedelta(minutes=5), timedelta(minutes=10), timedelta(minutes=20), timedelta(minutes=40)]
    row.refresh_from_db()
    assert (row.attempts, row.version, row.due) == (4, 4, now)


def test_claim_backs_off_one_minute_for_a_job_without_a_schedule(job_run):
    ReportRequestFactory(due=NOON)

    with job_run(make_job(schedule=None), now=NOON):
        (claimed,) = ReportRequest.objects.claim()

    assert claimed.due == NOON + MINUTE


def test_claim_caps_the_backoff_at_thirty_days(job_run):
    ReportRequestFactory(due=NOON, attempts=1)  # a monthly job's period is 28 days: 2 x 28 days is capped

    with job_run(make_job(schedule="0 0 1 * *"), now=NOON):
        (claimed,) = ReportRequest.objects.claim()

    assert (claimed.attempts, claimed.due) == (2, NOON + timedelta(days=30))


def test_claim_gives_rows_with_different_attempts_their_own_backoff_in_one_update(job_run):
    first = ReportRequestFactory(due=NOON - 2 * MINUTE, attempts=0)
    third = ReportRequestFactory(due=NOON - MINUTE, attempts=2)

    with job_run(make_job(schedule="*/5 * * * *"), now=NOON), CaptureQueriesContext(connection) as queries:
        claimed = ReportRequest.objects.claim()

    assert [(row.pk, row.attempts, row.due) for row in claimed] == [
        (first.pk, 1, NOON + timedelta(minutes=5)),
        (third.pk, 3, NOON + timedelta(minutes=20)),
    ]
    assert [(row.attempts, row.due) for row in ReportRequest.objects.order_by("pk")] == [
        (1, NOON + timedelta(minutes=5)),
        (3, NOON + timedelta(minutes=20)),
    ]
    assert _verbs(queries) == _claim_statements()


def test_a_row_reaching_max_attempts_is_dead_and_never_claimed_again(job_run):
    row = ReminderFactory(due=NOON)  # max_attempts = 3
    job = make_job(schedule="*/5 * * * *")
    now = NOON
    for attempt in (1, 2, 3):
        with job_run(job, now=now):
            (claimed,) = Reminder.objects.claim()
        assert claimed.attempts == attempt
        now = claimed.due

    with job_run(job, now=now + timedelta(days=365)):
        assert Reminder.objects.claim() == []
    row.refresh_from_db()
    assert (row.state, row.attempts, row.due) == ("dead", 3, now)
    assert list(Reminder.objects.dead()) == [row]


def test_requeue_brings_a_dead_row_back_with_no_attempts(job_run):
    row = ReminderFactory(due=NOON - timedelta(days=1), attempts=3, version=7)

    row.requeue(at=NOON)

    row.refresh_from_db()
    assert (row.state, row.attempts, row.due, row.version) == ("waiting", 0, NOON, 8)
    with job_run(now=NOON):
        assert Reminder.objects.claim() == [row]


def test_claim_takes_only_rows_matching_where(job_run):
    welcome = OutboxMailFactory(kind="welcome", due=NOON - MINUTE)
    OutboxMailFactory(kind="digest", due=NOON - 2 * MINUTE)
    unsubscribed = PersonFactory(unsubscribed=True)
    OutboxMailFactory(kind="welcome", person=unsubscribed, due=NOON - 3 * MINUTE)

    with job_run(now=NOON):
        claimed = OutboxMail.objects.claim(where=Q(kind="welcome", person__unsubscribed=False))

    assert claimed == [welcome]
    assert OutboxMail.objects.filter(attempts=1).count() == 1


def test_claim_with_a_where_no_row_can_match_claims_nothing(job_run):
    OutboxMailFactory(kind="welcome", due=NOON - MINUTE)
    with job_run(now=NOON):
        assert OutboxMail.objects.claim(where=Q(kind__in=[])) == []
        assert OutboxMail.objects.claim(where=Q(kind__in=[], person__unsubscribed=False)) == []
    assert not OutboxMail.objects.filter(attempts__gt=0).exists()


def test_claim_keeps_the_filters_of_the_queryset_it_ends(job_run):
    welcome = OutboxMailFactory(kind="welcome", due=NOON - MINUTE)
    OutboxMailFactory(kind="digest", due=NOON - MINUTE)

    with job_run(now=NOON):
        assert OutboxMail.objects.filter(kind="welcome").claim() == [welcome]


def test_a_claim_compiled_once_reads_each_claims_own_now_queryset_and_where(job_run):
    """The plain claim's locking read is compiled once (``_runs.claim._CLAIM_READS``): a later claim still reads its
    own ``now``, and a claim on a filtered queryset or with ``where`` is not answered by the plain one's text."""
    first = ReminderFactory(due=NOON - MINUTE)
    later = ReminderFactory(due=NOON + 10 * MINUTE)

    with job_run(now=NOON):
        assert Reminder.objects.claim(limit=5) == [first]  # first's due moves to NOON + 1 minute
    with job_run(now=NOON + 10 * MINUTE):
        assert Reminder.objects.claim(limit=5) == [first, later]
    with job_run(now=NOON + timedelta(days=1)):
        assert Reminder.objects.filter(pk=later.pk).claim(limit=5) == [later]
        assert Reminder.objects.exclude(pk=later.pk).claim(limit=5) == [first]
    with job_run(now=NOON + timedelta(days=2)):
        assert Reminder.objects.claim(limit=5, where=Q(pk=later.pk)) == [later]  # its last attempt (3)
        assert Reminder.objects.claim(limit=5) == []  # both dead now: max_attempts is 3
    assert [row.attempts for row in Reminder.objects.order_by("pk")] == [3, 3]


def _plain_claims(monkeypatch):
    """Record, claim by claim, whether the queryset went to the pipeline as plain (its read compiled once)."""
    told = []
    claim = queues.run_claim.claim

    def spy(of, using, run, where, limit):
        told.append(of.plain)
        return claim(of, using, run, where, limit)

    monkeypatch.setattr(queues.run_claim, "claim", spy)
    return told


def test_only_the_managers_own_claim_is_plain(job_run, monkeypatch):
    """The claim's read is compiled once only for ``Model.objects.claim()``: a queryset's claim cannot tell an
    untouched queryset from a changed one without Django's internals, so every queryset claim compiles its own."""
    told = _plain_claims(monkeypatch)
    with job_run(now=NOON):
        Reminder.objects.claim()
        Reminder.objects.db_manager("default").claim()
        Reminder.objects.all().claim()
        Reminder.objects.using("default").claim()
        Reminder.objects.filter(pk=1).claim()
        Reminder.objects.order_by("-pk").claim()
        Reminder.objects.annotate(twice=F("pk") * 2).claim()
    assert told == [True, True, False, False, False, False, False]


def test_a_related_managers_claim_is_not_plain_and_claims_only_its_own_rows(job_run, monkeypatch):
    """A related manager narrows get_queryset() to its object's rows: its claim is never answered by the plain
    read compiled for the whole table, even right after one."""
    ada, bob = PersonFactory(), PersonFactory()
    adas = OutboxMailFactory(person=ada, due=NOON - MINUTE)
    OutboxMailFactory(person=bob, due=NOON - MINUTE)
    told = _plain_claims(monkeypatch)
    with job_run(now=NOON - 2 * MINUTE):
        assert OutboxMail.objects.claim() == []  # compiles (and caches) the whole table's read
    with job_run(now=NOON):
        assert ada.mails.claim() == [adas]
    assert told == [True, False]


def test_a_manager_that_narrows_get_queryset_is_not_plain(job_run, monkeypatch):
    class Overdue(queues.QueueManager):
        def get_queryset(self):
            return super().get_queryset().filter(due__lt=NOON - MINUTE)

    manager = Overdue()
    manager.model = Reminder
    ReminderFactory(due=NOON - MINUTE)
    old = ReminderFactory(due=NOON - 2 * MINUTE)
    told = _plain_claims(monkeypatch)
    with job_run(now=NOON):
        assert manager.claim() == [old]
    assert told == [False]


@pytest.mark.parametrize("limit", [0, -1, 501, True, False, "5", 2.0, None])
def test_claim_refuses_a_limit_out_of_bounds_saying_the_bounds(job_run, limit):
    with job_run(now=NOON), pytest.raises(ValueError) as refused:
        Reminder.objects.claim(limit=limit)

    assert str(refused.value) == (f"claim(limit={limit!r}) is out of bounds: give a whole number from 1 to 500.")


def test_claim_accepts_the_bounds_one_and_five_hundred(job_run):
    ReminderFactory.create_batch(2, due=NOON - MINUTE)

    with job_run(now=NOON):
        assert len(Reminder.objects.claim(limit=1)) == 1
        assert len(Reminder.objects.claim(limit=500)) == 1


def test_claim_refuses_a_where_that_is_not_a_q(job_run):
    with job_run(now=NOON), pytest.raises(TypeError, match=r"is not a Q: give e\.g\. where=Q\(kind='welcome'\)"):
        Reminder.objects.claim(where={"note": "x"})


def test_claim_outside_a_job_run_is_refused_naming_what_to_do():
    ReminderFactory(due=NOON - MINUTE)

    with pytest.raises(ClaimOutsideJob) as refused:
        Reminder.objects.claim()

    assert "call it from a @cron job's handler" in str(refused.value)
    assert "due_now()" in str(refused.value)
    assert Reminder.objects.get().attempts == 0


def test_claim_inside_ctx_transaction_is_refused_naming_what_to_do(job_run):
    ReminderFactory(due=NOON - MINUTE)

    with job_run(now=NOON) as run:
        run.in_transaction = True
        with pytest.raises(ClaimInsideTransaction) as refused:
            Reminder.objects.claim()

    assert "claim before the work, then finish each row inside its own ctx.transaction()" in str(refused.value)
    assert Reminder.objects.get().attempts == 0


def test_claim_in_a_real_job_run_uses_the_job_s_schedule_and_clock():
    rows = ReminderFactory.create_batch(2, due=NOON - MINUTE)
    seen = []

    def claim_two(ctx):
        seen.extend(Reminder.objects.claim(limit=2))

    with temporary_job(claim_two, schedule="0 * * * *"):
        assert run_job("claim_two", now=NOON).ok

    assert [(row.pk, row.attempts, row.due) for row in seen] == [(row.pk, 1, NOON + timedelta(hours=1)) for row in rows]


# --- finish_all ------------------------------------------------------------------------------------------


def _claimed(job_run, count, **fields):
    ReminderFactory.create_batch(count, due=NOON - MINUTE, **fields)
    with job_run(now=NOON):
        return Reminder.objects.claim(limit=min(count, 500))


def test_finish_all_finishes_every_row_in_one_statement_and_mirrors_it(job_run):
    rows = _claimed(job_run, 500)

    with CaptureQueriesContext(connection) as queries:
        assert Reminder.objects.finish_all(rows, sent_at=NOON) == []

    if connection.vendor == "mysql":
        # No UPDATE ... RETURNING: the unchanged rows are locked, then exactly those written, in one transaction.
        assert _verbs(queries) == ["SELECT", "UPDATE"]
        (select,) = [query["sql"] for query in queries if query["sql"].startswith("SELECT")]
        assert select.endswith("FOR UPDATE")
    else:
        assert _verbs(queries) == ["UPDATE"]
    assert {(row.due, row.version, row.sent_at) for row in rows} == {(None, 2, NOON)}
    assert set(Reminder.objects.values_list("due", "version", "sent_at", "attempts")) == {(None, 2, NOON, 1)}


def test_finish_all_reports_a_row_changed_in_the_middle_and_finishes_the_others(job_run):
    first, middle, last = _claimed(job_run, 3)
    Reminder.objects.filter(pk=middle.pk).update(note="moved by someone", version=F("version") + 1)

    conflicts = Reminder.objects.finish_all([first, middle, last], sent_at=NOON)

    assert conflicts == [middle]
    assert [(row.due, row.version, row.sent_at) for row in (first, middle, last)] == [
        (None, 2, NOON),
        (NOON + timedelta(minutes=5), 1, None),  # the object stays as it was read
        (None, 2, NOON),
    ]
    stored = {row.pk: (row.note, row.due, row.version, row.sent_at) for row in Reminder.objects.all()}
    assert stored == {
        first.pk: (first.note, None, 2, NOON),
        middle.pk: ("moved by someone", NOON + timedelta(minutes=5), 2, None),  # untouched by finish_all
        last.pk: (last.note, None, 2, NOON),
    }


def test_finish_all_checks_each_row_against_its_own_version(job_run):
    rows = _claimed(job_run, 2)
    rows[1].record_failure("send")  # this row's version is now 2, the other's 1

    assert Reminder.objects.finish_all(rows) == []
    assert [(row.due, row.version) for row in rows] == [(None, 2), (None, 3)]
    assert list(Reminder.objects.order_by("pk").values_list("due", "version")) == [(None, 2), (None, 3)]


def test_finish_all_without_update_returning_locks_reads_then_updates(job_run, monkeypatch):
    monkeypatch.setattr(queues, "_can_update_returning", lambda connection: False)
    first, middle, last = _claimed(job_run, 3)
    Reminder.objects.filter(pk=middle.pk).update(version=F("version") + 1)

    with CaptureQueriesContext(connection) as queries:
        assert Reminder.objects.finish_all([first, middle, last], sent_at=NOON) == [middle]

    locking = ["SELECT", "UPDATE"] if connection.vendor != "sqlite" else ["UPDATE", "SELECT", "UPDATE"]
    assert _verbs(queries) == locking
    assert list(Reminder.objects.order_by("pk").values_list("due", "version", "sent_at")) == [
        (None, 2, NOON),
        (NOON + timedelta(minutes=5), 2, None),
        (None, 2, NOON),
    ]
    assert (first.version, middle.version, last.version) == (2, 1, 2)


def test_finish_all_of_no_rows_writes_nothing():
    with CaptureQueriesContext(connection) as queries:
        assert Reminder.objects.finish_all([]) == []
    assert queries.captured_queries == []


def test_finish_all_refuses_the_framework_s_own_fields(job_run):
    rows = _claimed(job_run, 1)

    with pytest.raises(TypeError, match=r"finish_all\(\) sets due, version itself: pass only your own fields"):
        Reminder.objects.finish_all(rows, due=NOON, version=9)
    assert Reminder.objects.get().due == NOON + timedelta(minutes=5)


def test_finish_all_refuses_rows_of_another_model_or_twice_the_same_row(job_run):
    rows = _claimed(job_run, 1)
    report = ReportRequestFactory()

    with pytest.raises(TypeError, match=r"got a ReportRequest, not a reminders\.Reminder row"):
        Reminder.objects.finish_all([*rows, report])
    with pytest.raises(ValueError, match=rf"got row {rows[0].pk} twice: pass each claimed row once"):
        Reminder.objects.finish_all([rows[0], rows[0]])
    with pytest.raises(ValueError, match="got an unsaved row"):
        Reminder.objects.finish_all([Reminder(note="x")])
    assert Reminder.objects.get().due == NOON + timedelta(minutes=5)


def test_finish_all_writes_related_objects_and_expressions(job_run):
    ReportRequestFactory.create_batch(2, due=NOON - MINUTE, rows=5)
    with job_run(now=NOON):
        rows = ReportRequest.objects.claim()

    assert ReportRequest.objects.finish_all(rows, rows=F("rows") * 2, finished_at=NOON) == []
    assert list(ReportRequest.objects.values_list("rows", "finished_at", "due", "version")) == [
        (10, NOON, None, 2),
        (10, NOON, None, 2),
    ]
    mails = OutboxMailFactory.create_batch(2, due=NOON - MINUTE)
    other = PersonFactory()
    assert OutboxMail.objects.finish_all(mails, person=other) == []
    assert set(OutboxMail.objects.values_list("person_id", "due", "version")) == {(other.pk, None, 1)}


# --- the write guard sees the row transitions ---------------------------------------------------------------

_TRANSITIONS = {
    "finish": lambda rows: rows[0].finish(sent_at=NOON),
    "finish_all": lambda rows: Reminder.objects.finish_all(rows, sent_at=NOON),
    "record_failure": lambda rows: rows[0].record_failure("send"),
    "requeue": lambda rows: rows[0].requeue(at=NOON),
    "remove": lambda rows: rows[0].remove(),
}


@pytest.mark.parametrize("transition", list(_TRANSITIONS))
def test_a_row_transition_outside_ctx_transaction_is_refused_in_a_job_and_writes_nothing(transition):
    ReminderFactory(due=NOON - MINUTE)

    def careless(ctx):
        _TRANSITIONS[transition](Reminder.objects.claim())

    with temporary_job(careless):
        assert run_job("careless", now=NOON).failure == "write_outside_transaction"
    assert list(Reminder.objects.values_list("attempts", "version", "due", "last_failure", "sent_at")) == [
        (1, 1, NOON + MINUTE, "", None)  # as the claim left it
    ]


@pytest.mark.parametrize("transition", list(_TRANSITIONS))
def test_a_row_transition_inside_ctx_transaction_is_written(transition):
    ReminderFactory(due=NOON - MINUTE)

    def careful(ctx):
        rows = Reminder.objects.claim()
        with ctx.transaction():
            _TRANSITIONS[transition](rows)

    with temporary_job(careful, actions=["reminders.change_reminder", "reminders.delete_reminder"]):
        assert run_job("careful", now=NOON).ok
    assert list(Reminder.objects.values_list("version", flat=True)) == ([] if transition == "remove" else [2])
