"""The admin of fabrika's own tables: the jobs page (with "Run now") and the read-only attempts page."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..jobs import registry
from ..models import Attempt, Job, Lease, Outcome
from ..schedule import Schedule
from ._queues import _moment

_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_RECENT_ATTEMPTS = 10


def describe_schedule(schedule: Schedule | None) -> str:
    """Return the schedule in words ("every 5 minutes", "daily at 03:15 UTC"); the cron fields where no words fit."""
    if schedule is None:
        return str(_("only when kicked or run by hand"))
    minute, hour, day, month, weekday = schedule.fields.split()
    if (day, month) != ("*", "*") and not (day.isdigit() and month == "*" and weekday == "*"):
        if day.isdigit() and month.isdigit() and weekday == "*" and minute.isdigit() and hour.isdigit():
            return f"yearly on {_MONTHS[int(month) - 1]} {int(day)} at {int(hour):02d}:{int(minute):02d} UTC"
        return f"at cron {schedule.fields} (UTC)"
    if hour == "*" and weekday == "*" and day == "*":
        if minute == "*":
            return "every minute"
        if minute.startswith("*/") and minute[2:].isdigit():
            return f"every {int(minute[2:])} minutes"
        if minute.isdigit():
            return f"hourly at minute {int(minute)}"
    if minute.isdigit() and hour.isdigit():
        at = f"{int(hour):02d}:{int(minute):02d} UTC"
        if day == "*" and weekday == "*":
            return f"daily at {at}"
        if day == "*" and weekday.isdigit() and int(weekday) <= 7:
            return f"every {_DAYS[int(weekday) % 7]} at {at}"
        if day.isdigit() and weekday == "*":
            return f"monthly on day {int(day)} at {at}"
    if minute.isdigit() and hour.startswith("*/") and hour[2:].isdigit() and (day, weekday) == ("*", "*"):
        return f"every {int(hour[2:])} hours at minute {int(minute)}"
    return f"at cron {schedule.fields} (UTC)"


def _sync_registered_jobs() -> None:
    """Make the Job (and Lease) rows of jobs that never ran, so the jobs page lists every registered job."""
    from ..runner import sync_jobs

    sync_jobs()


def _outcome_badge(outcome: str) -> str:
    if not outcome:
        return "—"
    kind = "done" if outcome == Outcome.SUCCEEDED else "waiting" if outcome == Outcome.RUNNING else "dead"
    return format_html('<span class="fabrika-badge fabrika-badge--{}">{}</span>', kind, outcome)


def _when(value: datetime | None) -> str:
    """Return a fire time in the user's time zone and in UTC, both absolute."""
    if value is None:
        return "—"
    local = date_format(timezone.localtime(value), "DATETIME_FORMAT")
    utc = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    zone = timezone.localtime(value).tzname()
    return format_html(
        '<span class="fabrika-nowrap">{} {}</span> <span class="fabrika-quiet">({})</span>', local, zone, utc
    )


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Jobs: registered jobs joined with their rows; "Run now" kicks a job."""

    list_display = (
        "name",
        "schedule",
        "in_words",
        "next_fire_at",
        "run_state",
        "last_run",
        "outcome",
        "last_success",
        "failures_in_row",
    )
    list_filter = ("last_outcome",)
    search_fields = ("name",)
    actions = ["run_selected_now"]
    change_form_template = "admin/fabrika_django/job_change_form.html"
    fields = (
        "name",
        "schedule",
        "in_words",
        "next_fire_at",
        "run_state",
        "retries",
        "timeout",
        "kicks",
        "last_run",
        "outcome",
        "last_success",
        "failures_in_row",
        "recent_attempts",
    )
    readonly_fields = fields

    class Media:
        css = {"all": ["fabrika_django/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> Any:
        leased = Lease.objects.filter(job=OuterRef("name"), token__isnull=False, expires__gt=timezone.now())
        return super().get_queryset(request).annotate(active=Exists(leased))

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        _sync_registered_jobs()
        context = {
            "fabrika_overview_url": reverse(f"{self.admin_site.name}:fabrika_django_overview"),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are declared with @cron, not made here

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a registered job's row comes back on the next run

    @admin.display(description=_("schedule"))
    def schedule(self, job: Job) -> str:
        registered = _registered(job)
        if registered is None:
            return str(_("not registered"))
        return format_html("<code>{}</code>", registered.schedule.expression if registered.schedule else "—")

    @admin.display(description=_("in words"))
    def in_words(self, job: Job) -> str:
        registered = _registered(job)
        return describe_schedule(registered.schedule) if registered is not None else "—"

    @admin.display(description=_("next fire"), ordering="next_fire")
    def next_fire_at(self, job: Job) -> str:
        registered = _registered(job)
        fire = job.next_fire
        if fire is None and registered is not None and registered.schedule is not None:
            fire = registered.schedule.next_after(timezone.now())  # no worker has planned it yet
        return _when(fire)

    @admin.display(description=_("state"))
    def run_state(self, job: Job) -> str:
        active = bool(getattr(job, "active", False))
        pending = job.pending_since is not None
        words = [str(_("active"))] if active else []
        if pending:
            words.append(str(_("pending")))
        if not words:
            return format_html('<span class="fabrika-quiet">{}</span>', _("idle"))
        return format_html('<span class="fabrika-badge fabrika-badge--due-now">{}</span>', ", ".join(words))

    @admin.display(description=_("last run"), ordering="last_started")
    def last_run(self, job: Job) -> str:
        if job.last_started is None:
            return str(_("never"))
        return format_html("{} · {}", _moment(job.last_started, timezone.now()), job.last_trigger or "—")

    @admin.display(description=_("last outcome"), ordering="last_outcome")
    def outcome(self, job: Job) -> str:
        return _outcome_badge(job.last_outcome)

    @admin.display(description=_("retries"))
    def retries(self, job: Job) -> Any:
        registered = _registered(job)
        return registered.retries if registered is not None else "—"

    @admin.display(description=_("timeout"))
    def timeout(self, job: Job) -> Any:
        registered = _registered(job)
        return registered.timeout if registered is not None else "—"

    @admin.display(description=_("kicks"))
    def kicks(self, job: Job) -> Any:
        registered = _registered(job)
        return ", ".join(registered.kicks) if registered is not None and registered.kicks else "—"

    @admin.display(description=_("recent attempts"))
    def recent_attempts(self, job: Job) -> str:
        rows = Attempt.objects.filter(job=job.name)[:_RECENT_ATTEMPTS]
        if not rows:
            return str(_("none yet"))
        items = format_html_join(
            "",
            '<li><a href="{}">{} #{}</a> {} · {}</li>',
            (
                (
                    reverse(f"{self.admin_site.name}:fabrika_django_attempt_change", args=[row.pk]),
                    date_format(timezone.localtime(row.started), "DATETIME_FORMAT"),
                    row.number,
                    row.trigger,
                    _outcome_badge(row.outcome),
                )
                for row in rows
            ),
        )
        everything = reverse(f"{self.admin_site.name}:fabrika_django_attempt_changelist") + f"?job={job.name}"
        return format_html('<ul class="fabrika-plain">{}</ul><a href="{}">{}</a>', items, everything, _("All attempts"))

    @admin.action(description=_("Run selected now"), permissions=["change"])
    def run_selected_now(self, request: HttpRequest, queryset: Any) -> None:
        """Kick each selected registered job: a worker runs it within seconds."""
        names = [job.name for job in queryset if job.name in registry]
        for name in names:
            _kick(name)
        self.message_user(
            request,
            ngettext(
                "Kicked %(count)d job: a worker runs it shortly.",
                "Kicked %(count)d jobs: a worker runs them shortly.",
                len(names),
            )
            % {"count": len(names)},
            messages.SUCCESS,
        )

    def get_urls(self) -> list[Any]:
        site = self.admin_site
        mine = [
            path("<path:object_id>/run/", site.admin_view(self._run_view), name="fabrika_django_job_run"),
        ]
        return [*mine, *super().get_urls()]

    def _run_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Kick one job from its page: POST only, CSRF (admin_view), the change permission on jobs."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):  # first: the 404 would tell which jobs exist
            raise PermissionDenied
        job = get_object_or_404(Job, pk=unquote(object_id))
        if job.name not in registry:
            self.message_user(
                request, _("No registered job has this name: declare it with @cron, then run it."), messages.ERROR
            )
        else:
            _kick(job.name)
            self.message_user(
                request, _("Kicked %(name)s: a worker runs it shortly.") % {"name": job.name}, messages.SUCCESS
            )
        page = reverse(f"{self.admin_site.name}:fabrika_django_job_change", args=[quote(job.pk)])
        return HttpResponseRedirect(page)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        job = kwargs.get("obj") or context.get("original")
        context.update(
            title=_("Job"),
            show_save=False,
            show_save_and_continue=False,
            show_save_and_add_another=False,
            show_delete=False,
        )
        if job is not None and job.name in registry and self.has_change_permission(request, job):
            context["fabrika_run_url"] = reverse(f"{self.admin_site.name}:fabrika_django_job_run", args=[quote(job.pk)])
        return super().render_change_form(request, context, *args, **kwargs)


def _kick(name: str) -> None:
    from ..kicks import kick

    kick(name)


def _registered(job: Job) -> Any:
    return registry.get(job.name) if job.name in registry else None


class _JobFilter(admin.SimpleListFilter):
    """The registered jobs' names: no DISTINCT over a long history to build the list."""

    title = _("job")
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> Any:
        return [(job.name, job.name) for job in registry]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset.filter(job=self.value()) if self.value() else queryset


class HistoryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A framework history table, read-only: nobody adds, changes or deletes a row, a superuser neither.

    Attempts leave with the history pruning (``RUN_HISTORY_DAYS``). A sent-mail row is the promise that its
    key never sends twice: deleting it by hand would let the next try of that key send the message again.
    """

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Attempt)
class AttemptAdmin(HistoryAdmin):
    """Attempts: read-only history."""

    list_display = ("job", "number", "trigger", "outcome_badge", "started", "took", "error_class", "short_run")
    list_filter = (_JobFilter, "outcome", "trigger")
    fields = (
        "job",
        "run_id",
        "number",
        "trigger",
        "holder",
        "started",
        "finished",
        "took",
        "outcome_badge",
        "error_class",
        "frames_block",
        "message",
    )
    readonly_fields = fields
    show_full_result_count = False  # a long history: no second COUNT(*) over the whole table

    class Media:
        css = {"all": ["fabrika_django/admin.css"]}

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_fields(request, obj))
        return fields if obj is not None and obj.message else [name for name in fields if name != "message"]

    @admin.display(description=_("outcome"), ordering="outcome")
    def outcome_badge(self, attempt: Attempt) -> str:
        return _outcome_badge(attempt.outcome)

    @admin.display(description=_("took"))
    def took(self, attempt: Attempt) -> str:
        duration = attempt.duration
        return f"{duration.total_seconds():.1f} s" if duration is not None else "—"

    @admin.display(description=_("run"), ordering="run_id")
    def short_run(self, attempt: Attempt) -> str:
        return str(attempt.run_id)[:8]

    @admin.display(description=_("frames"))
    def frames_block(self, attempt: Attempt) -> str:
        return format_html('<pre class="fabrika-frames">{}</pre>', attempt.frames) if attempt.frames else "—"
