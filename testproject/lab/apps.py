from django.apps import AppConfig


class LabConfig(AppConfig):
    """Jobs and a table for the test suite's cross-process tests; installed only under tests (FABRIKA_LAB)."""

    name = "testproject.lab"
    label = "lab"
