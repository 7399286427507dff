from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("testproject.outbox.urls")),
    path("reminders/", include("testproject.reminders.urls")),
    path("reports/", include("testproject.reports.urls")),
]
