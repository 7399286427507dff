"""``manage.py fabrika_demo_data``: the demo's admin user and a few rows for each recipe; run again, it adds nothing."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.utils import timezone

from fabrika_django.queues import max_attempts_of
from testproject.outbox.models import OutboxMail, Person, Registration
from testproject.reminders.models import Reminder
from testproject.reports.models import ReportRequest
from testproject.tasks.models import Task


class Command(BaseCommand):
    help = "Add the demo's admin user (admin / admin) and demo rows, once."

    def handle(self, *args, **options):
        users = get_user_model()
        if not users.objects.filter(username="admin").exists():
            users.objects.create_superuser("admin", "admin@localhost", "admin")
            self.stdout.write("Created the admin user: admin / admin (demo only).")
        now = timezone.now()
        today = now.date()
        if not Task.objects.exists():
            Task.objects.bulk_create(
                [
                    Task(title="File the quarterly report", due_day=today - timedelta(days=3)),
                    Task(title="Renew the certificate", due_day=today - timedelta(days=1)),
                    Task(title="Plan the offsite", due_day=today + timedelta(days=7)),
                    Task(title="Send the invoices", due_day=today - timedelta(days=10), done=True),
                ]
            )
            self.stdout.write("Added 4 tasks; run 'manage.py fabrika_job run mark_overdue' to mark the late ones.")
        if not Reminder.objects.exists():
            Reminder.objects.bulk_create(
                [
                    Reminder(note="Call the plumber", email="demo@example.com", due=now),
                    Reminder(note="Water the plants", email="demo@example.com", due=now + timedelta(minutes=2)),
                    Reminder(note="Book the dentist", email="demo@example.com", due=now + timedelta(days=2)),
                    *_dead(Reminder, now, "send", note="Pay the rent", email="demo@example.com"),
                    Reminder(note="Buy a present", email="demo@example.com", due=None, sent_at=now - timedelta(days=1)),
                ]
            )
            self.stdout.write("Added 5 reminders: due now, waiting, dead and done (see /reminders/ and the admin).")
        if not Registration.objects.exists():
            Registration.objects.bulk_create(
                [
                    Registration(name="Ada", email="ada@example.com", due=now + timedelta(hours=1)),
                    Registration(name="Grace", email="grace@example.com", due=now - timedelta(minutes=5)),
                    *_dead(Registration, now, "welcome_mail", name="Edsger", email="edsger@example.com"),
                    Registration(name="Barbara", email="barbara@example.com", due=None),
                ]
            )
            self.stdout.write("Added 4 registrations: waiting, due now, dead and done.")
        if not OutboxMail.objects.exists():
            person, _created = Person.objects.get_or_create(email="ada@example.com", defaults={"name": "Ada"})
            mail = {"person": person, "text": "Hello from the demo."}
            OutboxMail.objects.bulk_create(
                [
                    OutboxMail(kind="welcome", subject="Welcome", due=now + timedelta(minutes=30), **mail),
                    OutboxMail(kind="digest", subject="Your week", due=now - timedelta(minutes=1), **mail),
                    *_dead(OutboxMail, now, "send", kind="welcome", subject="Welcome again", **mail),
                    *_dead(OutboxMail, now, "render", kind="digest", subject="Last week", **mail),
                    OutboxMail(kind="welcome", subject="Welcome (sent)", due=None, message_id="demo-1", **mail),
                ]
            )
            self.stdout.write("Added 5 outbox mails: waiting, due now, two dead and one done.")
        if not ReportRequest.objects.exists():
            ReportRequest.objects.bulk_create(
                [
                    ReportRequest(rows=100, due=now + timedelta(minutes=10)),
                    *_dead(ReportRequest, now, "render", rows=1000),
                    ReportRequest(rows=50, due=None, finished_at=now - timedelta(hours=2)),
                ]
            )
            self.stdout.write("Added 3 report requests: waiting, dead and done.")


def _dead(model, now, failure, **fields):
    """Return one dead row: every attempt spent, the last one failing at ``failure``, kept for a person."""
    attempts = max_attempts_of(model)
    return [model(attempts=attempts, due=now - timedelta(hours=3), last_failure=failure, version=attempts, **fields)]
