"""Two processes running the same job at once: one runs, the other coalesces, the job runs once more."""

import time

import pytest

from fabrika_django.models import Attempt, Job, Lease
from testproject.lab.models import Mark

from .processes import start_manage

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_run_commands_at_once_run_one_attempt_and_the_job_once_more(tmp_path):
    # The first run works until the second command has ended (coalesced), however slowly that one starts.
    second_ended = tmp_path / "second-ended"
    first = start_manage("fabrika_job", "run", "lab_slow", LAB_SLOW_UNTIL=second_ended)
    try:
        # Wait until the first holds the lease, so the second surely meets an active run.
        deadline = time.monotonic() + 30
        while not Mark.objects.filter(note="start").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.05)
        second = start_manage("fabrika_job", "run", "lab_slow", LAB_SLOW_UNTIL=second_ended)
        second_out, second_err = second.communicate(timeout=60)
        second_ended.touch()
        first_out, first_err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert (second.returncode, first.returncode) == (0, 0), (second_err, first_err)
    notes = list(Mark.objects.values_list("note", "pid"))
    # Two runs, one after the other, both in the first process: never two at once.
    assert [note for note, _ in notes] == ["start", "end", "start", "end"]
    assert len({pid for _, pid in notes}) == 1 and notes[0][1] == first.pid
    assert list(Attempt.objects.order_by("started").values_list("trigger", "outcome")) == [
        ("manual", "succeeded"),
        ("kick", "succeeded"),
    ]
    assert Job.objects.get(name="lab_slow").pending_since is None
    assert Lease.objects.get(job="lab_slow").token is None
