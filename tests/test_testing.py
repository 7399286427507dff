"""The test kit works in pytest-django tests with and without transaction=True, and in Django's TestCase."""

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core import mail
from django.test import TestCase, TransactionTestCase

from fabrika_django.testing import FixedClock, JobResult, run_job
from testproject.lab.models import Item, Mark

from . import processes
from .jobs_helpers import temporary_job


def _claim_and_finish(ctx):
    for row in Item.objects.claim(limit=10):
        with ctx.transaction():
            row.finish(n=row.pk)
            ctx.kick("lab_slow")


def _register():
    return temporary_job(_claim_and_finish, name="claim_and_finish", kicks=["lab_slow"])


@pytest.mark.django_db
def test_run_job_in_a_plain_django_db_test(fabrika_kicks):
    Item.objects.create()
    with _register():
        result = run_job("claim_and_finish")
    assert result == JobResult(job="claim_and_finish", outcome="succeeded", attempts=1, run_id=result.run_id)
    assert Item.objects.get().state == "done"
    assert fabrika_kicks == ["lab_slow"]


@pytest.mark.django_db(transaction=True)
def test_run_job_in_a_transactional_test(fabrika_kicks):
    Item.objects.create()
    with _register():
        assert run_job("claim_and_finish").ok
    assert Item.objects.get().state == "done"
    assert fabrika_kicks == ["lab_slow"]


@pytest.mark.django_db
def test_the_fixed_clock_is_what_claim_sees(fabrika_clock):
    Item.objects.create(due=fabrika_clock.now + timedelta(minutes=5))
    with _register():
        run_job("claim_and_finish")
        assert Item.objects.get().state == "waiting"
        fabrika_clock.advance(timedelta(minutes=5))
        run_job("claim_and_finish")
    assert Item.objects.get().state == "done"


@pytest.mark.django_db
def test_mail_none_is_passed_to_the_context():
    seen = []

    def peek(ctx):
        seen.append(ctx.mail_mode)

    with temporary_job(peek):
        run_job("peek", mail="none")
        run_job("peek")
    assert seen == ["none", "locmem"]


def test_fixed_clock_moves_only_when_told():
    clock = FixedClock()
    start = clock()
    assert clock() == start
    assert clock.advance(timedelta(seconds=5)) == start + timedelta(seconds=5)


class RunJobInTestCase(TestCase):
    def test_run_job_keeps_what_earlier_transactions_committed_when_a_later_one_fails(self):
        def partly(ctx):
            with ctx.transaction():
                Mark.objects.create(job="partly", note="kept")
            Mark.objects.create(job="partly", note="refused")  # outside ctx.transaction()

        with temporary_job(partly):
            result = run_job("partly")
        self.assertEqual(result.failure, "write_outside_transaction")
        self.assertEqual(list(Mark.objects.values_list("note", flat=True)), ["kept"])
        self.assertEqual(len(mail.outbox), 0)


class RunJobInTransactionTestCase(TransactionTestCase):
    def test_run_job_runs_the_handler_on_its_own_connection(self):
        Item.objects.create()
        with _register():
            self.assertTrue(run_job("claim_and_finish").ok)
        self.assertEqual(Item.objects.get().state, "done")


def _other_database_url():
    """A DATABASE_URL whose test database is not this run's: Django's runner makes and drops its own."""
    url = processes.test_database_url()
    if url.startswith("sqlite"):
        return "sqlite:///" + str(processes.ROOT / "var" / "django-runner.sqlite3")
    base, name = url.rsplit("/", 1)
    return f"{base}/{name.removeprefix('test_')}_django_runner"


def test_the_test_kit_imports_without_pytest():
    code = "import sys; sys.modules['pytest'] = None; import fabrika_django.testing as t; print(t.run_job.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=processes.ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "run_job"), done.stderr[-2000:]


@pytest.mark.django_db
def test_run_job_works_in_a_plain_testcase_run_by_djangos_own_runner(tmp_path):
    env = dict(
        os.environ,
        DATABASE_URL=_other_database_url(),
        SQLITE_TEST_NAME=str(tmp_path / "runner.sqlite3"),
        PYTHONUNBUFFERED="1",
    )
    env.pop("FABRIKA_LAB", None)
    args = ["manage.py", "test", "testproject.django_testcase", "--noinput", "-v", "2"]
    done = subprocess.run(
        [sys.executable, *args], cwd=processes.ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "test_a_due_reminder_is_sent_and_a_later_one_waits" in done.stderr and "OK" in done.stderr
