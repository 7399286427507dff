"""factory-boy factories for the test project's models: the three recipes' queue tables and the tasks.

Queue rows are made due now and never claimed (attempts 0, version 0) unless a test says otherwise:
``ReminderFactory(due=NOON - timedelta(minutes=1), attempts=3)``.
"""

from datetime import date

import factory
from factory.django import DjangoModelFactory

from testproject.outbox.models import OutboxMail, Person, Registration
from testproject.reminders.models import Reminder
from testproject.reports.models import ReportRequest
from testproject.tasks.models import Task


class RegistrationFactory(DjangoModelFactory):
    class Meta:
        model = Registration

    name = factory.Sequence(lambda n: f"Registrant {n}")
    email = factory.Sequence(lambda n: f"registrant{n}@example.com")


class PersonFactory(DjangoModelFactory):
    class Meta:
        model = Person

    name = factory.Sequence(lambda n: f"Person {n}")
    email = factory.Sequence(lambda n: f"person{n}@example.com")


class OutboxMailFactory(DjangoModelFactory):
    class Meta:
        model = OutboxMail

    person = factory.SubFactory(PersonFactory)
    kind = "welcome"
    subject = factory.Sequence(lambda n: f"Welcome {n}")
    text = "Welcome aboard."


class ReminderFactory(DjangoModelFactory):
    class Meta:
        model = Reminder

    note = factory.Sequence(lambda n: f"Reminder {n}")
    email = factory.Sequence(lambda n: f"reminded{n}@example.com")


class ReportRequestFactory(DjangoModelFactory):
    class Meta:
        model = ReportRequest

    rows = 10


class TaskFactory(DjangoModelFactory):
    class Meta:
        model = Task

    title = factory.Sequence(lambda n: f"Task {n}")
    due_day = date(2026, 1, 5)
