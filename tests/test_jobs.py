"""@cron checks its own arguments at import: each refusal's class and message, and nothing registered."""

from datetime import timedelta

import pytest

from fabrika_django.jobs import cron, registry


def _declare(**options):
    def refused_job(ctx):
        pass

    return cron(None, **options)(refused_job)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"retries": -1}, ValueError, "retries=-1 is not valid: give a whole number, 0 or more."),
        ({"retries": 1.5}, ValueError, "retries=1.5 is not valid: give a whole number, 0 or more."),
        ({"retries": True}, ValueError, "retries=True is not valid: give a whole number, 0 or more."),
        ({"retries": "2"}, ValueError, "retries='2' is not valid: give a whole number, 0 or more."),
        ({"timeout": 60}, TypeError, "timeout=60 is not a timedelta: give e.g. timedelta(minutes=10)."),
        (
            {"timeout": timedelta(0)},
            ValueError,
            "timeout=0:00:00 is out of bounds: give more than 0 and at most one day.",
        ),
        (
            {"timeout": timedelta(days=1, seconds=1)},
            ValueError,
            "timeout=1 day, 0:00:01 is out of bounds: give more than 0 and at most one day.",
        ),
        (
            {"timeout": -timedelta(minutes=1)},
            ValueError,
            "timeout=-1 day, 23:59:00 is out of bounds: give more than 0 and at most one day.",
        ),
        ({"name": "has space"}, ValueError, "Cron job name 'has space' is not valid: use up to 100 letters, "),
        ({"name": "x" * 101}, ValueError, f"Cron job name '{'x' * 101}' is not valid: use up to 100 letters, "),
        ({"name": ".hidden"}, ValueError, "Cron job name '.hidden' is not valid: use up to 100 letters, "),
        ({"name": 7}, ValueError, "Cron job name 7 is not valid: use up to 100 letters, "),
        (
            {"mailer": "smtp"},
            ValueError,
            "mailer='smtp' is not a mailer: use 'installation', 'own' or None.",
        ),
        (
            {"kicks": "send_outbox"},
            TypeError,
            "kicks='send_outbox' is a string: give a list of names, e.g. ['send_outbox'].",
        ),
        ({"kicks": ["send_outbox", ""]}, TypeError, "kicks holds '': every entry must be a non-empty string."),
        ({"kicks": [None]}, TypeError, "kicks holds None: every entry must be a non-empty string."),
    ],
    ids=lambda value: repr(value)[:40] if isinstance(value, dict) else "",
)
def test_cron_refuses_a_bad_argument_at_import_saying_what_to_give(options, error, message):
    with pytest.raises(error) as refused:
        _declare(**options)
    assert str(refused.value).startswith(message)
    assert "refused_job" not in registry and str(options.get("name")) not in registry


def test_a_name_at_the_limit_with_dots_and_dashes_is_accepted():
    name = "a.b-c_" + "x" * 94
    job = cron(None, name=name)(lambda ctx: None)
    try:
        assert registry.get(name) is job
    finally:
        registry.unregister(name)
