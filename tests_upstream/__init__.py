"""django-tasks-db's own test suite, run against ``fabrika_django.tasks.FabrikaBackend``: ``python -m tests_upstream``.

Their tests are fetched at test time (the pinned sdist, into ``var/upstream/``) and never copied here. This package
holds only what stands between them and fabrika: the settings, a stand-in for the ``django_tasks_db`` names their
tests import (``aliases.py``, ``standin.py``, ``models.py``), the task functions they enqueue (``tasks.py``), a
``db_worker`` command that runs the due tasks through fabrika's worker path, and ``selection.py``: every test not
run, and every adaptation, with its reason.
"""
