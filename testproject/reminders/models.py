"""Recipe 2, a per-record reminder: ``due`` is the reminder time; moving it is ``requeue(at=...)``."""

from django.db import models

from fabrika_django.models import QueueModel


class Reminder(QueueModel):
    note = models.CharField(max_length=200)
    email = models.EmailField()
    sent_at = models.DateTimeField(null=True, blank=True)

    class Queue:
        max_attempts = 3

    def __str__(self) -> str:
        return f"Reminder {self.pk}"
