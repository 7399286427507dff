import sys

from django.apps import AppConfig
from django.conf import settings
from django.utils.module_loading import autodiscover_modules, import_string
from django.utils.translation import gettext_lazy as _


class FabrikaConfig(AppConfig):
    name = "fabrika_django"
    label = "fabrika_django"
    verbose_name = _("Background jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  registers the system checks
        from .jobs import registry
        from .ops import _jobs  # noqa: F401  registers fabrika's own jobs

        # Like admin.autodiscover(): every installed app's jobs.py registers its @cron jobs.
        autodiscover_modules("jobs", register_to=registry)
        _register_task_jobs()


def _register_task_jobs() -> None:
    """Register the built-in job of each queue of the ``TASKS`` backends that are fabrika's.

    fabrika_django.tasks is imported only when a configured backend imported it: on Django 5.2 it needs the
    optional django-tasks backport.
    """
    for params in getattr(settings, "TASKS", {}).values():
        try:
            import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django's own check of TASKS reports it
    if "fabrika_django.tasks" in sys.modules:
        from .tasks import register_configured_backends

        register_configured_backends()
