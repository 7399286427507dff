"""How a kick reaches a worker: one commit per enqueue, and no kick lost when no worker heard its NOTIFY."""

import select
import signal
import threading

import psycopg
import pytest
from django.db import connection, connections, transaction

from fabrika_django import kick
from fabrika_django._channel import CHANNEL
from fabrika_django.models import Attempt, KickRequest, QueuedTask
from testproject.lab import tasks
from testproject.lab.models import Item

from . import processes
from .test_kicks import Commits
from .workers import WorkerProcess, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = ("--only", "tasks.default.default")


def _status(result_id):
    return QueuedTask.objects.filter(result_id=result_id).values_list("status", flat=True).first()


def test_a_task_enqueue_in_autocommit_is_one_commit(monkeypatch):
    with Commits().counting(monkeypatch) as cost:
        result = tasks.noop.enqueue()
    assert cost.commits == 1
    if connection.vendor == "postgresql":
        assert cost.statements == 1  # the row, the kick's row and the NOTIFY in one statement
    assert _status(result.id) == "READY"
    assert KickRequest.objects.filter(job="tasks.default.default").count() == 1


def test_task_enqueues_ride_in_the_callers_commit_with_one_kick(monkeypatch):
    with Commits().counting(monkeypatch) as cost, transaction.atomic():
        first = tasks.noop.enqueue()
        second = tasks.noop.enqueue()
    assert cost.commits == 1
    if connection.vendor == "postgresql":
        assert cost.statements == 2  # one per task: the second finds the transaction's kick in already
    assert [_status(first.id), _status(second.id)] == ["READY", "READY"]
    assert KickRequest.objects.filter(job="tasks.default.default").count() == 1


def test_a_rolled_back_enqueue_leaves_no_task_and_no_kick():
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        tasks.noop.enqueue()
        raise ZeroDivisionError
    assert (QueuedTask.objects.count(), KickRequest.objects.count()) == (0, 0)


@pytest.mark.row_locks
def test_a_kick_committed_while_no_worker_ran_is_run_when_a_worker_starts():
    """A kick-only job has no schedule to recover a kick nobody heard: its row waits for the next worker."""
    with transaction.atomic():
        item = Item.objects.create()
        kick("lab_items")
    worker = WorkerProcess("--only", "lab_items", FABRIKA_POLL_INTERVAL=30)  # its start, not a poll, takes it
    try:
        wait_until(lambda: Item.objects.get(pk=item.pk).due is None, workers=[worker], what="the kicked run")
    finally:
        worker.kill()
    assert KickRequest.objects.count() == 0


def _heard(listener, name, timeout=10.0):
    while select.select([listener.fileno()], [], [], timeout)[0]:
        if any(note.payload == name for note in listener.notifies(timeout=0.01)):
            return True
    return False


@pytest.mark.listen_notify
def test_a_worker_killed_between_the_notification_and_the_start_loses_no_kick(tmp_path):
    """The first worker hears the NOTIFY while its one slot is busy, and is killed before it starts the run;
    the kick's row, still there, is taken by the next worker."""
    busy = {"LAB_SLOW_UNTIL": str(tmp_path / "never")}
    first = WorkerProcess("--only", "lab_slow,lab_items", "--concurrency", "1", FABRIKA_POLL_INTERVAL=30, **busy)
    second = None
    try:
        wait_until(lambda: "Worker started" in first.output(), workers=[first], what="the first worker")
        kick("lab_slow")
        wait_until(lambda: Attempt.objects.filter(job="lab_slow").exists(), workers=[first], what="the busy run")
        with psycopg.connect(processes.test_database_url(), autocommit=True) as listener:
            listener.execute(f"LISTEN {CHANNEL}")
            with transaction.atomic():
                item = Item.objects.create()
                kick("lab_items")
            assert _heard(listener, "lab_items")  # delivered to every listener at the commit, the first worker's too
        first.signal(signal.SIGKILL)
        first.wait(30)
        assert not Attempt.objects.filter(job="lab_items").exists()
        second = WorkerProcess("--only", "lab_items", FABRIKA_POLL_INTERVAL=30)
        wait_until(lambda: Item.objects.get(pk=item.pk).due is None, workers=[second], what="the kicked run")
    finally:
        first.kill()
        if second is not None:
            second.kill()
    holders = list(Attempt.objects.filter(job="lab_items").values_list("holder", flat=True))
    assert holders and all(f":{second.pid}:" in holder for holder in holders)


@pytest.mark.postgresql
def test_an_enqueue_held_open_does_not_hold_up_another_commit_and_its_task():
    """One transaction keeps its enqueue open while another commits: the second task starts and ends meanwhile."""
    worker = WorkerProcess(*TASKS)
    release = threading.Event()
    held = []

    def hold_open():
        try:
            with transaction.atomic():
                held.append(tasks.mark.enqueue("held"))
                release.wait(60)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_open)
    try:
        wait_until(lambda: "Worker started" in worker.output(), workers=[worker], what="the worker")
        thread.start()
        wait_until(lambda: held, what="the held enqueue")
        with transaction.atomic():
            free = tasks.mark.enqueue("free")
        wait_until(lambda: _status(free.id) == "SUCCESSFUL", timeout=20, workers=[worker], what="the free task")
        assert _status(held[0].id) is None  # not committed yet: nobody sees it
        release.set()
        thread.join(30)
        wait_until(lambda: _status(held[0].id) == "SUCCESSFUL", timeout=20, workers=[worker], what="the held task")
    finally:
        release.set()
        thread.join(30)
        worker.kill()
