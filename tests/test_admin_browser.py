"""The admin in headless Chromium: from the overview to a dead row, requeued with its button.

Runs on SQLite only: the PostgreSQL run covers the same views with the test client (tests/test_admin.py)
and a second browser pass would only cost CI time. Without Chromium the tests skip, saying why, unless
``FABRIKA_REQUIRE_BROWSER=1`` (CI) makes that a failure. The screenshots go to a temporary directory;
to refresh those the README shows (without the test suite's lab app):
``FABRIKA_LAB=0 FABRIKA_SCREENSHOTS=docs/screenshots python -m pytest tests/test_admin_browser.py``.
"""

import os
import shutil
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.staticfiles.testing import StaticLiveServerTestCase
from django.utils import timezone

from fabrika_django.models import Attempt, Job, KickRequest, QueueSample
from fabrika_django.ops._history import HOURS, fold_hours, hour_slots
from testproject.outbox.models import OutboxMail, Person, Registration
from testproject.reminders.models import Reminder

pytestmark = pytest.mark.browser

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1000",
)


def _browser_missing():
    """Return why no headless Chromium can run here, or None."""
    if "sqlite" not in settings.DATABASES["default"]["ENGINE"]:
        return None  # decided by _skip_reason
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        return "Chromium or chromedriver is not installed (apt-get install chromium chromium-driver)"
    return None


def _skip_reason():
    if "sqlite" not in settings.DATABASES["default"]["ENGINE"]:
        return "browser tests run on SQLite only, to save CI time; test_admin.py covers these views on this database"
    missing = _browser_missing()
    if missing and os.environ.get("FABRIKA_REQUIRE_BROWSER") == "1":
        pytest.fail(f"FABRIKA_REQUIRE_BROWSER=1 but {missing}.", pytrace=False)
    return missing


# The temporary folders the tests made (Chromium's profile, the screenshots): none may outlive the module.
_made = []


def _temporary_folder(prefix):
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    _made.append(folder)
    return folder


def _remove(folder):
    # Chromium may still write into its profile for a moment after quit(): try again until the folder is gone.
    deadline = time.monotonic() + 10
    while folder.exists() and time.monotonic() < deadline:
        shutil.rmtree(folder, ignore_errors=True)
        if folder.exists():
            time.sleep(0.1)


@pytest.fixture(autouse=True, scope="module")
def _nothing_left_in_the_temporary_directory():
    yield
    assert [folder for folder in _made if folder.exists()] == []


class AdminInChromiumTests(StaticLiveServerTestCase):
    @classmethod
    def setUpClass(cls):
        reason = _skip_reason()
        if reason:
            pytest.skip(reason)
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        super().setUpClass()
        cls.profile = _temporary_folder("fabrika-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
        for flag in (*_FLAGS, f"--user-data-dir={cls.profile}"):
            options.add_argument(flag)
        try:
            cls.browser = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
        except Exception:
            super().tearDownClass()
            _remove(cls.profile)
            raise
        cls.browser.implicitly_wait(5)
        # Without FABRIKA_SCREENSHOTS the screenshots are only taken (a page that cannot render fails), then removed.
        cls.own_shots = not os.environ.get("FABRIKA_SCREENSHOTS")
        cls.shots = Path(os.environ.get("FABRIKA_SCREENSHOTS") or _temporary_folder("fabrika-shots-"))
        cls.shots.mkdir(parents=True, exist_ok=True)

    @classmethod
    def tearDownClass(cls):
        cls.browser.quit()
        _remove(cls.profile)
        if cls.own_shots:
            _remove(cls.shots)
        super().tearDownClass()

    def setUp(self):
        get_user_model().objects.create_superuser("admin", "admin@localhost", "admin")
        now = timezone.now()
        self.dead = [
            Reminder.objects.create(
                note=note,
                email="demo@example.com",
                due=now - timedelta(hours=hours),
                attempts=3,
                version=3,
                last_failure="send",
            )
            for note, hours in (("Pay the rent", 26), ("Call the plumber", 5))
        ]
        Reminder.objects.create(note="Water the plants", email="demo@example.com", due=now + timedelta(minutes=20))
        Reminder.objects.create(note="Book the dentist", email="demo@example.com", due=now - timedelta(minutes=4))
        Reminder.objects.create(note="Buy a present", email="demo@example.com", due=None, sent_at=now)
        person = Person.objects.create(name="Ada", email="ada@example.com")
        for subject, due, attempts in (
            ("Welcome", now - timedelta(minutes=1), 1),
            ("Your week", None, 1),
            ("Last week", now - timedelta(hours=9), 5),
        ):
            OutboxMail.objects.create(
                person=person,
                kind="digest",
                subject=subject,
                text="Hi",
                due=due,
                attempts=attempts,
                last_failure="send" if attempts == 5 else "",
            )
        Registration.objects.create(name="Grace", email="grace@example.com", due=now + timedelta(hours=1))
        run = uuid.uuid4()
        Job.objects.create(
            name="mark_overdue",
            last_run_id=run,
            last_trigger="schedule",
            last_outcome="succeeded",
            last_started=now - timedelta(minutes=12),
            last_finished=now - timedelta(minutes=12),
            last_success=now - timedelta(minutes=12),
        )
        for number, outcome in ((1, "handler_failed"), (2, "succeeded")):
            Attempt.objects.create(
                job="mark_overdue",
                run_id=run,
                trigger="schedule",
                number=number,
                outcome=outcome,
                started=now - timedelta(minutes=13 - number),
                finished=now - timedelta(minutes=12),
                error_class="builtins.TimeoutError" if number == 1 else "",
                frames="testproject/tasks/jobs.py:37" if number == 1 else "",
            )
        Job.objects.create(
            name="send_reminders",
            last_outcome="handler_failed",
            failures_in_row=3,
            last_started=now - timedelta(minutes=1),
            last_trigger="schedule",
            last_success=now - timedelta(hours=5),
        )

    def _open(self, path):
        self.browser.get(f"{self.live_server_url}{path}")

    def _css(self, selector):
        from selenium.webdriver.common.by import By

        return self.browser.find_element(By.CSS_SELECTOR, selector)

    def _follow(self, element):
        """Click ``element`` and wait until the next page has loaded in full.

        Waiting for the old page's ``<html>`` to go stale is not enough: while Chromium swaps the documents, asking
        about the old node can fail with "Node with given id does not belong to the document" (a plain
        WebDriverException, which ``staleness_of`` does not expect), and the new page may still be parsing. So
        the old page's window gets a mark, and the wait is for a window without it whose document is complete;
        errors of a script run mid-navigation only mean "not yet".
        """
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.support.wait import WebDriverWait

        mark = uuid.uuid4().hex
        self.browser.execute_script("window.fabrikaPage = arguments[0]", mark)
        element.click()
        WebDriverWait(self.browser, 10, ignored_exceptions=(WebDriverException,)).until(
            lambda browser: browser.execute_script(
                "return window.fabrikaPage !== arguments[0] && document.readyState === 'complete'", mark
            )
        )

    def _log_in(self):
        self._open("/admin/login/?next=/admin/")
        self._css("#id_username").send_keys("admin")
        self._css("#id_password").send_keys("admin")
        self._follow(self._css("input[type=submit]"))
        self.assertEqual(self._css("#site-name").text, "Django administration")
        # The screenshots show the page, not the navigation sidebar beside it.
        self.browser.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")

    def test_dead_row_is_found_from_the_overview_and_requeued_with_its_button(self):
        from selenium.webdriver.common.by import By

        self._log_in()
        self._open("/admin/")
        self._follow(self._css('#content-main .app-fabrika_django a[href="/admin/fabrika_django/overview/"]'))
        self.assertEqual(self._css("#content h1").text, "Background work overview")
        dead = self._css('tr[data-model="reminders.Reminder"] a[data-state="dead"]')
        self.assertEqual(dead.text, "2 dead")
        self.browser.save_screenshot(str(self.shots / "admin-overview.png"))

        self._follow(dead)
        self.assertTrue(self.browser.current_url.endswith("/admin/reminders/reminder/?state=dead"))
        listed = self.browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
        self.assertEqual(len(listed), 2)
        self.assertEqual({row.find_element(By.CSS_SELECTOR, ".fabrika-badge").text for row in listed}, {"dead"})
        self.browser.save_screenshot(str(self.shots / "admin-dead-rows.png"))

        self._follow(self.browser.find_element(By.LINK_TEXT, f"Reminder {self.dead[0].pk}"))
        self._follow(self._css("button.fabrika-tool"))
        self.assertEqual(self._css("ul.messagelist li.success").text, "Requeued 1 reminder.")
        self.assertEqual(self._css(".field-queue_state .readonly").text, "due now")
        row = Reminder.objects.get(pk=self.dead[0].pk)
        self.assertEqual((row.attempts, row.state), (0, "waiting"))

        self._open("/admin/reminders/reminder/?state=waiting")
        waiting = self.browser.find_elements(By.LINK_TEXT, f"Reminder {self.dead[0].pk}")
        self.assertEqual(len(waiting), 1)
        self._open("/admin/reminders/reminder/?state=dead")
        self.assertEqual(len(self.browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")), 1)

    def test_job_page_shows_the_schedule_and_runs_the_job_now(self):
        from selenium.webdriver.common.by import By

        self._log_in()
        self._open("/admin/fabrika_django/job/")
        self._follow(self.browser.find_element(By.LINK_TEXT, "mark_overdue"))
        self.assertEqual(self._css(".field-in_words .readonly").text, "hourly at minute 15")
        self._follow(self._css("button.fabrika-tool"))
        self.assertEqual(self._css("ul.messagelist li.success").text, "Kicked mark_overdue: a worker runs it shortly.")
        self.assertEqual(self._css(".field-run_state .readonly").text, "pending")
        self.assertTrue(KickRequest.objects.filter(job="mark_overdue").exists())  # a worker takes it into the flag
        self.browser.save_screenshot(str(self.shots / "admin-job.png"))


class OverviewChartsInChromiumTests(AdminInChromiumTests):
    """The overview's health and charts, and the jobs list, at 1280 px in the admin's light and dark themes."""

    # The parent's tests run once, in their own class.
    test_dead_row_is_found_from_the_overview_and_requeued_with_its_button = None
    test_job_page_shows_the_schedule_and_runs_the_job_now = None

    def setUp(self):
        super().setUp()
        now = timezone.now()
        history = []
        slots = hour_slots(now)
        for hours_ago in range(24):
            slot, count = slots[23 - hours_ago], 3 + hours_ago % 5
            for index in range(count):
                # Inside the hour drawn as this bar, the current one included however early in it we are.
                started = slot + min(timedelta(minutes=index * 7 + 1), (now - slot) * (index + 1) / (count + 1))
                outcome = "handler_failed" if (hours_ago + index) % 9 == 0 else "succeeded"
                if hours_ago in (5, 6) and index == 0:
                    outcome = "timed_out"
                history.append(
                    Attempt(
                        job="send_reminders",
                        run_id=uuid.uuid4(),
                        trigger="schedule",
                        number=1,
                        outcome=outcome,
                        started=started,
                        finished=started + timedelta(seconds=0.4 + (index % 4) * 0.9 + hours_ago % 3),
                    )
                )
        Attempt.objects.bulk_create(history)
        QueueSample.objects.bulk_create(
            QueueSample(
                queue="reminders.Reminder",
                sampled=now - timedelta(minutes=5 * step),
                waiting=4 + step % 30,
                due_now=max(0, 12 - abs(step - 150) // 8),
                dead=2 if step < 60 else 1,
            )
            for step in range(288)
        )
        Job.objects.filter(name="mark_overdue").update(last_success=now - timedelta(seconds=20))
        # As the sampling job keeps them: the hours that are over drawn from their folded rows, the rest live.
        assert fold_hours(now) >= HOURS - 2

    def _theme(self, theme):
        self.browser.execute_script("localStorage.setItem('theme', arguments[0])", theme)

    def _style(self, selector, prop):
        return self.browser.execute_script(
            "return getComputedStyle(document.querySelector(arguments[0]))[arguments[1]]", selector, prop
        )

    def test_overview_draws_accessible_charts_legible_at_1280_px_in_light_and_dark(self):
        from selenium.webdriver.common.by import By

        self._log_in()
        fills = {}
        for theme in ("light", "dark"):
            self._theme(theme)
            self._open("/admin/fabrika_django/overview/")
            self.assertEqual(self.browser.execute_script("return window.innerWidth"), 1280)
            self.assertLessEqual(self.browser.execute_script("return document.documentElement.scrollWidth"), 1280)
            card = self._css('figure[data-job="send_reminders"]')
            charts = card.find_elements(By.CSS_SELECTOR, "svg.fabrika-chart")
            self.assertEqual(len(charts), 2)
            for chart in charts:
                labelled = chart.get_attribute("aria-labelledby").split()
                self.assertEqual(chart.get_attribute("role"), "img")
                self.assertEqual([part.rsplit("-", 1)[1] for part in labelled], ["title", "desc"])
                self.assertGreaterEqual(chart.size["width"], 340)  # of 480 drawing units: 13-unit text stays >= 9 px
            bars = card.find_elements(By.CSS_SELECTOR, "rect.fabrika-series--ok")
            self.assertEqual(len(bars), 24)
            summaries = [p.text for p in card.find_elements(By.CSS_SELECTOR, "p.fabrika-chart-summary")]
            self.assertRegex(
                summaries[0], r"^\d+ attempts in the last 24 hours \(\d+ succeeded, \d+ handler failed, 2 timed out\)"
            )
            self.assertRegex(summaries[1], r"^Median attempt per hour between [\d.]+ s and [\d.]+ s")
            backlog = self._css('figure[data-model="reminders.Reminder"]')
            self.assertEqual(len(backlog.find_elements(By.CSS_SELECTOR, "polyline")), 2)
            self.assertIn("Due now peaked at 12", backlog.find_element(By.CSS_SELECTOR, ".fabrika-chart-summary").text)
            fills[theme] = (
                self._style('figure[data-job="send_reminders"] rect.fabrika-series--ok', "fill"),
                self._style(".fabrika-chart-axis", "fill"),
                self._style("body", "background-color"),
            )
            self.browser.execute_script(
                "document.querySelector('#fabrika-job-charts').previousElementSibling.scrollIntoView()"
            )
            self.browser.save_screenshot(str(self.shots / f"admin-overview-charts-{theme}.png"))
        self.assertNotEqual(fills["light"][0], fills["dark"][0])  # the series follow the theme
        self.assertNotEqual(fills["light"][1], fills["dark"][1])  # so do the axis labels (--body-quiet-color)
        self.assertNotEqual(fills["light"][2], fills["dark"][2])
        # send_reminders failed three times in a row, its last success five hours (300 periods) ago.
        finding = self._css("#fabrika-health li[data-check='job_overdue']").text
        self.assertTrue(finding.startswith("error job_overdue Job send_reminders last succeeded 5 h"), finding)

    def test_jobs_list_fits_1280_px_with_the_sidebar_open_and_says_just_now(self):
        from selenium.webdriver.common.by import By

        self._log_in()
        self.browser.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")
        self._theme("light")
        self._open("/admin/fabrika_django/job/")
        self.assertTrue(self._css("#nav-sidebar").is_displayed())
        self.browser.save_screenshot(str(self.shots / "admin-jobs.png"))
        headers = self.browser.find_elements(By.CSS_SELECTOR, "#result_list thead th")
        self.assertEqual(len(headers), 9)  # the action checkbox and eight columns
        box = self._css("#changelist .results")
        edge = box.location["x"] + box.size["width"]
        for header in headers:
            self.assertLessEqual(header.location["x"] + header.size["width"], edge, header.text)
        # Nothing scrolls sideways inside the list either.
        self.assertLessEqual(
            self.browser.execute_script("const r = arguments[0]; return r.scrollWidth - r.clientWidth", box), 0
        )
        for row in self.browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"):
            self.assertLess(row.size["height"], 90, row.text)  # four short lines at most (0.1 wrapped to five)
        row = self.browser.find_element(By.XPATH, "//tr[.//a[text()='mark_overdue']]")
        self.assertIn("just now", row.find_element(By.CSS_SELECTOR, "td.field-last_success_at").text)
