"""The admin: ``QueueModelAdmin`` for the application's queue tables; fabrika's own jobs and attempts.

Importing this module (the admin's autodiscovery does) registers the jobs, attempts, tasks and sent-mail pages on
``admin.site``, and the overview of every queue and job (the admin index's "Overview" under
"Background jobs"). Every page is staff only, like the rest of the admin.
"""

from ._attempts import AttemptAdmin
from ._jobs import JobAdmin
from ._mail import SentMailAdmin
from ._overview import OverviewAdmin
from ._queues import QueueModelAdmin, QueueModelAdminMixin, StateListFilter
from ._tasks import QueuedTaskAdmin

__all__ = [
    "AttemptAdmin",
    "JobAdmin",
    "OverviewAdmin",
    "QueueModelAdmin",
    "QueueModelAdminMixin",
    "QueuedTaskAdmin",
    "SentMailAdmin",
    "StateListFilter",
]
