"""``manage.py fabrika_demo_data``: the demo's admin user and a few rows for each recipe; run again, it adds nothing."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.utils import timezone

from testproject.reminders.models import Reminder
from testproject.tasks.models import Task


class Command(BaseCommand):
    help = "Add the demo's admin user (admin / admin) and demo rows, once."

    def handle(self, *args, **options):
        users = get_user_model()
        if not users.objects.filter(username="admin").exists():
            users.objects.create_superuser("admin", "admin@localhost", "admin")
            self.stdout.write("Created the admin user: admin / admin (demo only).")
        today = timezone.now().date()
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
            now = timezone.now()
            Reminder.objects.bulk_create(
                [
                    Reminder(note="Call the plumber", email="demo@example.com", due=now),
                    Reminder(note="Water the plants", email="demo@example.com", due=now + timedelta(minutes=2)),
                ]
            )
            self.stdout.write("Added 2 reminders: one due now, one in two minutes (see /reminders/).")
