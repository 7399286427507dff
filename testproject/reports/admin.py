from django.contrib import admin

from fabrika_django.admin import QueueModelAdmin

from .models import ReportRequest


@admin.register(ReportRequest)
class ReportRequestAdmin(QueueModelAdmin):
    # When it was requested is on its page: the list keeps to what fits 1280 px beside the queue's own columns.
    list_display = ("__str__", "rows", "finished_at")
