"""The admin with Django's test client: queue tables (state, filter, requeue), jobs, attempts, the overview."""

import re
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin import site
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.db import connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from fabrika_django.admin import QueueModelAdmin, QueueModelAdminMixin, StateListFilter, _overview
from fabrika_django.admin._jobs import describe_schedule
from fabrika_django.jobs import registry
from fabrika_django.models import Attempt, Job, KickRequest, Lease, QueueModel
from fabrika_django.ops._counts import count_queue, count_sql, queue_models
from fabrika_django.schedule import Schedule
from testproject.outbox.models import OutboxMail, Registration
from testproject.reminders.admin import ReminderAdmin
from testproject.reminders.models import Reminder
from testproject.reports.models import ReportRequest
from testproject.tasks.models import Task

from .factories import OutboxMailFactory, ReminderFactory
from .jobs_helpers import temporary_job

pytestmark = pytest.mark.django_db

REMINDERS = "/admin/reminders/reminder/"
JOBS = "/admin/fabrika_django/job/"
ATTEMPTS = "/admin/fabrika_django/attempt/"
OVERVIEW = "/admin/fabrika_django/overview/"


def _messages(response):
    return [str(message) for message in get_messages(response.wsgi_request)]


def _actions(response):
    """Return the names of the actions the changelist offers (none at all: no action form)."""
    form = response.context["action_form"]
    return {name for name, _label in form.fields["action"].choices} if form is not None else set()


def _rows(now=None):
    """One reminder in each state (max_attempts is 3); returns them by state."""
    now = now or timezone.now()
    return {
        "waiting": ReminderFactory(due=now + timedelta(hours=2)),
        "due_now": ReminderFactory(due=now - timedelta(minutes=10), attempts=1, last_failure="send"),
        "dead": ReminderFactory(due=now - timedelta(hours=3), attempts=3, version=3, last_failure="send"),
        "done": ReminderFactory(due=None, attempts=1, version=1),
    }


def _staff(username, *permissions):
    user = get_user_model().objects.create_user(username, password="pw", is_staff=True)
    for label in permissions:
        app_label, codename = label.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer():
    """A staff user who may view reminders and jobs but change neither."""
    return _staff("viewer", "reminders.view_reminder", "fabrika_django.view_job")


@pytest.fixture
def changer():
    """A staff user who may view and change reminders and jobs."""
    return _staff(
        "changer",
        "reminders.view_reminder",
        "reminders.change_reminder",
        "fabrika_django.view_job",
        "fabrika_django.change_job",
    )


def _requeue_url(row):
    return reverse("admin:reminders_reminder_requeue", args=[row.pk])


# -- the queue table's list ----------------------------------------------------------------------------


def test_state_column_shows_a_badge_for_each_state(admin_client):
    _rows()
    html = admin_client.get(REMINDERS).content.decode()
    badges = re.findall(r'fabrika-badge fabrika-badge--([a-z-]+)">([a-z ]+)<', html)
    assert sorted(badges) == [("dead", "dead"), ("done", "done"), ("due-now", "due now"), ("waiting", "waiting")]


@pytest.mark.parametrize("state", ["waiting", "due_now", "dead", "done"])
def test_state_filter_lists_exactly_the_rows_in_that_state(admin_client, state):
    rows = _rows()
    response = admin_client.get(REMINDERS, {"state": state})
    expected = {"waiting": {"waiting", "due_now"}}.get(state, {state})
    assert {row.pk for row in response.context["cl"].result_list} == {rows[name].pk for name in expected}


def test_state_filter_offers_the_four_states(admin_client):
    response = admin_client.get(REMINDERS)
    (spec,) = [spec for spec in response.context["cl"].filter_specs if isinstance(spec, StateListFilter)]
    assert [str(label) for _value, label in spec.lookup_choices] == ["waiting", "due now", "dead", "done"]


def moment_html(day, time):
    """The second line of a moment in a list: its date and its time with the zone, neither broken inside."""
    return (
        f'<span class="fabrika-quiet"><span class="fabrika-nowrap">{day}</span> '
        f'<span class="fabrika-nowrap">{time}</span></span>'
    )


def test_due_column_shows_the_time_relative_and_absolute_with_its_zone(admin_client, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    soon = timezone.now() + timedelta(hours=2, minutes=1)
    ReminderFactory(due=soon)
    ReminderFactory(due=datetime(2026, 7, 1, 10, 0, tzinfo=UTC))  # summer: 12:00 in Berlin
    html = admin_client.get(REMINDERS, {"o": "3"}).content.decode()
    local = timezone.localtime(soon, ZoneInfo("Europe/Berlin"))
    # The zone's name in the tooltip too, after the locale's long form of the time.
    tooltip = rf'title="[A-Z][a-z]{{2}}\.? \d+, 20\d\d, [^"]+ {local.tzname()}">'
    second = re.escape(moment_html(f"{local:%Y-%m-%d}", f"{local:%H:%M} {local.tzname()}"))
    assert re.search(rf"{tooltip}in 2\xa0hours {second}</time>", html)
    assert f"ago {moment_html('2026-07-01', '12:00 CEST')}</time>" in html


def test_list_shows_attempts_and_last_failure_columns(admin_client):
    _rows()
    response = admin_client.get(REMINDERS)
    assert response.context["cl"].list_display[-5:] == [
        "queue_state",
        "queue_due",
        "sent_at",
        "attempts",
        "last_failure",
    ]
    assert '<td class="field-last_failure">send</td>' in response.content.decode()


def test_framework_fields_are_shown_read_only_and_a_save_does_not_change_them(admin_client):
    row = _rows()["dead"]
    url = reverse("admin:reminders_reminder_change", args=[row.pk])
    response = admin_client.get(url)
    readonly = response.context["adminform"].readonly_fields
    title, options = response.context["adminform"].fieldsets[0]
    assert (str(title), options["fields"]) == (
        "Queue",
        [("queue_state", "attempts", "queue_due"), ("version", "last_failure")],
    )
    assert {"queue_state", "attempts", "queue_due", "version", "last_failure"} <= set(readonly)
    data = {"note": "renamed", "email": row.email, "attempts": "0", "version": "0", "last_failure": "", "due": ""}
    assert admin_client.post(url, data).status_code == 302
    row.refresh_from_db()
    assert (row.note, row.attempts, row.version, row.last_failure, row.state) == ("renamed", 3, 3, "send", "dead")


# -- "Requeue selected" --------------------------------------------------------------------------------


def _act(client, action, rows, url=REMINDERS):
    return client.post(url, {"action": action, ACTION_CHECKBOX_NAME: [row.pk for row in rows]})


def test_requeue_action_makes_dead_and_waiting_rows_due_now_and_leaves_done_rows(admin_client):
    rows = _rows()
    before = timezone.now()
    response = _act(admin_client, "requeue_selected", [rows["dead"], rows["due_now"], rows["done"]])
    assert response.status_code == 302
    assert _messages(response) == ["Requeued 2 reminders.", "Skipped 1 done row: its work is finished."]
    for name in ("dead", "due_now"):
        rows[name].refresh_from_db()
        assert (rows[name].attempts, rows[name].state) == (0, "waiting")
        assert before <= rows[name].due <= timezone.now()
    rows["done"].refresh_from_db()
    assert (rows["done"].due, rows["done"].version) == (None, 1)


def test_requeue_action_writes_each_requeued_row_to_the_admin_history(admin_client, admin_user):
    rows = _rows()
    _act(admin_client, "requeue_selected", [rows["dead"], rows["done"]])
    (entry,) = LogEntry.objects.all()
    assert (entry.user, entry.object_id, entry.get_change_message()) == (
        admin_user,
        str(rows["dead"].pk),
        "Changed due and attempts.",
    )


def test_requeue_action_reports_a_row_changed_meanwhile_and_leaves_it_as_it_is(admin_client, monkeypatch):
    rows = _rows()
    dead, due_now = rows["dead"], rows["due_now"]
    original = Reminder.requeue

    def requeue_after_another_writer(row, at=None):
        if row.pk == dead.pk:  # another session claims or edits the row between the list's read and the write
            Reminder.objects.filter(pk=row.pk).update(version=F("version") + 1, last_failure="other")
        return original(row, at)

    monkeypatch.setattr(Reminder, "requeue", requeue_after_another_writer)
    response = _act(admin_client, "requeue_selected", [dead, due_now])
    assert _messages(response) == [
        "Requeued 1 reminder.",
        f"Changed since they were read, so left as they are: {dead.pk}. Reload the list and try again.",
    ]
    dead.refresh_from_db()
    assert (dead.attempts, dead.version, dead.last_failure, dead.state) == (3, 4, "other", "dead")


def test_staff_without_change_permission_gets_no_requeue_action_and_cannot_post_it(viewer):
    dead = _rows()["dead"]
    response = viewer.get(REMINDERS)
    assert response.status_code == 200
    assert "requeue_selected" not in _actions(response)
    response = _act(viewer, "requeue_selected", [dead])
    dead.refresh_from_db()
    assert (dead.attempts, dead.state) == (3, "dead")
    assert "Requeued" not in " ".join(_messages(response))


def test_staff_with_change_permission_gets_the_requeue_action(changer):
    dead = _rows()["dead"]
    assert "requeue_selected" in _actions(changer.get(REMINDERS))
    assert _messages(_act(changer, "requeue_selected", [dead])) == ["Requeued 1 reminder."]


# -- the "Requeue" button --------------------------------------------------------------------------------


def test_requeue_button_is_on_the_page_of_a_dead_row_for_a_user_who_may_change_it(admin_client, changer, viewer):
    rows = _rows()
    page = reverse("admin:reminders_reminder_change", args=[rows["dead"].pk])
    for client in (admin_client, changer):
        html = client.get(page).content.decode()
        assert f'action="{_requeue_url(rows["dead"])}"' in html
        assert 'name="version" value="3"' in html and "csrfmiddlewaretoken" in html
    assert "/requeue/" not in viewer.get(page).content.decode()
    done_page = reverse("admin:reminders_reminder_change", args=[rows["done"].pk])
    assert "/requeue/" not in admin_client.get(done_page).content.decode()


def test_requeue_button_makes_the_row_waiting_and_returns_to_its_page(changer):
    dead = _rows()["dead"]
    response = changer.post(_requeue_url(dead), {"version": "3"})
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:reminders_reminder_change", args=[dead.pk])
    assert _messages(response) == ["Requeued 1 reminder."]
    dead.refresh_from_db()
    assert (dead.attempts, dead.version, dead.state, dead.is_due_now) == (0, 4, "waiting", True)


def test_requeue_button_with_the_version_of_an_older_page_reports_the_conflict_and_writes_nothing(admin_client):
    dead = _rows()["dead"]
    response = admin_client.post(_requeue_url(dead), {"version": "2"})
    assert response.status_code == 302
    assert _messages(response) == [
        "Requeued 0 reminders.",
        f"Changed since they were read, so left as they are: {dead.pk}. Reload the list and try again.",
    ]
    dead.refresh_from_db()
    assert (dead.attempts, dead.version, dead.state) == (3, 3, "dead")


def test_requeue_button_post_without_change_permission_is_403(viewer):
    dead = _rows()["dead"]
    assert viewer.post(_requeue_url(dead), {"version": "3"}).status_code == 403
    dead.refresh_from_db()
    assert dead.state == "dead"


def test_requeue_button_refuses_get(admin_client):
    dead = _rows()["dead"]
    assert admin_client.get(_requeue_url(dead)).status_code == 405
    dead.refresh_from_db()
    assert dead.state == "dead"


def test_requeue_button_without_a_csrf_token_is_403(admin_user):
    dead = _rows()["dead"]
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(_requeue_url(dead), {"version": "3"}).status_code == 403
    dead.refresh_from_db()
    assert dead.state == "dead"


def test_requeue_button_for_anonymous_users_goes_to_the_login_page():
    dead = _rows()["dead"]
    response = Client().post(_requeue_url(dead), {"version": "3"})
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    dead.refresh_from_db()
    assert dead.state == "dead"


def test_requeue_button_leaves_a_done_row_done(admin_client):
    done = _rows()["done"]
    response = admin_client.post(_requeue_url(done), {"version": "1"})
    assert _messages(response) == ["This row is done: its work is finished, so it was not requeued."]
    done.refresh_from_db()
    assert (done.due, done.version) == (None, 1)


def test_a_new_row_is_added_as_usual_and_starts_due_now(admin_client):
    assert admin_client.get(f"{REMINDERS}add/").status_code == 200
    response = admin_client.post(f"{REMINDERS}add/", {"note": "new", "email": "n@example.com"})
    assert response.status_code == 302
    row = Reminder.objects.get(note="new")
    assert (row.attempts, row.version, row.state, row.is_due_now) == (0, 0, "waiting", True)


def test_requeue_button_of_an_unknown_row_is_404(admin_client):
    assert admin_client.post(reverse("admin:reminders_reminder_requeue", args=[999999])).status_code == 404


# -- the mixin -----------------------------------------------------------------------------------------------


def test_mixin_keeps_a_projects_columns_filters_and_actions_and_adds_its_own(rf, admin_user):
    class Base(QueueModelAdminMixin, QueueModelAdmin.__bases__[1]):
        list_display = ("note", "queue_state")
        list_filter = ("sent_at",)
        actions = ["mark_seen"]

        def mark_seen(self, request, queryset):
            """Mark as seen"""

    class Declared(Base):
        fieldsets = [("Reminder", {"fields": [("note", "email")]})]

    model_admin = Base(Reminder, site)
    request = rf.get(REMINDERS)
    request.user = admin_user
    row = ReminderFactory()
    queue = ("Queue", {"fields": [("queue_state", "attempts", "queue_due"), ("version", "last_failure")]})
    fieldsets = Declared(Reminder, site).get_fieldsets(request, row)
    assert [(str(title), options) for title, options in fieldsets] == [
        queue,
        ("Reminder", {"fields": [("note", "email")]}),
    ]
    assert model_admin.get_list_display(request) == ["note", "queue_state", "attempts", "queue_due", "last_failure"]
    assert model_admin.get_list_filter(request) == [StateListFilter, "sent_at"]
    assert {"mark_seen", "requeue_selected", "delete_selected"} <= set(model_admin.get_actions(request))
    assert isinstance(site._registry[Reminder], ReminderAdmin)
    assert isinstance(site._registry[Reminder], QueueModelAdminMixin)


def test_every_demo_queue_model_is_registered_with_the_queue_admin():
    for model in (Registration, OutboxMail, Reminder, ReportRequest):
        assert isinstance(site._registry[model], QueueModelAdminMixin)


# -- jobs ------------------------------------------------------------------------------------------------------


def test_jobs_page_lists_every_registered_job_even_one_without_a_row_and_writes_none(admin_client):
    Job.objects.all().delete()
    Job.objects.create(name="mark_overdue")
    response = admin_client.get(JOBS)
    assert response.status_code == 200
    names = [job.name for job in response.context["cl"].result_list]
    assert names == sorted(job.name for job in registry)
    assert list(Job.objects.values_list("name", flat=True)) == ["mark_overdue"]  # a GET writes nothing
    assert not Lease.objects.exists()
    page = admin_client.get(reverse("admin:fabrika_django_job_change", args=["send_reminders"]))
    assert page.status_code == 200 and "fabrika_run_url" in page.context


def test_overview_lists_a_job_without_rows_and_writes_none(admin_client):
    Job.objects.all().delete()
    response = admin_client.get(OVERVIEW)
    assert {job["name"] for job in response.context["jobs"]} == {job.name for job in registry}
    assert not Job.objects.exists() and not Lease.objects.exists()


def test_jobs_page_shows_the_schedule_as_cron_and_in_words_and_the_next_fire_in_local_time_and_utc(admin_client):
    Job.objects.create(name="mark_overdue", next_fire=datetime(2030, 1, 1, 0, 15, tzinfo=UTC))
    html = admin_client.get(JOBS).content.decode()
    row = html[html.index(">mark_overdue<") : html.index(">render_reports<")]
    assert "<code>15 * * * *</code>" in row
    assert "hourly at minute 15" in row
    # Europe/Berlin is the test project's time zone: 01:15 CET is 00:15 UTC. The list says how far and the UTC
    # time; the local time is the tooltip (the job's page shows both in full).
    assert re.search(
        r'<span class="fabrika-nowrap" title="Jan\. 1, 2030, 1:15 a\.m\. CET">in \d+\xa0years?</span> '
        r'<span class="fabrika-quiet">01-01 00:15 UTC</span>',
        row,
    )
    page = admin_client.get(reverse("admin:fabrika_django_job_change", args=["mark_overdue"])).content.decode()
    assert re.search(
        r"Jan\. 1, 2030, 1:15 a\.m\. CET</span> <span class=\"fabrika-quiet\">\(2030-01-01 00:15 UTC\)", page
    )


def test_job_is_shown_active_while_its_lease_is_held_and_pending_once_kicked(admin_client):
    now = timezone.now()
    Job.objects.create(name="mark_overdue", pending_since=now)
    Lease.objects.create(job="mark_overdue", token=uuid.uuid4(), holder="h:1", expires=now + timedelta(minutes=1))
    Job.objects.create(name="send_reminders")
    Lease.objects.create(job="send_reminders", token=uuid.uuid4(), holder="h:1", expires=now - timedelta(minutes=1))
    html = admin_client.get(JOBS).content.decode()
    assert re.search(r">mark_overdue<.*?<td class=\"field-run_state\"><span[^>]*>active, pending</span>", html, re.S)
    assert re.search(r">send_reminders<.*?<td class=\"field-run_state\"><span[^>]*>idle</span>", html, re.S)


def test_job_page_shows_the_last_run_its_outcome_and_recent_attempts(admin_client):
    now = timezone.now()
    run = uuid.uuid4()
    Job.objects.create(
        name="mark_overdue",
        last_started=now - timedelta(minutes=3),
        last_trigger="kick",
        last_outcome="handler_failed",
        failures_in_row=2,
        last_run_id=run,
    )
    attempt = Attempt.objects.create(job="mark_overdue", run_id=run, trigger="kick", number=1, outcome="handler_failed")
    html = admin_client.get(reverse("admin:fabrika_django_job_change", args=["mark_overdue"])).content.decode()
    assert "3\xa0minutes ago" in html and "kick" in html
    assert 'fabrika-badge--dead">handler_failed<' in html
    assert reverse("admin:fabrika_django_attempt_change", args=[attempt.pk]) in html
    assert f"{ATTEMPTS}?job=mark_overdue" in html
    assert 'name="_save"' not in html  # nothing on a job's page is edited by hand


def test_run_now_kicks_the_job(admin_client, fabrika_kicks, django_capture_on_commit_callbacks):
    Job.objects.create(name="mark_overdue")
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(reverse("admin:fabrika_django_job_run", args=["mark_overdue"]))
    assert response.status_code == 302
    assert _messages(response) == ["Kicked mark_overdue: a worker runs it shortly."]
    assert fabrika_kicks == ["mark_overdue"]
    assert KickRequest.objects.filter(job="mark_overdue").exists()  # a worker takes it into the pending flag
    assert "pending" in admin_client.get(reverse("admin:fabrika_django_job_changelist")).content.decode()


def test_run_now_button_is_on_a_jobs_page_for_a_user_who_may_change_jobs(admin_client, viewer):
    Job.objects.create(name="mark_overdue")
    page = reverse("admin:fabrika_django_job_change", args=["mark_overdue"])
    run = reverse("admin:fabrika_django_job_run", args=[quote("mark_overdue")])
    assert run in admin_client.get(page).content.decode()
    assert "/run/" not in viewer.get(page).content.decode()


def test_run_now_refuses_get_users_without_change_permission_and_missing_csrf(
    viewer, admin_user, fabrika_kicks, django_capture_on_commit_callbacks
):
    Job.objects.create(name="mark_overdue")
    url = reverse("admin:fabrika_django_job_run", args=["mark_overdue"])
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin_user)
    with django_capture_on_commit_callbacks(execute=True):
        assert viewer.post(url).status_code == 403
        assert strict.post(url).status_code == 403
        assert strict.get(url).status_code == 405
    assert fabrika_kicks == []
    assert Job.objects.get(name="mark_overdue").pending_since is None


def test_run_now_of_a_job_no_longer_registered_kicks_nothing(admin_client, fabrika_kicks):
    Job.objects.create(name="gone")
    response = admin_client.post(reverse("admin:fabrika_django_job_run", args=["gone"]))
    assert _messages(response) == ["No registered job has this name: declare it with @cron, then run it."]
    assert fabrika_kicks == []


def test_run_selected_now_kicks_each_selected_job(
    admin_client, changer, viewer, fabrika_kicks, django_capture_on_commit_callbacks
):
    Job.objects.create(name="mark_overdue")
    jobs = [Job(name="mark_overdue"), Job(name="send_reminders")]  # send_reminders has no row yet: kicked too
    assert "run_selected_now" not in _actions(viewer.get(JOBS))
    with django_capture_on_commit_callbacks(execute=True):
        _act(viewer, "run_selected_now", jobs, url=JOBS)
        assert fabrika_kicks == []
        response = _act(changer, "run_selected_now", jobs, url=JOBS)
    assert _messages(response) == ["Kicked 2 jobs: a worker runs them shortly."]
    assert sorted(fabrika_kicks) == ["mark_overdue", "send_reminders"]


def test_jobs_cannot_be_added_or_deleted_in_the_admin(admin_client):
    Job.objects.create(name="mark_overdue")
    assert admin_client.get(f"{JOBS}add/").status_code == 403
    assert admin_client.post(reverse("admin:fabrika_django_job_delete", args=["mark_overdue"])).status_code == 403
    assert Job.objects.filter(name="mark_overdue").exists()


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        (None, "only when kicked or run by hand"),
        ("* * * * *", "every minute"),
        ("*/5 * * * *", "every 5 minutes"),
        ("15 * * * *", "hourly at minute 15"),
        ("@daily", "daily at 00:00 UTC"),
        ("30 3 * * 1", "every Monday at 03:30 UTC"),
        ("0 6 1 * *", "monthly on day 1 at 06:00 UTC"),
        ("@yearly", "yearly on January 1 at 00:00 UTC"),
        ("0 */6 * * *", "every 6 hours at minute 0"),
        ("0 9-17 * * 1-5", "at cron 0 9-17 * * 1-5 (UTC)"),
    ],
)
def test_schedule_in_words(expression, words):
    assert describe_schedule(Schedule(expression) if expression else None) == words


# -- attempts ----------------------------------------------------------------------------------------------------


def _attempt(job="mark_overdue", outcome="succeeded", trigger="schedule", **fields):
    now = timezone.now()
    return Attempt.objects.create(
        job=job,
        run_id=uuid.uuid4(),
        trigger=trigger,
        number=1,
        outcome=outcome,
        started=now - timedelta(seconds=3),
        finished=now,
        **fields,
    )


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"job": "mark_overdue"}, {"ok", "failed"}),
        ({"outcome": "handler_failed"}, {"failed", "other"}),
        ({"trigger": "kick"}, {"failed"}),
        ({"job": "send_reminders", "outcome": "handler_failed"}, {"other"}),
    ],
)
def test_attempts_filter_by_job_outcome_and_trigger(admin_client, query, expected):
    made = {
        "ok": _attempt(),
        "failed": _attempt(outcome="handler_failed", trigger="kick"),
        "other": _attempt(job="send_reminders", outcome="handler_failed"),
    }
    response = admin_client.get(ATTEMPTS, query)
    assert {attempt.pk for attempt in response.context["cl"].result_list} == {made[name].pk for name in expected}


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.0004, "< 1 ms"), (0.0123, "12 ms"), (0.9996, "1.0 s"), (2.449, "2.4 s"), (95.4, "95 s")],
)
def test_attempts_list_says_how_long_each_took_in_milliseconds_under_a_second(admin_client, seconds, shown):
    attempt = _attempt()
    Attempt.objects.filter(pk=attempt.pk).update(finished=attempt.started + timedelta(seconds=seconds))
    html = admin_client.get(ATTEMPTS).content.decode()
    assert f'<td class="field-took">{escape(shown)}</td>' in html


def test_attempts_list_shows_when_each_started_with_its_zone(admin_client, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    attempt = _attempt()
    Attempt.objects.filter(pk=attempt.pk).update(started=datetime(2026, 1, 5, 9, 30, tzinfo=UTC))
    html = admin_client.get(ATTEMPTS).content.decode()
    assert moment_html("2026-01-05", "10:30 CET") in html


def test_attempt_page_shows_the_failure_code_class_and_frames_read_only(admin_client):
    attempt = _attempt(
        outcome="handler_failed",
        error_class="builtins.RuntimeError",
        frames="testproject/tasks/jobs.py:31\nfabrika_django/runner.py:400",
    )
    page = reverse("admin:fabrika_django_attempt_change", args=[attempt.pk])
    html = admin_client.get(page).content.decode()
    assert 'fabrika-badge--dead">handler_failed<' in html and "builtins.RuntimeError" in html
    assert '<pre class="fabrika-frames">testproject/tasks/jobs.py:31\nfabrika_django/runner.py:400</pre>' in html
    assert 'name="_save"' not in html
    assert admin_client.post(page, {"outcome": "succeeded"}).status_code == 403
    assert admin_client.get(f"{ATTEMPTS}add/").status_code == 403
    attempt.refresh_from_db()
    assert attempt.outcome == "handler_failed"


def test_nobody_deletes_attempts_or_sent_mail_in_the_admin_a_superuser_neither(admin_client):
    from fabrika_django.models import SentMail

    attempt = _attempt()
    SentMail.objects.create(key_hash="a" * 64, content_hash="b" * 64, state="unknown", provider="smtp")
    staff = _staff("historian", "fabrika_django.view_attempt", "fabrika_django.delete_attempt")
    deletes = [
        reverse("admin:fabrika_django_attempt_delete", args=[attempt.pk]),
        reverse("admin:fabrika_django_sentmail_delete", args=["a" * 64]),
    ]
    assert [client.post(url, {"post": "yes"}).status_code for client in (staff, admin_client) for url in deletes] == [
        403
    ] * 4
    assert "delete_selected" not in _actions(admin_client.get(ATTEMPTS))
    assert "delete_selected" not in _actions(admin_client.get(reverse("admin:fabrika_django_sentmail_changelist")))
    assert Attempt.objects.filter(pk=attempt.pk).exists() and SentMail.objects.exists()


# -- the overview ---------------------------------------------------------------------------------------------------


def _queue(response, label):
    (queue,) = [queue for queue in response.context["queues"] if queue["model"] == label]
    return queue


def test_overview_counts_each_queue_by_state_and_each_count_links_to_its_filtered_list(admin_client):
    now = timezone.now()
    rows = _rows(now)
    ReminderFactory(due=now - timedelta(days=1), attempts=5)  # past max_attempts is dead too
    OutboxMailFactory(due=None)
    response = admin_client.get(OVERVIEW)
    assert response.status_code == 200
    reminders = _queue(response, "reminders.Reminder")
    assert {cell["state"]: cell["count"] for cell in reminders["cells"]} == {
        "waiting": 2,
        "due_now": 1,
        "dead": 2,
        "done": 1,
    }
    assert {cell["state"]: cell["count"] for cell in _queue(response, "outbox.OutboxMail")["cells"]} == {
        "waiting": 0,
        "due_now": 0,
        "dead": 0,
        "done": 1,
    }
    assert reminders["oldest_due"] == rows["due_now"].due
    for cell in reminders["cells"]:
        assert cell["url"] == f"{REMINDERS}?state={cell['state']}"
        listed = admin_client.get(cell["url"]).context["cl"].result_count
        assert listed == cell["count"]
    html = response.content.decode()
    assert (
        f'href="{REMINDERS}?state=dead" class="fabrika-badge fabrika-badge--dead" data-state="dead">2 dead</a>' in html
    )


def test_overview_lists_every_concrete_queue_model(admin_client):
    labels = [queue["model"] for queue in admin_client.get(OVERVIEW).context["queues"]]
    assert labels == sorted(model._meta.label for model in queue_models() if issubclass(model, QueueModel))
    assert {"outbox.OutboxMail", "outbox.Registration", "reminders.Reminder", "reports.ReportRequest"} <= set(labels)


def test_overview_counts_each_queue_table_in_one_statement(admin_client):
    _rows()
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get(OVERVIEW).status_code == 200
    for model in queue_models():
        table = connection.ops.quote_name(model._meta.db_table)
        assert len([query for query in queries if f"FROM {table}" in query["sql"]]) == 1, model


def test_overview_shows_the_age_of_the_oldest_due_row(admin_client):
    ReminderFactory(due=timezone.now() - timedelta(hours=5, minutes=2))
    ReminderFactory(due=timezone.now() - timedelta(minutes=1))
    html = admin_client.get(OVERVIEW).content.decode()
    assert re.search(r"due 5\xa0hours(, 2\xa0minutes)? ago", html)


def test_overview_counts_done_rows_up_to_the_cap(admin_client, monkeypatch):
    monkeypatch.setattr(_overview, "DONE_COUNT_CAP", 3)
    for _ in range(5):
        ReminderFactory(due=None)
    response = admin_client.get(OVERVIEW)
    (done,) = [cell for cell in _queue(response, "reminders.Reminder")["cells"] if cell["state"] == "done"]
    assert (done["count"], done["shown"]) == (4, "3+")
    assert "3+ done</a>" in response.content.decode()


def test_overview_shows_each_jobs_health(admin_client):
    now = timezone.now()
    Job.objects.create(
        name="mark_overdue",
        last_success=now - timedelta(hours=2),
        last_outcome="timed_out",
        failures_in_row=3,
        pending_since=now,
    )
    response = admin_client.get(OVERVIEW)
    jobs = {job["name"]: job for job in response.context["jobs"]}
    assert set(jobs) == {job.name for job in registry}
    health = jobs["mark_overdue"]
    assert (health["failures_in_row"], health["last_outcome"], health["pending"], health["active"]) == (
        3,
        "timed_out",
        True,
        False,
    )
    html = response.content.decode()
    assert re.search(r'data-job="mark_overdue">.*?2\xa0hours ago.*?fabrika-badge--dead">3<', html, re.S)


def test_overview_is_linked_from_the_admin_index_and_the_jobs_page(admin_client):
    assert f'<a href="{OVERVIEW}"' in admin_client.get("/admin/").content.decode()
    assert f'<a href="{OVERVIEW}"' in admin_client.get("/admin/fabrika_django/").content.decode()
    assert f'<a href="{OVERVIEW}"' in admin_client.get(JOBS).content.decode()


def test_overview_is_in_the_admin_index_of_a_staff_user_without_permissions_and_nothing_else_of_fabrika():
    staff = _staff("plain")
    html = staff.get("/admin/").content.decode()
    assert f'<a href="{OVERVIEW}"' in html
    assert JOBS not in html and ATTEMPTS not in html
    assert staff.get(OVERVIEW).status_code == 200
    assert staff.get(JOBS).status_code == 403


def test_overview_is_for_staff_only(django_user_model):
    assert Client().get(OVERVIEW)["Location"].startswith("/admin/login/")
    user = django_user_model.objects.create_user("member", password="pw", is_staff=False)
    client = Client()
    client.force_login(user)
    assert client.get(OVERVIEW)["Location"].startswith("/admin/login/")


def test_overview_shows_a_staff_user_links_only_to_lists_they_may_see(viewer):
    _rows()
    response = viewer.get(OVERVIEW)
    assert response.status_code == 200
    assert _queue(response, "reminders.Reminder")["url"] == REMINDERS
    assert _queue(response, "outbox.OutboxMail")["url"] is None


def test_overview_links_no_list_of_a_queue_model_the_admin_site_does_not_register(admin_client):
    from django.contrib import admin as django_admin

    from testproject.reminders.models import Reminder

    model_admin = django_admin.site.get_model_admin(Reminder)
    django_admin.site.unregister(Reminder)
    try:
        response = admin_client.get(OVERVIEW)
    finally:
        django_admin.site.register(Reminder, type(model_admin))
    assert response.status_code == 200
    assert _queue(response, "reminders.Reminder")["url"] is None
    assert _queue(response, "outbox.OutboxMail")["url"] is not None


def test_overview_links_zero_counts_too(admin_client):
    html = admin_client.get(OVERVIEW).content.decode()
    assert f'<a href="{REMINDERS}?state=dead" class="fabrika-zero" data-state="dead">0</a>' in html


@pytest.mark.urls("tests.admin_site_urls")
def test_a_projects_own_admin_site_serves_every_page_in_its_own_namespace(admin_client):
    dead = _rows()["dead"]
    overview = admin_client.get("/backoffice/fabrika_django/overview/")
    assert _queue(overview, "reminders.Reminder")["url"] == "/backoffice/reminders/reminder/"
    assert 'href="/backoffice/">Home</a>' in overview.content.decode()
    assert '<a href="/backoffice/fabrika_django/overview/"' in admin_client.get("/backoffice/").content.decode()
    page = admin_client.get(f"/backoffice/reminders/reminder/{dead.pk}/change/").content.decode()
    assert f'action="/backoffice/reminders/reminder/{dead.pk}/requeue/"' in page
    response = admin_client.post(f"/backoffice/reminders/reminder/{dead.pk}/requeue/", {"version": "3"})
    assert response["Location"] == f"/backoffice/reminders/reminder/{dead.pk}/change/"
    admin_client.get("/backoffice/fabrika_django/job/")
    job = admin_client.get("/backoffice/fabrika_django/job/mark_overdue/change/").content.decode()
    assert 'action="/backoffice/fabrika_django/job/mark_5Foverdue/run/"' in job


def test_count_queue_answers_an_aware_oldest_due_on_every_backend():
    due = timezone.now().replace(microsecond=0) - timedelta(minutes=7)
    ReminderFactory(due=due)
    counts = count_queue(Reminder, timezone.now())
    assert (counts.waiting, counts.due_now, counts.dead, counts.done, counts.oldest_due) == (1, 1, 0, 0, due)


@pytest.mark.parametrize("cap", [None, 10])
@pytest.mark.parametrize("done", [True, False])
def test_the_count_statement_compiled_once_takes_each_moment_as_compiling_it_then_would(cap, done):
    from fabrika_django.ops._counts import _compile_count

    for now in (timezone.now(), timezone.now() - timedelta(days=400, microseconds=7)):
        assert count_sql(Reminder, now, "default", cap, done=done) == _compile_count(
            Reminder, now, "default", cap, done=done
        )
    ReminderFactory(due=timezone.now() - timedelta(minutes=1))
    ReminderFactory(due=timezone.now() + timedelta(minutes=1))
    assert (count_queue(Reminder, timezone.now()).due_now, count_queue(Reminder, timezone.now()).waiting) == (1, 2)


@pytest.mark.postgresql
def test_overview_counting_reads_the_partial_index_not_the_whole_table():
    now = timezone.now()
    Reminder.objects.bulk_create([Reminder(note="n", email="e@example.com", due=None) for _ in range(20000)])
    Reminder.objects.bulk_create(
        [Reminder(note="n", email="e@example.com", due=now, attempts=i % 4) for i in range(50)]
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(Reminder._meta.db_table)}")
        sql, params = count_sql(Reminder, now, "default", _overview.DONE_COUNT_CAP)
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    index = next(index.name for index in Reminder._meta.indexes if index.condition is not None)
    assert index in plan, plan
    # The only scan of the whole table is the done count's, which stops at the cap (a Limit above it).
    for line in plan.splitlines():
        if "Seq Scan" in line:
            assert "Limit" in plan[: plan.index(line)], plan


# -- demo data -------------------------------------------------------------------------------------------------------


def test_demo_data_makes_the_admin_user_and_rows_in_every_state_once():
    call_command("fabrika_demo_data", stdout=open("/dev/null", "w"))  # noqa: SIM115
    counts = {model: model.objects.count() for model in (Task, Reminder, Registration, OutboxMail, ReportRequest)}
    call_command("fabrika_demo_data", stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert {model: model.objects.count() for model in counts} == counts
    assert get_user_model().objects.get(username="admin").check_password("admin")
    now = timezone.now()
    for model in (Reminder, Registration, OutboxMail, ReportRequest):
        assert model.objects.waiting().exists(), model
        assert model.objects.dead().exists(), model
        assert model.objects.done().exists(), model
    for model in (Reminder, Registration, OutboxMail):
        assert model.objects.due_now(now).exists(), model


def test_the_sent_mail_ledger_is_listed_read_only_by_state_with_hashes_only(admin_client):
    from fabrika_django.models import SentMail

    SentMail.objects.create(key_hash="a" * 64, content_hash="b" * 64, state="unknown", provider="smtp")
    url = reverse("admin:fabrika_django_sentmail_changelist")
    html = admin_client.get(url, {"state": "unknown"}).content.decode()
    assert "aaaaaaaaaaaa" in html and "unknown" in html
    page = admin_client.get(reverse("admin:fabrika_django_sentmail_change", args=["a" * 64]))
    assert page.status_code == 200 and 'name="state"' not in page.content.decode()
    assert admin_client.get(reverse("admin:fabrika_django_sentmail_add")).status_code == 403


# -- hardening: ids in URLs and the order of the requeue view's checks ------------------------------------------


def _noop(ctx):
    pass


def test_overview_links_a_job_whose_name_the_admin_must_quote(admin_client):
    with temporary_job(_noop, name="sync_2FA"):
        html = admin_client.get(OVERVIEW).content.decode()
        url = re.search(r'data-job="sync_2FA">\s*<th scope="row"><a href="([^"]+)"', html).group(1)
        page = admin_client.get(url)
        assert (page.status_code, page.context["original"].name) == (200, "sync_2FA")


@pytest.mark.parametrize("object_id", ["abc", "1.5", "99999999999999999999"])
def test_requeue_button_with_an_id_that_is_no_row_is_404_not_500(admin_client, object_id):
    url = reverse("admin:reminders_reminder_requeue", args=[object_id])
    assert admin_client.post(url, {"version": "3"}).status_code == 404


@pytest.mark.parametrize("exists", [True, False], ids=["row", "no-row"])
@pytest.mark.parametrize("object_id", ["row", "abc"])
def test_requeue_button_without_change_permission_is_403_whether_or_not_the_row_exists(viewer, exists, object_id):
    dead = _rows()["dead"]
    pk = dead.pk if exists else dead.pk + 1000
    url = reverse("admin:reminders_reminder_requeue", args=[pk if object_id == "row" else object_id])
    assert viewer.post(url, {"version": "3"}).status_code == 403


def test_run_button_of_a_job_whose_name_the_admin_must_quote_kicks_it_and_returns_to_its_page(
    admin_client, fabrika_kicks, django_capture_on_commit_callbacks
):
    with temporary_job(_noop, name="sync_2FA"):
        page = admin_client.get(OVERVIEW).content.decode()
        url = re.search(r'data-job="sync_2FA">\s*<th scope="row"><a href="([^"]+)"', page).group(1)
        run_url = admin_client.get(url).context["fabrika_run_url"]
        with django_capture_on_commit_callbacks(execute=True):
            response = admin_client.post(run_url)
    assert (response.status_code, response["Location"]) == (302, url)
    assert fabrika_kicks == ["sync_2FA"]


def _breadcrumbs(html):
    """Return the opening tag and the links of a page's breadcrumbs."""
    [bar] = re.findall(r'<(ol|div) class="breadcrumbs">(.*?)</\1>', html, re.S)
    return f"<{bar[0]}>", re.findall(r'<a href="([^"]+)">', bar[1])


def test_the_overviews_breadcrumbs_are_in_the_markup_of_the_admins_own_pages(admin_client):
    # Django 6.1 made them a list (ol.breadcrumbs) and styles only that; before, a div.
    own_tag, own_links = _breadcrumbs(admin_client.get("/admin/fabrika_django/job/").content.decode())
    tag, links = _breadcrumbs(admin_client.get("/admin/fabrika_django/overview/").content.decode())
    assert tag == own_tag
    assert links == own_links == ["/admin/", "/admin/fabrika_django/"]


def test_a_job_name_no_row_can_hold_is_no_job_and_filters_no_attempt(admin_client):
    # PostgreSQL refuses a NUL in text (a DataError): a crafted URL was a 500 on fabrika's own pages.
    _attempt()
    assert admin_client.get("/admin/fabrika_django/job/mark%00overdue/change/").status_code == 302  # "no such job"
    assert admin_client.post("/admin/fabrika_django/job/mark%00overdue/run/").status_code == 404
    listed = admin_client.get(f"{ATTEMPTS}?job=mark%00overdue")
    assert listed.status_code == 200 and listed.context["cl"].result_count == 0
    assert not KickRequest.objects.exists()
