from django.contrib import admin

from fabrika_django.admin import QueueModelAdmin

from .models import OutboxMail, Person, Registration


@admin.register(Registration)
class RegistrationAdmin(QueueModelAdmin):
    list_display = ("__str__", "name", "received_at")
    search_fields = ("name",)


@admin.register(OutboxMail)
class OutboxMailAdmin(QueueModelAdmin):
    # The kind is in its name and the filter, when it was written on its page: the subject gets the room.
    list_display = ("__str__", "subject")
    list_filter = ("kind",)
    raw_id_fields = ("person",)


@admin.register(Person)
class PersonAdmin(admin.ModelAdmin):
    list_display = ("__str__", "name", "unsubscribed")
