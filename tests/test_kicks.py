"""kick(): after the commit, one statement, coalesced into one pending flag; NOTIFY on PostgreSQL."""

import logging
import select
import threading

import psycopg
import pytest
from django.db import connection, connections, transaction

from fabrika_django import UnknownJob, _jobstate, kick, kicks
from fabrika_django.models import Job

from . import processes

pytestmark = pytest.mark.django_db(transaction=True)


def pending(name="lab_slow"):
    return Job.objects.filter(name=name).values_list("pending_since", flat=True).first()


@pytest.fixture
def lab_slow_row():
    Job.objects.create(name="lab_slow")


def test_kick_outside_a_transaction_marks_the_job_pending_at_once(lab_slow_row):
    kick("lab_slow")
    assert pending() is not None


def test_kick_inside_a_transaction_marks_the_job_only_when_it_commits(lab_slow_row):
    seen_inside = []
    with transaction.atomic():
        kick("lab_slow")
        # Another connection sees nothing yet: the request's transaction wrote nothing for the kick.
        thread = threading.Thread(target=lambda: (seen_inside.append(pending()), connections.close_all()))
        thread.start()
        thread.join()
    assert seen_inside == [None]
    assert pending() is not None


def test_a_rolled_back_transaction_kicks_nothing(lab_slow_row):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        kick("lab_slow")
        raise ZeroDivisionError
    assert pending() is None


def test_a_kick_of_an_unknown_job_raises_unknown_job_at_once():
    with pytest.raises(UnknownJob, match="No cron job is named 'nope'"), transaction.atomic():
        kick("nope")


def test_later_kicks_keep_the_first_pending_flag(lab_slow_row):
    kick("lab_slow")
    first = pending()
    kick("lab_slow")
    kick("lab_slow")
    assert pending() == first


def test_a_kick_of_a_job_without_a_row_makes_the_row_pending():
    assert not Job.objects.filter(name="lab_slow").exists()
    kick("lab_slow")
    assert pending() is not None


def test_a_failing_kick_never_breaks_the_committed_request_and_logs_no_message(monkeypatch, caplog, lab_slow_row):
    def broken(name, *, using=None):
        raise RuntimeError("someone@example.com")

    monkeypatch.setattr(kicks, "request_run", broken)
    with caplog.at_level(logging.DEBUG), transaction.atomic():
        Job.objects.create(name="other")
        kick("lab_slow")
    assert Job.objects.filter(name="other").exists()  # committed
    assert "Kick not delivered job=lab_slow error=RuntimeError" in caplog.text
    assert "someone@example.com" not in caplog.text


def test_the_test_kit_records_kicks_after_their_commit(fabrika_kicks, lab_slow_row):
    with transaction.atomic():
        kick("lab_slow")
        assert fabrika_kicks == []
    assert fabrika_kicks == ["lab_slow"]


def test_a_kick_costs_one_statement_after_the_commit(lab_slow_row, django_assert_num_queries):
    with django_assert_num_queries(1):
        kick("lab_slow")
    if connection.vendor == "postgresql":
        with django_assert_num_queries(1):
            kick("lab_slow")  # already pending: still one statement


def _notifications(listener, timeout):
    names = []
    while select.select([listener.fileno()], [], [], timeout)[0]:
        names += [note.payload for note in listener.notifies(timeout=0.01) if note.channel == kicks.CHANNEL]
        timeout = 0.2
    return names


@pytest.mark.listen_notify
def test_a_kick_notifies_listeners_once_while_the_job_stays_pending(lab_slow_row):
    with psycopg.connect(processes.test_database_url(), autocommit=True) as listener:
        listener.execute(f"LISTEN {kicks.CHANNEL}")
        for _ in range(3):
            kick("lab_slow")
        assert _notifications(listener, 2.0) == ["lab_slow"]
        Job.objects.filter(name="lab_slow").update(pending_since=None)  # a run started
        kick("lab_slow")
        assert _notifications(listener, 2.0) == ["lab_slow"]


def test_a_kick_that_finds_no_row_marks_the_row_another_session_made_meanwhile():
    Job.objects.create(name="lab_slow")  # made by a worker's sync between the kick's UPDATE and its insert
    _jobstate._create_pending("lab_slow", "default")
    assert pending() is not None
