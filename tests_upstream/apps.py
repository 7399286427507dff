from django.apps import AppConfig


class UpstreamConfig(AppConfig):
    name = "tests_upstream"

    def ready(self) -> None:
        # Their tasks live in their project's package (``tests``, their settings' own in their repository): a
        # worker imports a row's task only from the project's code, so make theirs imported code in every process.
        import tests.tasks  # noqa: F401
