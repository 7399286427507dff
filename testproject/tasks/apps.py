from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "testproject.tasks"
    label = "tasks"
