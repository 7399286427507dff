"""Settings of the django-tasks-db test run: the test project's, with their ``TASKS`` and this app.

``STORE_ERROR_MESSAGES``: their tests read exception messages in tracebacks, which fabrika keeps only when told.
"""

from testproject.settings import *  # noqa: F403
from testproject.settings import FABRIKA, INSTALLED_APPS
from tests_upstream import aliases

# Their TASKS name django_tasks_db's backend: a worker process started with these settings (their process tests)
# must resolve it as the test run does.
aliases.install()

INSTALLED_APPS = [*INSTALLED_APPS, "tests_upstream"]
# As their tests' settings: one backend, django_tasks_db's (here fabrika's, see aliases.py), its default queue; and
# "emails", the queue of the task of testproject's outbox app (installed here), whose tasks module a worker imports.
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "emails"]}}
FABRIKA = {**FABRIKA, "STORE_ERROR_MESSAGES": True}
