"""A plain ``django.test.TestCase`` using the test kit, as a project on Django's test runner writes it."""

from datetime import UTC, datetime, timedelta

from django.test import TestCase

from fabrika_django.testing import run_job
from testproject.reminders.models import Reminder

NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


class SendRemindersTests(TestCase):
    def test_a_due_reminder_is_sent_and_a_later_one_waits(self):
        due = Reminder.objects.create(note="call", email="a@example.com", due=NOON - timedelta(minutes=1))
        later = Reminder.objects.create(note="later", email="b@example.com", due=NOON + timedelta(hours=1))

        result = run_job("send_reminders", now=NOON)

        self.assertEqual((result.outcome, result.attempts, result.failure), ("succeeded", 1, None))
        due.refresh_from_db()
        later.refresh_from_db()
        self.assertEqual((due.state, due.sent_at), ("done", NOON))
        self.assertEqual((later.state, later.sent_at), ("waiting", None))
