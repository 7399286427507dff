from django.contrib import admin

from fabrika_django.admin import QueueModelAdmin

from .models import ReportRequest


@admin.register(ReportRequest)
class ReportRequestAdmin(QueueModelAdmin):
    list_display = ("__str__", "rows", "requested_at", "finished_at")
