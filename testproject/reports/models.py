"""Recipe 3, asynchronous work: a request row, a job that renders a CSV into a file, a page that polls."""

from django.db import models

from fabrika_django.models import QueueModel


class ReportRequest(QueueModel):
    rows = models.PositiveIntegerField(default=100)
    result = models.FileField(upload_to="reports/", blank=True)
    requested_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"Report {self.pk}"
