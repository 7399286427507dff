"""The system checks: each problem is one message with its stable id, the job's name and a hint."""

from datetime import timedelta

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import models
from django.test import override_settings
from django.test.utils import isolate_apps

from fabrika_django.checks._jobs import _check_jobs
from fabrika_django.checks._settings import _check_settings
from fabrika_django.checks._tables import _check_queue_models
from fabrika_django.conf import DEFAULTS
from fabrika_django.jobs import CronJob, JobRegistry
from fabrika_django.models import QueueModel
from fabrika_django.queues import QueueManager, QueueQuerySet
from fabrika_django.schedule import RULE, Schedule

DECLARE = "Declare the job with @cron(...), which checks its arguments at import."
CYCLE_HINT = "Kicks must never form a cycle: remove one of these kicks and let that job's schedule pick up."


def _job(name, schedule="*/5 * * * *", module="app.jobs", **options):
    parsed = Schedule(schedule) if isinstance(schedule, str) else schedule
    return CronJob(name=name, func=lambda ctx: None, schedule=parsed, module=module, **options)


def _registry(*jobs):
    fresh = JobRegistry()
    for job in jobs:
        fresh.register(job)
    return fresh


def test_the_demo_project_passes_every_check():
    assert checks.run_checks(tags=["fabrika"]) == []
    call_command("check", "--fail-level", "WARNING")  # raises SystemCheckError on any message


def test_well_formed_jobs_with_acyclic_kicks_give_no_message():
    jobs = _registry(_job("a", kicks=("b",)), _job("b", None, kicks=("c",)), _job("c", "@hourly"))
    assert _check_jobs(jobs=jobs) == []


def test_a_schedule_that_bypassed_cron_is_an_error_naming_the_job():
    # A Schedule validates itself, so only a job built by hand (not by @cron) can carry a raw string.
    jobs = _registry(
        CronJob(name="bad", func=lambda ctx: None, schedule="61 * * * *"),
        CronJob(name="raw", func=lambda ctx: None, schedule="15 * * * *"),
    )
    hint = f"Give {RULE}, or None. " + DECLARE
    assert hint.startswith(
        "Give five cron fields in UTC (minute hour day-of-month month day-of-week), such as '15 * * * *', "
        "or a macro such as '@hourly', or None. "
    )
    assert _check_jobs(jobs=jobs) == [
        checks.Error(
            "Cron job 'bad' has schedule '61 * * * *', which is not a cron expression.",
            hint=hint,
            obj="bad",
            id="fabrika.E001",
        ),
        checks.Error(
            "Cron job 'raw' has schedule '15 * * * *', which is a string, not a Schedule.",
            hint=hint,
            obj="raw",
            id="fabrika.E001",
        ),
    ]


def test_a_timeout_over_a_day_or_not_a_timedelta_and_negative_retries_are_errors():
    jobs = _registry(
        _job("long", timeout=timedelta(days=2)),
        _job("number", timeout=600),
        _job("zero", timeout=timedelta(0), retries=-1),
    )

    def timeout_error(name, value):
        return checks.Error(
            f"Cron job '{name}' has timeout {value!r}, which is not a timedelta of more than 0 and at most one day.",
            hint="Give e.g. timeout=timedelta(minutes=10). " + DECLARE,
            obj=name,
            id="fabrika.E002",
        )

    assert _check_jobs(jobs=jobs) == [
        timeout_error("long", timedelta(days=2)),
        timeout_error("number", 600),
        timeout_error("zero", timedelta(0)),
        checks.Error(
            "Cron job 'zero' has retries=-1, which is not a whole number of 0 or more.",
            hint="Give e.g. retries=2. " + DECLARE,
            obj="zero",
            id="fabrika.E003",
        ),
    ]


def test_a_duplicate_name_from_another_module_is_an_error_naming_both_modules():
    jobs = _registry(_job("send", module="shop.jobs"), _job("send", module="mail.jobs"))
    assert list(jobs) == [jobs.get("send")] and jobs.get("send").module == "shop.jobs"
    assert _check_jobs(jobs=jobs) == [
        checks.Error(
            "Cron job 'send' is declared in shop.jobs and mail.jobs.",
            hint="Job names are unique across the project: give one of them another name with @cron(..., name=...).",
            obj="send",
            id="fabrika.E010",
        )
    ]


def test_a_kick_of_an_unknown_job_is_an_error_naming_both():
    jobs = _registry(_job("a", kicks=("b", "ghost")), _job("b"))
    assert _check_jobs(jobs=jobs) == [
        checks.Error(
            "Cron job 'a' kicks 'ghost', which is no registered job.",
            hint="Fix the name in kicks=[...], or declare that job with @cron in an installed app's jobs.py.",
            obj="a",
            id="fabrika.E011",
        )
    ]


def test_each_kick_cycle_is_one_error_that_names_the_cycle():
    jobs = _registry(
        _job("c", kicks=("a",)),
        _job("a", kicks=("b",)),
        _job("b", kicks=("c", "d")),
        _job("d"),
        _job("self", kicks=("self",)),
        _job("x", kicks=("y",)),
        _job("y", kicks=("x",)),
    )
    assert _check_jobs(jobs=jobs) == [
        checks.Error(
            "Cron jobs kick each other in a cycle: a -> b -> c -> a.", hint=CYCLE_HINT, obj="a", id="fabrika.E012"
        ),
        checks.Error(
            "Cron jobs kick each other in a cycle: self -> self.", hint=CYCLE_HINT, obj="self", id="fabrika.E012"
        ),
        checks.Error("Cron jobs kick each other in a cycle: x -> y -> x.", hint=CYCLE_HINT, obj="x", id="fabrika.E012"),
    ]


def test_two_cycles_through_one_job_are_two_errors():
    jobs = _registry(_job("a", kicks=("b", "c")), _job("b", kicks=("a",)), _job("c", kicks=("a",)))
    assert [message.msg for message in _check_jobs(jobs=jobs)] == [
        "Cron jobs kick each other in a cycle: a -> b -> a.",
        "Cron jobs kick each other in a cycle: a -> c -> a.",
    ]


@isolate_apps("testproject.lab")
def test_a_queue_model_whose_default_manager_is_no_queue_manager_is_an_error():
    class Plain(QueueModel):
        objects = models.Manager()

        class Meta:
            app_label = "lab"

    class ViaQuerySet(QueueModel):
        objects = QueueQuerySet.as_manager()

        class Meta:
            app_label = "lab"

    class Derived(QueueModel):
        class Custom(QueueManager):
            pass

        objects = Custom()

        class Meta:
            app_label = "lab"

    assert _check_queue_models(models=[Plain, ViaQuerySet, Derived]) == [
        checks.Error(
            "Queue model 'lab.Plain' has default manager 'objects' (Manager), which is not a QueueManager: "
            "claim() and the state filters are missing.",
            hint="Derive the manager from fabrika_django.queues.QueueManager (or its queryset from "
            "QueueQuerySet), or declare `objects = QueueManager()` first.",
            obj=Plain,
            id="fabrika.E020",
        )
    ]


@isolate_apps("testproject.lab")
def test_a_max_attempts_that_is_not_a_whole_number_of_one_or_more_is_an_error():
    class Zero(QueueModel):
        class Meta:
            app_label = "lab"

        class Queue:
            max_attempts = 0

    class Text(QueueModel):
        class Meta:
            app_label = "lab"

        class Queue:
            max_attempts = "5"

    class Fine(QueueModel):
        class Meta:
            app_label = "lab"

        class Queue:
            max_attempts = 1

    def error(model, value):
        return checks.Error(
            f"Queue model '{model._meta.label}' has Queue.max_attempts={value!r}, "
            "which is not a whole number of 1 or more.",
            hint="Set `class Queue: max_attempts = 5` (10 when omitted).",
            obj=model,
            id="fabrika.E021",
        )

    assert _check_queue_models(models=[Zero, Text, Fine]) == [error(Zero, 0), error(Text, "5")]


def test_the_project_queue_models_pass():
    assert _check_queue_models() == []


@override_settings(FABRIKA={"POLL_INTERVALL": 2, "LEASE_SECONDS": 0, "ENFORCE_ACTIONS": "yes", "ZZZ": 1})
def test_unknown_keys_and_bad_values_in_fabrika_are_errors_with_a_suggestion():
    # Keys another part of fabrika adds to conf.DEFAULTS later are known here too.
    known = ", ".join(sorted(DEFAULTS))
    assert _check_settings() == [
        checks.Error(
            "Setting FABRIKA['ENFORCE_ACTIONS'] is 'yes', which is not valid.",
            hint="Give True or False.",
            id="fabrika.E032",
        ),
        checks.Error(
            "Setting FABRIKA['LEASE_SECONDS'] is 0, which is not valid.",
            hint="Give a number of seconds above 0, e.g. 30.",
            id="fabrika.E032",
        ),
        checks.Error(
            "Setting FABRIKA has unknown key 'POLL_INTERVALL'.",
            hint=f"Did you mean 'POLL_INTERVAL'? Known keys: {known}.",
            id="fabrika.E031",
        ),
        checks.Error("Setting FABRIKA has unknown key 'ZZZ'.", hint=f"Known keys: {known}.", id="fabrika.E031"),
    ]


@override_settings(FABRIKA=[("LEASE_SECONDS", 30)])
def test_a_fabrika_setting_that_is_not_a_dict_is_an_error():
    assert _check_settings() == [
        checks.Error(
            "Setting FABRIKA is a list, not a dict.",
            hint="Set FABRIKA = {'LEASE_SECONDS': 30, ...} with the keys you change, or remove it.",
            id="fabrika.E030",
        )
    ]


@override_settings(FABRIKA={"LISTEN_DATABASE": "direct"})
def test_a_listen_database_that_is_no_configured_alias_is_an_error():
    assert _check_settings() == [
        checks.Error(
            "Setting FABRIKA['LISTEN_DATABASE'] names database 'direct', which is not in DATABASES.",
            hint="Name one of default, or add a DATABASES entry that connects directly "
            "(not through a transaction pooler).",
            id="fabrika.E033",
        )
    ]


@override_settings(FABRIKA_POLL_INTERVAL=5, FABRIKA_SPEED=1)
def test_a_top_level_fabrika_setting_is_a_warning_that_points_to_the_dict():
    assert _check_settings() == [
        checks.Warning(
            "Setting FABRIKA_POLL_INTERVAL is not read by fabrika_django.",
            hint="Put it in the FABRIKA dict instead: FABRIKA = {'POLL_INTERVAL': ...}.",
            id="fabrika.W001",
        ),
        checks.Warning(
            "Setting FABRIKA_SPEED is not read by fabrika_django.",
            hint="fabrika_django reads only the FABRIKA dict; remove this setting.",
            id="fabrika.W001",
        ),
    ]


def test_an_action_no_installed_model_declares_is_a_warning_naming_the_job():
    jobs = _registry(
        _job("a", actions=frozenset({"tasks.change_task", "tasks.change_tsk", "auth.view_user"})),
        _job("b", actions=frozenset({"reminders.delete_reminder"})),
        _job("c", actions=None),
        _job("d", actions=frozenset()),
    )
    assert _check_jobs(jobs=jobs) == [
        checks.Warning(
            "Cron job 'a' holds action 'tasks.change_tsk', which no installed model declares.",
            hint="Give app_label.codename of a model's permission, e.g. 'tasks.change_task' "
            "(add_, change_, delete_, view_ and the Meta.permissions of each model).",
            obj="a",
            id="fabrika.W002",
        )
    ]


@isolate_apps("testproject.lab")
def test_an_unknown_queue_option_is_an_error_with_a_suggestion():
    class Typo(QueueModel):
        class Meta:
            app_label = "lab"

        class Queue:
            max_attempt = 3
            colour = "blue"

    hint = "Queue options are: max_attempts."
    assert _check_queue_models(models=[Typo]) == [
        checks.Error(
            "Queue model 'lab.Typo' has unknown Queue option 'colour'.", hint=hint, obj=Typo, id="fabrika.E022"
        ),
        checks.Error(
            "Queue model 'lab.Typo' has unknown Queue option 'max_attempt'.",
            hint="Did you mean 'max_attempts'? " + hint,
            obj=Typo,
            id="fabrika.E022",
        ),
    ]


@pytest.mark.parametrize("path", ["testproject.lab.mail.nowhere", "no.such.module.factory", "testproject.lab.mail.MAX"])
def test_an_own_mail_sender_that_does_not_import_to_a_callable_is_an_error(settings, path):
    settings.FABRIKA = {"OWN_MAIL_SENDER": path}
    assert _check_settings() == [
        checks.Error(
            f"Setting FABRIKA['OWN_MAIL_SENDER'] is {path!r}, which does not import to a callable.",
            hint="Name a function that returns a Django e-mail backend (or None), e.g. 'myapp.mail.sender'.",
            id="fabrika.E034",
        )
    ]


def test_an_own_mail_sender_factory_that_imports_passes(settings):
    settings.FABRIKA = {"OWN_MAIL_SENDER": "testproject.lab.mail.own_sender"}
    assert _check_settings() == []


@override_settings(FABRIKA={"LISTEN_DATABASE": None})
def test_listen_database_none_is_accepted_the_worker_then_polls():
    assert _check_settings() == []


@override_settings(FABRIKA={"LISTEN_DATABASE": 5})
def test_listen_database_that_is_not_an_alias_is_refused_naming_none_as_the_way_to_poll():
    assert [(error.id, error.hint) for error in _check_settings()] == [
        ("fabrika.E032", "Give a database alias, e.g. 'default', or None to poll.")
    ]


# --- fabrika.W040: READ COMMITTED on MariaDB and MySQL ---------------------------------------------------


def _w040(engine, **options):
    from fabrika_django._isolation import isolation_warnings

    return isolation_warnings({"reporting": {"ENGINE": engine, "NAME": "app", "OPTIONS": options}}, asked=set())


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"isolation_level": "repeatable read"}, "REPEATABLE READ"),
        ({"isolation_level": "serializable"}, "SERIALIZABLE"),
        ({"isolation_level": "read uncommitted"}, "READ UNCOMMITTED"),
        ({"isolation_level": None}, "the server's default level (REPEATABLE READ unless changed)"),
    ],
)
def test_a_mysql_database_configured_off_read_committed_is_a_warning_naming_it(options, said):
    (warning,) = _w040("django.db.backends.mysql", **options)
    assert (warning.id, warning.obj) == ("fabrika.W040", "reporting")
    assert f"'reporting' runs transactions at {said}: fabrika needs READ COMMITTED" in warning.msg
    assert "isolation_level" in warning.hint


@pytest.mark.parametrize(
    ("engine", "options"),
    [
        ("django.db.backends.mysql", {}),  # Django's own default: read committed
        ("django.db.backends.mysql", {"isolation_level": "READ COMMITTED"}),
        ("django.db.backends.postgresql", {"isolation_level": 3}),
    ],
)
def test_read_committed_on_mysql_and_any_level_elsewhere_pass(engine, options):
    assert _w040(engine, **options) == []


@pytest.mark.mysql
@pytest.mark.django_db
def test_asked_about_a_database_the_check_reads_the_sessions_level_from_the_server():
    from django.db import connection

    from fabrika_django._isolation import check_isolation, session_isolation

    assert session_isolation("default") == "read committed"  # what Django set when it connected
    assert check_isolation(databases=["default"]) == []
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # as an init_command could
    try:
        assert check_isolation() == []  # the settings alone say nothing wrong
        (warning,) = check_isolation(databases=["default"])
        assert "'default' runs transactions at REPEATABLE READ" in warning.msg
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
