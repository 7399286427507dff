from django.apps import AppConfig


class ReportsConfig(AppConfig):
    name = "testproject.reports"
    label = "reports"
