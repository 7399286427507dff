from django.contrib import admin

from fabrika_django.admin import QueueModelAdminMixin

from .models import Reminder


# The mixin form, as a project with its own ModelAdmin base would use it.
@admin.register(Reminder)
class ReminderAdmin(QueueModelAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "note", "queue_state", "queue_due", "sent_at")
    search_fields = ("note",)
