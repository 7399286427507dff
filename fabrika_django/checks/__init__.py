"""System checks ``fabrika.E0xx`` / ``fabrika.W0xx`` (``manage.py check``).

``@cron`` refuses a bad argument at import; these judge what needs every ``jobs.py`` loaded (duplicate
names, kicks of unknown jobs, kick cycles), jobs registered without ``@cron``, the project's queue
models and ``settings.FABRIKA``.

Ids are stable and never reused; a retired id stays below as a "reserved" comment.

- E001 bad schedule, E002 bad timeout, E003 bad retries, E004 bad lanes, E005 bad ``rate_limit``
- E010 duplicate job name, E011 kick of an unknown job, E012 kick cycle
- E020 queue model without a queue manager, E021 bad ``Queue.max_attempts``, E022 unknown ``Queue`` option
- E030 ``FABRIKA`` is not a dict, E031 unknown key, E032 bad value, E033 unknown ``LISTEN_DATABASE``,
  E034 ``OWN_MAIL_SENDER`` that does not import to a callable, E035 ``FILE_STATE`` that does not import to a
  callable, E036 a bad ``FILE_SWEEP``, E037 a ``FILE_SWEEP`` storage whose folder is no media folder (empty,
  relative, the root, or holding the project, its settings, an app, ``STATIC_ROOT``, ``sys.prefix`` or the working
  directory), E038 a bad ``HEALTH`` (not a dict, an unknown key, a value that is no positive number, a ratio above
  1, an error threshold below its warning threshold)
- E040 a ``TASKS`` backend that is ``fabrika_django.tasks.FabrikaBackend`` without fabrika_django installed
  (``_tasks_checks``; also the backend's own ``check()``, where Django's tasks checks run and fabrika's do not)
- E041 a periodic task's name outside ``[a-z0-9_]{1,64}``, E042 a periodic ``task`` that does not import to a
  ``@task`` function, E043 a periodic task of another backend, E044 a bad periodic ``schedule``, E045 periodic
  ``args``/``kwargs``/``priority`` that are no JSON list, JSON object, priority; E047 an ``OPTIONS["periodic"]``
  that is no dict of entries, or an entry without ``task`` and ``schedule`` or with an unknown key (``_periodic``)
- E046 a bad ``TASKS[...]["OPTIONS"]["rate_limit"]``: not a dict, a queue the backend does not serve, a rate not
  ``N/s``, ``N/m`` or ``N/h`` (``_tasks_checks``)
- W001 a top-level ``FABRIKA_*`` setting (fabrika reads only the ``FABRIKA`` dict)
- W002 an ``actions`` entry that no installed model's ``Meta`` declares (a typo, or a permission made by hand)
- W040 a MariaDB/MySQL database whose transactions would not run at READ COMMITTED (``_isolation.py``)
- W054 (``--deploy``, PostgreSQL) a queue table whose dead tuples vacuum has not removed: its autovacuum settings
"""

from django.core import checks

from .. import (
    _isolation,  # noqa: F401  registers fabrika.W040
    _tasks_checks,
)
from . import _jobs, _settings, _tables  # noqa: F401  register the checks

# fabrika.E040, registered here (not where it is defined: the backend imports that module, and a check registered
# by a backend made while the checks run would miss that run).
checks.register("fabrika")(_tasks_checks.check_tasks_backends)
checks.register("fabrika")(_tasks_checks.check_tasks_rate_limits)
checks.register("fabrika")(_tasks_checks.check_tasks_periodic)
