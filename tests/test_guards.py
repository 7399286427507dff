"""The write guard's two rules: writes inside ctx.transaction(), and only to tables the job holds."""

import pytest
from django.test import override_settings

from fabrika_django.exceptions import CapabilityRefused
from fabrika_django.guards import is_write, required_permission
from fabrika_django.models import Attempt
from fabrika_django.testing import run_job
from testproject.lab.models import Item, Mark

from .jobs_helpers import temporary_job

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "sql, writes",
    [
        ('INSERT INTO "lab_mark" ("job") VALUES (%s)', True),
        ('  update "lab_mark" SET "note" = %s', True),
        ('DELETE FROM "lab_mark" WHERE "id" = %s', True),
        ('WITH k AS (UPDATE "x" SET a = 1 RETURNING 1) SELECT 1', True),
        ('SELECT "lab_mark"."id" FROM "lab_mark" FOR UPDATE', False),
        ('WITH p AS (SELECT id FROM "x" FOR UPDATE SKIP LOCKED) SELECT * FROM p', False),
        ("SAVEPOINT s1", False),
        ("", False),
    ],
)
def test_is_write_tells_writes_from_reads(sql, writes):
    assert is_write(sql) is writes


def test_required_permission_names_the_model_and_the_action():
    assert required_permission('INSERT INTO "lab_mark" ("job") VALUES (%s)') == "lab.add_mark"
    assert required_permission('UPDATE "lab_item" SET "n" = 1') == "lab.change_item"
    assert required_permission("DELETE FROM `lab_item` WHERE 1") == "lab.delete_item"
    assert required_permission('UPDATE "fabrika_django_lease" SET "expires" = 1') is None


def _writer(ctx):
    with ctx.transaction():
        Mark.objects.create(job="writer", note="hello")


def test_a_job_that_declares_the_permission_may_write():
    with temporary_job(_writer, name="writer", actions=["lab.add_mark"]):
        assert run_job("writer").ok
    assert Mark.objects.count() == 1


def test_a_write_without_the_declared_permission_is_refused_naming_it():
    caught = []

    def writer(ctx):
        try:
            _writer(ctx)
        except CapabilityRefused as exc:
            caught.append((exc.missing, str(exc)))
            raise

    with temporary_job(writer, actions=["lab.change_mark"]):
        result = run_job("writer")
    assert result.failure == "capability_refused"
    assert Attempt.objects.get(job="writer").outcome == "capability_refused"
    assert caught == [
        (
            "lab.add_mark",
            "Job 'writer' needs the permission 'lab.add_mark' for this write: "
            "add it to @cron(..., actions=[..., 'lab.add_mark']).",
        )
    ]
    assert not Mark.objects.exists()


def test_claim_needs_the_tables_change_permission():
    Item.objects.create()

    def claimer(ctx):
        Item.objects.claim(limit=1)

    with temporary_job(claimer, actions=["lab.add_item"]):
        assert run_job("claimer").failure == "capability_refused"
    assert Item.objects.get().attempts == 0
    with temporary_job(claimer, actions=["lab.change_item"]):
        assert run_job("claimer").ok
    assert Item.objects.get().attempts == 1


def test_without_actions_a_job_holds_everything_unless_the_setting_enforces_them():
    with temporary_job(_writer, name="writer"):
        assert run_job("writer").ok
        with override_settings(FABRIKA={"ENFORCE_ACTIONS": True}):
            assert run_job("writer").failure == "capability_refused"
    assert Mark.objects.count() == 1
