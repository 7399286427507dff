from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


class FabrikaConfig(AppConfig):
    name = "fabrika_django"
    label = "fabrika_django"
    verbose_name = _("Background jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  registers the system checks
        from .jobs import registry

        # Like admin.autodiscover(): every installed app's jobs.py registers its @cron jobs.
        autodiscover_modules("jobs", register_to=registry)
