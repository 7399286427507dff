"""The seed's ``mark_overdue`` example: tasks an hourly job marks overdue, re-reading each under its lock."""

from django.db import models


class Task(models.Model):
    title = models.CharField(max_length=200)
    due_day = models.DateField()
    done = models.BooleanField(default=False)
    overdue = models.BooleanField(default=False)
    version = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return self.title
