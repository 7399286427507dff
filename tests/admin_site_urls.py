"""A project's own AdminSite, with fabrika's admin classes registered on it by hand (tests/test_admin.py)."""

from django.contrib import admin
from django.urls import path

from fabrika_django.admin import AttemptAdmin, JobAdmin, OverviewAdmin, QueueModelAdmin
from fabrika_django.models import Attempt, Job, Overview
from testproject.reminders.models import Reminder

site = admin.AdminSite(name="backoffice")
site.register(Job, JobAdmin)
site.register(Attempt, AttemptAdmin)
site.register(Overview, OverviewAdmin)
site.register(Reminder, QueueModelAdmin)

urlpatterns = [path("backoffice/", site.urls)]
