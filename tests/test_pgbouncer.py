"""Behind a transaction pooler (a real PgBouncer 1.18, before it knew prepared statements): the prepared kick
and start, and the fence's BEGIN with its lock, work from several clients sharing two server sessions."""

import pytest

from fabrika_django import kick
from fabrika_django.models import Attempt
from testproject.lab.models import Mark

from .pgbouncer import pgbouncer  # noqa: F401  the fixture
from .processes import start_manage
from .workers import WorkerProcess, wait_until

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

KICKS = """
from fabrika_django.kicks import request_run
from fabrika_django.models import Job
from fabrika_django.runner import sync_jobs
sync_jobs([{name!r}])
for _ in range(150):
    request_run({name!r})
    assert Job.objects.filter(name={name!r}, pending_since__isnull=False).exists()
    Job.objects.filter(name={name!r}).update(pending_since=None)
print("kicked")
"""


def test_kicks_from_clients_sharing_pooled_sessions_all_land(pgbouncer):  # noqa: F811
    # Three clients, one prepared statement name, two server sessions: every client meets sessions that
    # lack the statement and sessions another client prepared it in.
    clients = [
        start_manage("shell", "-c", KICKS.format(name=name), DATABASE_URL=pgbouncer.url())
        for name in ("lab_stamp", "lab_slow", "lab_yearly")
    ]
    for client in clients:
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err[-3000:]
        assert out.strip().endswith("kicked")


def test_a_polling_worker_behind_the_pooler_starts_fences_and_ends_every_kicked_run(pgbouncer):  # noqa: F811
    worker = WorkerProcess(
        "--only",
        "lab_stamp",
        DATABASE_URL=pgbouncer.url(),
        FABRIKA_LISTEN_DATABASE="",
        FABRIKA_POLL_INTERVAL=0.05,
    )
    try:
        for number in range(1, 21):
            kick("lab_stamp")
            wait_until(lambda n=number: Mark.objects.count() >= n, workers=[worker], what=f"run {number}")
        # The last handler's Mark commits before its attempt's end is written: wait for that end, not a time.
        ended = Attempt.objects.filter(job="lab_stamp", outcome="running")
        wait_until(lambda: not ended.exists(), workers=[worker], what="the last attempt's end")
    finally:
        worker.kill()
    assert Mark.objects.count() == 20
    assert set(Attempt.objects.filter(job="lab_stamp").values_list("outcome", flat=True)) == {"succeeded"}
