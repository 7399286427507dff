from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "testproject.outbox"
    label = "outbox"
