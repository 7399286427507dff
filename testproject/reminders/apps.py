from django.apps import AppConfig


class RemindersConfig(AppConfig):
    name = "testproject.reminders"
    label = "reminders"
