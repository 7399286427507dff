"""A stopping worker's LISTEN thread ends at once: the stop wakes it, it does not wait out its wait."""

import threading
import time

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from fabrika_django import _listen, kick
from fabrika_django.models import Lease
from fabrika_django.worker import Worker
from testproject.lab.models import Mark

from .jobs_helpers import temporary_job
from .workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

# Far longer than any stop may take: a listener that looked at the stop flag only between waits would
# take this long to end.
_LONG_WAIT = 60.0


def _listening():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        return cursor.fetchone()[0] > 0


def _listeners():
    return [thread for thread in threading.enumerate() if thread.name == "fabrika-listen"]


def test_an_idle_listening_worker_stops_within_a_fraction_of_its_listeners_wait(monkeypatch):
    monkeypatch.setattr(_listen, "_WAIT_SECONDS", _LONG_WAIT)
    worker = Worker(install_signals=False, only=[])
    thread = threading.Thread(target=worker.run, name="test-worker")
    thread.start()
    try:
        wait_until(_listening, what="the worker's LISTEN")
        wait_until(_listeners, what="the listener thread")
    finally:
        began = time.monotonic()
        worker.stop()  # what SIGTERM and SIGINT call
        thread.join(30)
        took = time.monotonic() - began
    assert not thread.is_alive(), "the worker did not stop"
    assert not _listeners(), "the worker returned with its listener still waiting"
    assert took < _LONG_WAIT / 10, f"the stop took {took:.2f}s"


def test_a_listener_still_hands_over_kicks_with_the_wake_in_place(monkeypatch):
    # The wait ends for a note as before: a kick heard runs long before the wait's end, and before the scan
    # that would have found its row (the poll is as long as the wait here).
    monkeypatch.setattr(_listen, "_WAIT_SECONDS", _LONG_WAIT)
    slow_poll = override_settings(FABRIKA={**settings.FABRIKA, "POLL_INTERVAL": _LONG_WAIT})

    def heard(ctx):
        with ctx.transaction():
            Mark.objects.create(job=ctx.job.name, note="heard", attempt=ctx.attempt)

    with temporary_job(heard), slow_poll:
        worker = Worker(install_signals=False, only=["heard"])
        thread = threading.Thread(target=worker.run, name="test-worker")
        thread.start()
        try:
            wait_until(_listening, what="the worker's LISTEN")
            for count in (1, 2):
                kick("heard")
                wait_until(lambda n=count: Mark.objects.filter(job="heard").count() == n, timeout=_LONG_WAIT / 4)
                wait_until(lambda: Lease.objects.filter(job="heard", token=None).exists(), what="the run's end")
        finally:
            worker.stop()
            thread.join(30)
    assert not thread.is_alive(), "the worker did not stop"
