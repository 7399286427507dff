"""QueueModel: its fields and index, row.state, and the versioned row transitions."""

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fabrika_django import exceptions
from fabrika_django._queuestate import state_q
from fabrika_django.exceptions import VersionConflict
from fabrika_django.models import Outcome
from testproject.lab.models import Item
from testproject.outbox.models import OutboxMail
from testproject.reminders.models import Reminder

from .factories import (
    OutboxMailFactory,
    PersonFactory,
    RegistrationFactory,
    ReminderFactory,
    ReportRequestFactory,
)

pytestmark = pytest.mark.django_db

NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _stored(row):
    return type(row)._base_manager.filter(pk=row.pk).values("attempts", "due", "version", "last_failure").get()


def _change_behind_its_back(row):
    type(row)._base_manager.filter(pk=row.pk).update(version=F("version") + 1)


# --- fields, index, state --------------------------------------------------------------------------------


def test_a_new_row_is_due_now_with_no_attempts_version_or_failure():
    before = timezone.now()
    row = Reminder.objects.create(note="n", email="a@example.com")

    stored = _stored(row)
    assert before <= stored.pop("due") <= timezone.now()
    assert stored == {"attempts": 0, "version": 0, "last_failure": ""}
    assert row.state == "waiting"


@pytest.mark.parametrize(
    "factory", [RegistrationFactory, OutboxMailFactory, ReminderFactory, ReportRequestFactory], ids=lambda f: f.__name__
)
def test_every_demo_queue_model_starts_waiting_and_due(factory):
    row = factory()

    assert (row.state, row.attempts, row.version, row.last_failure) == ("waiting", 0, 0, "")
    assert list(factory._meta.model.objects.due_now()) == [row]


def test_row_state_follows_due_and_attempts():
    row = Reminder(due=NOON, attempts=2)  # max_attempts = 3
    assert row.state == "waiting"
    row.attempts = 3
    assert row.state == "dead"
    row.due = None
    assert row.state == "done"


def test_each_queue_model_gets_a_partial_due_pk_index_over_waiting_rows():
    (index,) = [index for index in OutboxMail._meta.indexes if index.fields == ["due", "id"]]

    assert index.condition == state_q(OutboxMail, "waiting")
    assert str(index.condition) == "(AND: ('due__isnull', False), ('attempts__lt', 5))"  # OutboxMail: max 5
    constraints = connection.introspection.get_constraints(connection.cursor(), OutboxMail._meta.db_table)
    assert constraints[index.name]["columns"] == ["due", "id"]
    assert constraints[index.name]["index"] is True


def test_each_queue_model_gets_a_partial_pk_index_over_dead_rows():
    (index,) = [index for index in Reminder._meta.indexes if index.fields == ["id"]]

    assert str(index.condition) == "(AND: ('due__isnull', False), ('attempts__gte', 3))"  # Reminder: max 3
    constraints = connection.introspection.get_constraints(connection.cursor(), Reminder._meta.db_table)
    assert (constraints[index.name]["columns"], constraints[index.name]["index"]) == (["id"], True)


def _index_definitions(model):
    """Return the model's index definitions as the database stores them (CREATE INDEX ... WHERE ...)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [model._meta.db_table])
        else:
            sql = "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s"
            cursor.execute(sql, [model._meta.db_table])
        return [row[0] for row in cursor.fetchall() if row[0]]


@pytest.mark.partial_indexes
def test_the_claim_index_leaves_done_and_dead_rows_out():
    (claim_name,) = [index.name for index in Reminder._meta.indexes if index.fields == ["due", "id"]]
    (dead_name,) = [index.name for index in Reminder._meta.indexes if index.fields == ["id"]]
    definitions = _index_definitions(Reminder)
    (claim_index,) = [d for d in definitions if f" {claim_name} " in d.replace('"', " ")]
    (dead_index,) = [d for d in definitions if f" {dead_name} " in d.replace('"', " ")]

    # Reminder's max_attempts is 3: waiting rows have fewer attempts, dead rows at least that many.
    assert re.search(r"WHERE \(*\W?due\W? IS NOT NULL\)* AND \(*\W?attempts\W? < 3\)*$", claim_index), claim_index
    assert re.search(r"WHERE \(*\W?due\W? IS NOT NULL\)* AND \(*\W?attempts\W? >= 3\)*$", dead_index), dead_index


@pytest.mark.partial_indexes
def test_claim_walks_the_claim_index_past_no_dead_row(job_run):
    """Dead rows older than every due row would be walked and filtered one by one if they were in the index."""
    Item.objects.bulk_create([Item(n=i, due=NOON - timedelta(days=1, seconds=i), attempts=10) for i in range(3000)])
    Item.objects.bulk_create([Item(n=i, due=NOON - timedelta(seconds=i)) for i in range(100)])
    Item.objects.bulk_create([Item(n=i, due=None) for i in range(3000)])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(Item._meta.db_table)}")
    with job_run(now=NOON), CaptureQueriesContext(connection) as queries:
        assert len(Item.objects.claim(limit=50)) == 50
    # PostgreSQL's plain claim is one statement (its locking read in a WITH, with the lease's UPDATE):
    # EXPLAIN ANALYZE runs it, inside the test's transaction, which is rolled back.
    (claim,) = [query["sql"] for query in queries if query["sql"].startswith(("SELECT", "WITH"))]
    (index,) = [index.name for index in Item._meta.indexes if index.fields == ["due", "id"]]

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {claim}")
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {claim}")
        plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
    assert index in plan, plan
    assert "Rows Removed by Filter" not in plan, plan  # PostgreSQL: no dead row read and thrown away
    assert "TEMP B-TREE" not in plan, plan  # SQLite: in the index's order, no sort


# --- finish ----------------------------------------------------------------------------------------------


def test_finish_writes_values_clears_due_and_bumps_version_in_one_statement():
    row = ReminderFactory(due=NOON, attempts=1, version=1)

    with CaptureQueriesContext(connection) as queries:
        row.finish(sent_at=NOON)

    assert len(queries) == 1
    assert (row.state, row.due, row.version, row.sent_at) == ("done", None, 2, NOON)
    assert _stored(row) == {"attempts": 1, "due": None, "version": 2, "last_failure": ""}
    assert Reminder.objects.get(pk=row.pk).sent_at == NOON


def test_finish_of_a_row_changed_since_raises_version_conflict_and_writes_nothing():
    row = ReminderFactory(due=NOON, attempts=1, version=1)
    _change_behind_its_back(row)

    with pytest.raises(VersionConflict) as conflict:
        row.finish(sent_at=NOON)

    assert str(conflict.value) == (
        f"reminders.Reminder {row.pk} changed since it was read (version 1): nothing was written. "
        "Re-read it with select_for_update() inside ctx.transaction() and decide again."
    )
    assert _stored(row) == {"attempts": 1, "due": NOON, "version": 2, "last_failure": ""}
    assert Reminder.objects.get(pk=row.pk).sent_at is None
    assert (row.due, row.version, row.sent_at) == (NOON, 1, None)


def test_finish_refuses_the_framework_s_own_fields():
    row = ReminderFactory(due=NOON)

    with pytest.raises(TypeError, match=r"finish\(\) sets attempts itself: .* use requeue\(at=\.\.\.\)"):
        row.finish(attempts=0)
    assert _stored(row)["version"] == 0


# --- remove ----------------------------------------------------------------------------------------------


def test_remove_deletes_an_unchanged_row():
    row = OutboxMailFactory(due=NOON, version=1)

    row.remove()

    assert not OutboxMail.objects.filter(pk=row.pk).exists()


def test_remove_of_a_row_changed_since_raises_version_conflict_and_deletes_nothing():
    row = OutboxMailFactory(due=NOON, version=1)
    _change_behind_its_back(row)

    with pytest.raises(VersionConflict, match="changed since it was read"):
        row.remove()

    assert _stored(row)["version"] == 2


# --- requeue ---------------------------------------------------------------------------------------------


def test_requeue_makes_the_row_due_at_the_given_time_with_no_attempts():
    row = ReminderFactory(due=None, attempts=2, version=4, last_failure="send")

    row.requeue(at=NOON + timedelta(days=1))

    expected = {"attempts": 0, "due": NOON + timedelta(days=1), "version": 5, "last_failure": "send"}
    assert _stored(row) == expected
    assert (row.attempts, row.due, row.version) == (0, NOON + timedelta(days=1), 5)


def test_requeue_defaults_to_now_by_the_wall_clock_outside_a_run():
    row = ReminderFactory(due=NOON, attempts=3)
    before = timezone.now()

    row.requeue()

    assert before <= _stored(row)["due"] <= timezone.now()


def test_requeue_defaults_to_now_by_the_run_s_clock_inside_a_run(job_run):
    row = ReminderFactory(due=None, attempts=3)

    with job_run(now=NOON):
        row.requeue()

    assert _stored(row)["due"] == NOON


def test_requeue_of_a_row_changed_since_raises_version_conflict_and_writes_nothing():
    row = ReminderFactory(due=NOON, attempts=3, version=1)
    _change_behind_its_back(row)

    with pytest.raises(VersionConflict):
        row.requeue()

    assert _stored(row) == {"attempts": 3, "due": NOON, "version": 2, "last_failure": ""}


# --- record_failure --------------------------------------------------------------------------------------


def test_record_failure_keeps_the_code_and_bumps_the_version():
    row = ReminderFactory(due=NOON, attempts=1, version=1)

    row.record_failure("send.smtp-4xx_2")

    assert _stored(row) == {"attempts": 1, "due": NOON, "version": 2, "last_failure": "send.smtp-4xx_2"}
    assert (row.last_failure, row.version) == ("send.smtp-4xx_2", 2)


def test_record_failure_accepts_a_code_of_sixty_four_characters():
    row = ReminderFactory(due=NOON)

    row.record_failure("x" * 64)

    assert _stored(row)["last_failure"] == "x" * 64


def test_record_failure_giving_up_makes_the_row_dead_at_once_and_requeue_brings_it_back():
    row = ReminderFactory(due=NOON, attempts=1, version=1)

    row.record_failure("send.refused", give_up=True)

    assert _stored(row) == {"attempts": 3, "due": NOON, "version": 2, "last_failure": "send.refused"}
    assert row.state == "dead"
    assert type(row).objects.dead().get() == row
    row.requeue(at=NOON)
    assert _stored(row)["attempts"] == 0 and row.state == "waiting"


@pytest.mark.parametrize(
    "code",
    ["", "x" * 65, "Send", "send failed", "smtp: 550 bob@example.com", "send\n", "sénd", None, 42],
)
def test_record_failure_refuses_what_is_not_a_fixed_code_without_quoting_it(code):
    row = ReminderFactory(due=NOON)

    with pytest.raises(ValueError) as refused:
        row.record_failure(code)

    assert str(refused.value) == (
        "record_failure() needs a fixed code: 1-64 characters of a-z, 0-9, '_', '.', '-' "
        "naming the step (e.g. 'send'), never an error message."
    )
    assert _stored(row) == {"attempts": 0, "due": NOON, "version": 0, "last_failure": ""}


def test_record_failure_of_a_row_changed_since_raises_version_conflict_and_writes_nothing():
    row = ReminderFactory(due=NOON, version=1)
    _change_behind_its_back(row)

    with pytest.raises(VersionConflict):
        row.record_failure("send")

    assert _stored(row) == {"attempts": 0, "due": NOON, "version": 2, "last_failure": ""}


def test_a_row_read_again_after_a_conflict_can_be_finished():
    row = ReminderFactory(due=NOON, version=1)
    _change_behind_its_back(row)
    with pytest.raises(VersionConflict):
        row.finish()

    fresh = Reminder.objects.select_for_update().get(pk=row.pk)
    fresh.finish()

    assert _stored(row)["due"] is None


def test_finish_writes_a_related_object_as_its_key():
    row = OutboxMailFactory(due=NOON)
    other = PersonFactory()

    row.finish(person=other)

    assert OutboxMail.objects.filter(pk=row.pk).values_list("person_id", "due").get() == (other.pk, None)
    assert row.person == other


def test_finish_with_an_expression_writes_it_through_the_orm():
    row = Item.objects.create(due=NOON, writes=2)

    row.finish(writes=F("writes") + 1)

    assert Item.objects.filter(pk=row.pk).values_list("writes", "due", "version").get() == (3, None, 1)


def test_remove_of_a_row_with_delete_signals_still_deletes_only_an_unchanged_row():
    from django.db.models.signals import post_delete

    deleted = []

    def record(sender, instance, **kwargs):
        deleted.append(instance.pk)

    post_delete.connect(record, sender=Reminder)  # Django now reads the row before deleting it
    try:
        changed = ReminderFactory(due=NOON, version=1)
        _change_behind_its_back(changed)
        with pytest.raises(VersionConflict):
            changed.remove()
        unchanged = ReminderFactory(due=NOON, version=1)
        unchanged.remove()
    finally:
        post_delete.disconnect(record, sender=Reminder)

    assert deleted == [unchanged.pk]
    assert list(Reminder.objects.values_list("pk", flat=True)) == [changed.pk]


def test_every_code_that_can_end_an_attempt_has_an_outcome_choice():
    """The attempts page shows a label for each outcome: a new error code needs its choice (and migration)."""

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    codes = {cls.code for cls in subclasses(exceptions.FabrikaError) if "code" in vars(cls)}
    package = Path(exceptions.__file__).parent
    mail = sorted((package / "mail").glob("*.py"))
    for module in [*mail, package / "egress.py"]:
        codes |= set(re.findall(r'code="([a-z_]+)"', module.read_text()))
    for module in mail:
        codes |= {code for _, code, _ in re.findall(r'\((smtplib\.\w+), "([a-z_]+)", "([^"]*)"\)', module.read_text())}
    assert len(codes) > 20
    assert codes - set(Outcome.values) == set()


def test_outcome_codes_are_not_written_into_migrations():
    # A migration keeps the callable's name, not the list: a new Outcome member needs no migration.
    from importlib import import_module

    from fabrika_django.models import Attempt, Outcome, _outcome_choices

    assert Attempt._meta.get_field("outcome").deconstruct()[3]["choices"] is _outcome_choices
    for name in ("0001_initial", "0001_squashed_0009_kickrequest"):
        migration = import_module(f"fabrika_django.migrations.{name}").Migration
        (attempt,) = [op for op in migration.operations if getattr(op, "name", "") == "Attempt"]
        assert dict(attempt.fields)["outcome"].deconstruct()[3]["choices"] is _outcome_choices
    assert dict(Attempt._meta.get_field("outcome").choices) == dict(Outcome.choices)
