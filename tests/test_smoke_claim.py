from datetime import timedelta

import pytest
from django.utils import timezone

from testproject.reminders.models import Reminder

pytestmark = pytest.mark.django_db


def test_claim_moves_attempts_version_and_due(job_run):
    now = timezone.now()
    Reminder.objects.bulk_create(
        [Reminder(note=str(i), email="x@example.com", due=now - timedelta(minutes=i)) for i in range(3)]
    )
    with job_run(now=now):
        claimed = Reminder.objects.claim(limit=2)
    assert [r.note for r in claimed] == ["2", "1"]
    assert [(r.attempts, r.version, r.due) for r in claimed] == [(1, 1, now + timedelta(minutes=5))] * 2
    fresh = Reminder.objects.get(pk=claimed[0].pk)
    assert (fresh.attempts, fresh.version, fresh.due) == (1, 1, now + timedelta(minutes=5))
