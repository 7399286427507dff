"""The test project's demo jobs and pages, run through the test kit."""

from datetime import UTC, date, datetime, timedelta

import pytest
from django.db.models import F
from django.urls import reverse

from fabrika_django.testing import run_job
from testproject.reminders.models import Reminder
from testproject.reports.models import ReportRequest
from testproject.tasks import jobs as task_jobs
from testproject.tasks.models import Task

NOON = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)

pytestmark = pytest.mark.django_db


def _tasks():
    return {t.title: (t.overdue, t.version) for t in Task.objects.all()}


def test_mark_overdue_marks_open_tasks_whose_due_day_is_over_everywhere_and_bumps_their_version():
    Task.objects.create(title="last week", due_day=date(2026, 3, 3))
    Task.objects.create(title="yesterday", due_day=date(2026, 3, 9))  # still the 9th in UTC-12 until 12:00
    Task.objects.create(title="today", due_day=date(2026, 3, 10))
    Task.objects.create(title="done late", due_day=date(2026, 3, 1), done=True)
    Task.objects.create(title="marked", due_day=date(2026, 3, 1), overdue=True, version=4)
    assert run_job("mark_overdue", now=NOON).outcome == "succeeded"
    assert _tasks() == {
        "last week": (True, 1),
        "yesterday": (True, 1),
        "today": (False, 0),
        "done late": (False, 0),
        "marked": (True, 4),
    }
    assert run_job("mark_overdue", now=NOON).ok
    assert _tasks()["last week"] == (True, 1)  # a second run writes nothing


def test_a_due_day_is_not_over_while_it_lasts_in_the_westernmost_zone():
    Task.objects.create(title="yesterday", due_day=date(2026, 3, 9))
    assert run_job("mark_overdue", now=NOON - timedelta(minutes=1)).ok
    assert _tasks() == {"yesterday": (False, 0)}


def test_mark_overdue_goes_through_every_batch(monkeypatch):
    monkeypatch.setattr(task_jobs, "BATCH", 2)
    Task.objects.bulk_create(Task(title=f"t{n}", due_day=date(2026, 1, n + 1)) for n in range(5))
    assert run_job("mark_overdue", now=NOON).ok
    assert set(_tasks().values()) == {(True, 1)}


def test_mark_overdue_decides_again_on_the_row_read_under_its_lock(monkeypatch):
    closed = Task.objects.create(title="closed meanwhile", due_day=date(2026, 3, 1))
    Task.objects.create(title="open", due_day=date(2026, 3, 2))
    listed = task_jobs.Task.objects.select_for_update

    def closing_first():
        # Between the list and the first re-read, a person closes the first task.
        Task.objects.filter(pk=closed.pk, done=False).update(done=True, version=F("version") + 1)
        return listed()

    monkeypatch.setattr(task_jobs.Task.objects, "select_for_update", closing_first)
    assert run_job("mark_overdue", now=NOON).ok
    assert _tasks() == {"closed meanwhile": (False, 1), "open": (True, 1)}


def test_send_reminders_finishes_the_due_reminders_and_leaves_the_later_ones():
    due = Reminder.objects.create(note="due", email="a@example.com", due=NOON - timedelta(minutes=1))
    later = Reminder.objects.create(note="later", email="a@example.com", due=NOON + timedelta(hours=1))
    assert run_job("send_reminders", now=NOON).ok
    due.refresh_from_db()
    later.refresh_from_db()
    assert (due.state, due.sent_at, due.attempts) == ("done", NOON, 1)
    assert (later.state, later.sent_at, later.attempts) == ("waiting", None, 0)


def test_render_reports_writes_a_csv_of_the_requested_rows_and_finishes_the_request(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    request = ReportRequest.objects.create(rows=3, due=NOON)
    assert run_job("render_reports", now=NOON).ok
    request.refresh_from_db()
    assert (request.state, request.finished_at) == ("done", NOON)
    with request.result.open("rb") as file:
        assert file.read() == b"n,square\r\n1,1\r\n2,4\r\n3,9\r\n"


def test_a_report_that_fails_to_render_records_its_step_and_the_run_goes_on(settings, tmp_path, monkeypatch):
    from testproject.reports import jobs as report_jobs

    settings.MEDIA_ROOT = str(tmp_path)
    broken = ReportRequest.objects.create(rows=1, due=NOON - timedelta(minutes=1))
    fine = ReportRequest.objects.create(rows=2, due=NOON)
    real = report_jobs.render_csv

    def failing(rows):
        if rows == 1:
            raise OSError("disk full")
        return real(rows)

    monkeypatch.setattr(report_jobs, "render_csv", failing)
    assert run_job("render_reports", now=NOON).ok
    broken.refresh_from_db()
    fine.refresh_from_db()
    assert (broken.state, broken.attempts, broken.last_failure) == ("waiting", 1, "render")
    assert fine.state == "done"


def test_the_reports_page_creates_a_request_kicks_the_job_and_the_request_page_polls_until_done(
    client, settings, tmp_path, fabrika_kicks, django_capture_on_commit_callbacks
):
    settings.MEDIA_ROOT = str(tmp_path)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("reports:index"), {"rows": "2"})
    request = ReportRequest.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("reports:detail", args=[request.pk])
    assert fabrika_kicks == ["render_reports"]
    page = client.get(response["Location"]).content.decode()
    assert '<meta http-equiv="refresh" content="1">' in page and "download" not in page
    assert client.get(reverse("reports:download", args=[request.pk])).status_code == 404
    assert run_job("render_reports").ok
    page = client.get(response["Location"]).content.decode()
    assert "refresh" not in page and reverse("reports:download", args=[request.pk]) in page
    download = client.get(reverse("reports:download", args=[request.pk]))
    assert b"".join(download.streaming_content) == b"n,square\r\n1,1\r\n2,4\r\n"


def test_the_reminders_page_creates_one_and_moves_it_with_requeue(
    client, fabrika_kicks, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("reminders:index"), {"note": "call", "email": "a@example.com", "due": "2099-01-01T10:00"})
    reminder = Reminder.objects.get()
    assert (reminder.state, reminder.version) == ("waiting", 0)
    assert fabrika_kicks == []  # not due yet: the schedule will find it
    reminder.attempts = 3
    Reminder.objects.filter(pk=reminder.pk).update(attempts=3)  # dead after three failed claims
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("reminders:move", args=[reminder.pk]), {"due": "2020-01-01T10:00"})
    assert response.status_code == 302
    reminder.refresh_from_db()
    assert (reminder.state, reminder.attempts, reminder.version) == ("waiting", 0, 1)
    assert fabrika_kicks == ["send_reminders"]  # due now: kicked
    assert "Reminder" in client.get(reverse("reminders:index")).content.decode()


DEMO_PAGES = ["outbox:register", "outbox:thanks", "outbox:resend", "outbox:resent", "reminders:index", "reports:index"]


@pytest.mark.parametrize("page", DEMO_PAGES)
def test_each_demo_page_links_the_shared_stylesheet_served_from_the_app(client, page):
    html = client.get(reverse(page)).content.decode()
    assert '<link rel="stylesheet" href="/static/demo/demo.css">' in html
    assert "http://" not in html.split("<body", 1)[0] and "https://" not in html.split("<body", 1)[0]


@pytest.mark.parametrize("page", DEMO_PAGES)
def test_each_demo_page_links_every_other_from_its_bar(client, page):
    bar = client.get(reverse(page)).content.decode().split('<header class="demo-bar">', 1)[1].split("</header>")[0]
    for target in ("outbox:register", "reminders:index", "reports:index", "outbox:resend", "admin:index"):
        assert f'href="{reverse(target)}"' in bar, target


def test_the_shared_stylesheet_is_a_static_file():
    from django.contrib.staticfiles import finders

    assert finders.find("demo/demo.css")


def test_the_demo_pages_show_times_with_their_zone(client, settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    due = datetime(2026, 7, 1, 10, 0, tzinfo=UTC)  # summer: 12:00 in Berlin
    Reminder.objects.create(note="call", email="a@example.com", due=due, sent_at=due)
    reminders = client.get(reverse("reminders:index")).content.decode()
    assert reminders.count("2026-07-01 12:00 CEST") == 2  # due and sent
    report = ReportRequest.objects.create(rows=1, due=None, finished_at=datetime(2026, 1, 5, 9, 30, tzinfo=UTC))
    assert "2026-01-05 10:30 CET" in client.get(reverse("reports:detail", args=[report.pk])).content.decode()
