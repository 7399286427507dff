"""Worker processes that die or are stopped: SIGKILL loses no row, SIGTERM aborts, releases and hands over."""

import os
import signal
import tempfile
from datetime import timedelta

import pytest
from django.utils import timezone

from fabrika_django import kick
from fabrika_django.models import Attempt, Job, Lease
from testproject.lab.models import Item, Mark

from .workers import WorkerProcess, wait_until

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

ROWS = 5000


def test_sigkill_during_a_run_loses_no_row_and_finishes_none_twice():
    Item.objects.bulk_create([Item(n=n, due=timezone.now() - timedelta(seconds=1)) for n in range(ROWS)])
    short_lease = {"FABRIKA_LEASE_SECONDS": 2, "FABRIKA_POLL_INTERVAL": 0.2}
    first = WorkerProcess("--only", "lab_items", **short_lease)
    second = None
    try:
        kick("lab_items")
        wait_until(lambda: Item.objects.done().count() >= 300, workers=[first], what="rows done by the first worker")
        first.signal(signal.SIGKILL)
        first.wait(30)
        killed_at = Item.objects.done().count()
        assert killed_at < ROWS
        second = WorkerProcess("--only", "lab_items", **short_lease)
        # After the lease expires the second worker takes the run over and goes on with the table: some
        # thousands of transactions, so give a loaded machine time (a hang still fails, with stacks).
        wait_until(
            lambda: Attempt.objects.filter(job="lab_items", outcome="succeeded").exists(),
            timeout=120,
            workers=[second],
            what="the run taken over",
        )
        # The rows the killed attempt had claimed are due again after their backoff, not lost, and the job,
        # which has no schedule, wakes then by itself: the run that took over set its wake to the first of them.
        waiting = Item.objects.filter(due__isnull=False)
        assert list(waiting.values_list("attempts", "writes").distinct()) in ([], [(1, 0)])
        assert waiting.count() <= 50  # at most the one batch the killed attempt held
        if waiting.exists():
            wait_until(
                lambda: Job.objects.get(name="lab_items").next_fire == min(waiting.values_list("due", flat=True)),
                workers=[second],
                what="the wake at the first row due again",
            )
            # Bring that time forward, as the clock would (the backoff is a minute), and kick nothing.
            now = timezone.now()
            waiting.update(due=now)
            Job.objects.filter(name="lab_items").update(next_fire=now)
        wait_until(lambda: Item.objects.done().count() == ROWS, timeout=60, workers=[second], what="every row done")
        wait_until(
            lambda: Lease.objects.filter(job="lab_items", token=None).exists(), workers=[second], what="the release"
        )
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert list(Item.objects.values_list("writes", flat=True).distinct()) == [1]  # each finished exactly once
    assert Attempt.objects.filter(job="lab_items", outcome="crashed").count() == 1


def test_sigterm_during_a_long_run_aborts_it_exits_zero_and_another_worker_starts_the_job_at_once():
    signal_file = tempfile.NamedTemporaryFile("w+", delete=False)  # noqa: SIM115
    signal_file.close()
    # A long lease: the second worker can start the job soon only if the first released it.
    env = {"LAB_SIGNAL_FILE": signal_file.name, "FABRIKA_LEASE_SECONDS": 120}
    first = WorkerProcess("--only", "lab_patient", **env)
    second = None
    try:
        kick("lab_patient")
        wait_until(lambda: Mark.objects.filter(note="start").exists(), workers=[first], what="the first start")
        assert Mark.objects.get().pid == first.pid
        second = WorkerProcess("--only", "lab_patient", **env)
        wait_until(lambda: "Worker started" in second.output(), workers=[second], what="the second worker")
        first.signal(signal.SIGTERM)
        assert first.wait(15) == 0, first.output()  # the grace is 10 s; the attempt ends at once
        with open(signal_file.name) as reasons:
            assert reasons.read() == f"{first.pid} shutdown\n"
        # Well before the 120 s lease would have expired.
        wait_until(
            lambda: Mark.objects.filter(pid=second.pid).exists(),
            timeout=20,
            workers=[second],
            what="the second worker's start",
        )
    finally:
        first.kill()
        if second is not None:
            second.kill()
        os.unlink(signal_file.name)
    outcomes = list(Attempt.objects.filter(job="lab_patient").order_by("started").values_list("holder", "outcome"))
    assert outcomes[0][1] == "shutdown" and f":{first.pid}:" in outcomes[0][0]
