"""The admin: ``QueueModelAdmin`` for the application's queue tables; fabrika's own jobs and attempts.

Importing this module (the admin's autodiscovery does) registers the jobs and attempts pages on
``admin.site``; the overview of every queue and job hangs off the jobs page.
"""

from ._jobs import AttemptAdmin, JobAdmin
from ._queues import QueueModelAdmin, QueueModelAdminMixin, StateListFilter

__all__ = ["AttemptAdmin", "JobAdmin", "QueueModelAdmin", "QueueModelAdminMixin", "StateListFilter"]
