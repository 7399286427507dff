"""Every changelist of the demo at 1280 px with the sidebar open, in the admin's light and dark themes.

With rows that stretch a list (a dead row, the longest failure code a row can hold, times a year old, a long
task path): nothing is wider than its box, and every badge and link reads at a contrast of at least 4.5:1,
computed from the colours Chromium renders. Runs as ``test_admin_browser.py`` does (SQLite only; skips
without Chromium unless ``FABRIKA_REQUIRE_BROWSER=1``); ``FABRIKA_LAB=0 FABRIKA_SCREENSHOTS=docs/screenshots``
keeps the screenshots of both themes.
"""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from fabrika_django.models import Attempt, QueuedTask, TaskStatus
from testproject.outbox.models import OutboxMail, Registration
from testproject.reports.models import ReportRequest

from . import test_admin_browser as chromium

pytestmark = pytest.mark.browser

#: The longest code ``record_failure`` accepts: 64 characters with no space to wrap at.
LONG_FAILURE = "send.provider_refused_the_message_after_the_connection_was_reset"
assert len(LONG_FAILURE) == 64

#: A dead row's "due" in a list, whole: "9 hours ago", then "2026-12-06 15:03 CET".
DUE_SHOWN = r"^\d+\s(year|month|hour)s?\sago\s\d{4}-\d\d-\d\d\s\d\d:\d\d\s[A-Z]+$"

#: The changelists of the demo's admin: every queue table of testproject/*, fabrika's own pages, the overview.
PAGES = {
    "overview": "/admin/fabrika_django/overview/",
    "reminders": "/admin/reminders/reminder/",
    "outbox": "/admin/outbox/outboxmail/",
    "registrations": "/admin/outbox/registration/",
    "reports": "/admin/reports/reportrequest/",
    "tasks": "/admin/fabrika_django/queuedtask/",
    "attempts": "/admin/fabrika_django/attempt/",
    "jobs": "/admin/fabrika_django/job/",
    "people": "/admin/outbox/person/",
}

#: The pages whose screenshots the docs keep, in both themes (the others are checked all the same).
SCREENSHOTS = {"overview", "outbox", "tasks", "attempts"}  # the jobs list: admin-jobs.png

# The contrast of every visible badge and link inside the page's content, its colour blended over the
# backgrounds under it (each one's alpha over the next): WCAG's relative luminance and ratio.
_CONTRASTS = """
const parse = (value) => {
  const parts = value.match(/[\\d.]+/g).map(Number);
  return {r: parts[0], g: parts[1], b: parts[2], a: parts.length > 3 ? parts[3] : 1};
};
const over = (top, under) => ({
  r: top.r * top.a + under.r * (1 - top.a),
  g: top.g * top.a + under.g * (1 - top.a),
  b: top.b * top.a + under.b * (1 - top.a),
  a: 1,
});
const background = (element) => {
  const layers = [];
  for (let node = element; node; node = node.parentElement) {
    layers.push(parse(getComputedStyle(node).backgroundColor));
  }
  return layers.reverse().reduce((under, top) => over(top, under), {r: 255, g: 255, b: 255, a: 1});
};
const luminance = (c) => {
  const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * channel(c.r) + 0.7152 * channel(c.g) + 0.0722 * channel(c.b);
};
const found = [];
for (const element of document.querySelectorAll(arguments[0])) {
  const box = element.getBoundingClientRect();
  if (box.width === 0 || box.height === 0 || !element.textContent.trim()) continue;
  const under = background(element);
  const text = over(parse(getComputedStyle(element).color), under);
  const [light, dark] = [luminance(text), luminance(under)].sort((x, y) => y - x);
  found.push({text: element.textContent.trim().slice(0, 40), css: element.className,
              ratio: (light + 0.05) / (dark + 0.05)});
}
return found;
"""


@pytest.fixture(autouse=True, scope="module")
def _nothing_left_in_the_temporary_directory():
    yield
    assert [folder for folder in chromium._made if folder.exists()] == []


class ChangelistsFitInChromiumTests(chromium.AdminInChromiumTests):
    """The parent's browser, login and demo rows, with rows that stretch each list."""

    # The parent's tests run once, in their own class.
    test_dead_row_is_found_from_the_overview_and_requeued_with_its_button = None
    test_job_page_shows_the_schedule_and_runs_the_job_now = None

    def setUp(self):
        super().setUp()
        now = timezone.now()
        old = now - timedelta(days=400)
        mail = OutboxMail.objects.first()
        OutboxMail.objects.create(
            person=mail.person,
            kind="reminder",
            subject="A subject as long as people write them, about the invoice of last month and what is due",
            text="Hi",
            due=old,
            attempts=5,
            last_failure=LONG_FAILURE,
        )
        Registration.objects.create(name="Linus", email="linus@example.com", due=old, attempts=5, last_failure="send")
        Registration.objects.filter(pk__isnull=False).update(received_at=old)
        ReportRequest.objects.create(rows=100, due=old, attempts=10, last_failure=LONG_FAILURE)
        ReportRequest.objects.create(rows=5, due=None, finished_at=old)
        ReportRequest.objects.filter(pk__isnull=False).update(requested_at=old)
        QueuedTask.objects.create(
            task_path="testproject.outbox.tasks.resend_welcome_mail_to_a_person_who_asked_for_it_again",
            backend="default",
            queue_name="emails",
            status=TaskStatus.FAILED,
            attempts=100,
            due=old,
            enqueued_at=old,
            started_at=old,
            finished_at=old,
            last_failure="task_failed",
        )
        QueuedTask.objects.create(
            task_path="testproject.lab.tasks.add", backend="default", queue_name="default", enqueued_at=now
        )
        Attempt.objects.create(
            job="tasks.default.emails",
            run_id=uuid.uuid4(),
            trigger="kick",
            number=3,
            outcome="handler_failed",
            started=old,
            finished=old + timedelta(milliseconds=12),
            error_class="smtplib.SMTPServerDisconnected",
        )

    def _with_sidebar(self, theme):
        self.browser.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")
        self.browser.execute_script("localStorage.setItem('theme', arguments[0])", theme)

    def _overflows(self):
        """Return each box that is wider than itself (scrolls sideways), with by how many pixels."""
        return self.browser.execute_script(
            """
            const boxes = [document.documentElement, ...document.querySelectorAll(
              '#changelist .results, #content-main > .module:not(#changelist), #content-main > .module table')];
            return boxes.filter((box) => box.scrollWidth > box.clientWidth).map((box) =>
              `${box.tagName.toLowerCase()}#${box.id}.${box.className}: ${box.scrollWidth - box.clientWidth} px`);
            """
        )

    def _low_contrasts(self):
        found = self.browser.execute_script(_CONTRASTS, "#content a, #content .fabrika-badge, .breadcrumbs a")
        assert found, "no badge or link found: the selector is wrong"
        return [item for item in found if item["ratio"] < 4.5]

    def test_every_changelist_fits_1280_px_and_its_badges_and_links_read_in_light_and_dark(self):
        self._log_in()
        problems = []
        for theme in ("light", "dark"):
            self._with_sidebar(theme)
            for name, path in PAGES.items():
                self._open(path)
                self.assertEqual(self.browser.execute_script("return window.innerWidth"), 1280)
                self.assertTrue(self._css("#nav-sidebar").is_displayed(), name)
                self.assertEqual(self.browser.execute_script("return document.documentElement.dataset.theme"), theme)
                if name in SCREENSHOTS:
                    self.browser.save_screenshot(str(self.shots / f"admin-{name}-{theme}.png"))
                problems.extend(f"{theme} {name}: {box} wider than itself" for box in self._overflows())
                problems.extend(
                    f"{theme} {name}: {item['text']!r} ({item['css']}) at {item['ratio']:.2f}:1"
                    for item in self._low_contrasts()
                )
        self.assertEqual(problems, [], "\n".join(problems))

    def test_a_dead_rows_due_and_last_failure_are_whole_on_screen(self):
        from selenium.webdriver.common.by import By

        self._log_in()
        self._with_sidebar("light")
        for path in (PAGES["outbox"], PAGES["reports"]):
            self._open(f"{path}?state=dead")
            box = self._css("#changelist .results")
            edge = box.location["x"] + box.size["width"]
            for cell in self.browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-last_failure"):
                self.assertLessEqual(cell.location["x"] + cell.size["width"], edge, path)
            for cell in self.browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-queue_due"):
                # How long ago, and the time with its zone (its date and time on lines of their own where narrow).
                self.assertRegex(cell.text, DUE_SHOWN, path)
                self.assertLess(cell.find_element(By.CSS_SELECTOR, "time").size["height"], 75, path)  # 4 lines

    def test_badges_and_links_read_in_the_systems_dark_theme_when_the_admin_follows_it(self):
        self._log_in()
        self._with_sidebar("auto")  # the admin's default: the system's preference
        self.browser.execute_cdp_cmd(
            "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
        )
        try:
            problems = []
            for name in ("overview", "reminders", "jobs"):
                self._open(PAGES[name])
                background = self.browser.execute_script("return getComputedStyle(document.body).backgroundColor")
                self.assertEqual(background, "rgb(18, 18, 18)", name)  # the admin's dark theme is on
                problems.extend(
                    f"auto-dark {name}: {item['text']!r} ({item['css']}) at {item['ratio']:.2f}:1"
                    for item in self._low_contrasts()
                )
            self.assertEqual(problems, [], "\n".join(problems))
        finally:
            self.browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
