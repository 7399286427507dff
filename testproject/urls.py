from django.contrib import admin
from django.urls import include, path

import fabrika_django.metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics/fabrika/", fabrika_django.metrics.view),
    path("", include("testproject.outbox.urls")),
    path("reminders/", include("testproject.reminders.urls")),
    path("reports/", include("testproject.reports.urls")),
]
