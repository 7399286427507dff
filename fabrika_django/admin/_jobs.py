"""The jobs page of the admin: each registered job, its schedule, its last run, and "Run now"."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .._runs import reads as run_reads
from .._schedule_words import describe
from ..jobs import CronJob, registry
from ..kicks import kick
from ..models import Job
from ..schedule import Schedule
from ._attempts import outcome_badge, storable
from ._display import relative

if TYPE_CHECKING:
    from datetime import timedelta

    from django.db.models import QuerySet
    from django.urls import URLPattern

_RECENT_ATTEMPTS = 10


def describe_schedule(schedule: Schedule | None) -> str:
    """Return the schedule in words (see ``fabrika_django._schedule_words``)."""
    return describe(schedule)


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


def _briefly(value: datetime, now: datetime) -> str:
    """Return "3 minutes ago" (or "just now"), with the absolute time in the user's zone as its tooltip."""
    absolute = date_format(timezone.localtime(value), "DATETIME_FORMAT")
    return format_html('<span class="fabrika-nowrap" title="{}">{}</span>', absolute, relative(value, now))


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Jobs: registered jobs joined with their rows; "Run now" kicks a job."""

    # Seven short columns fit 1280 px with the admin's sidebar open: the schedule carries its words under it,
    # times say how far they are ("in 5 minutes", "just now") with the absolute time under them.
    list_display = (
        "name",
        "schedule_words",
        "next_fire_in",
        "run_state",
        "last_run",
        "outcome",
        "last_success_at",
        "failures",
    )
    # No filter sidebar: it would take a fifth of 1280 px from a list of a few dozen jobs; outcome sorts instead.
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
        "rate_limit",
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

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        now = timezone.now()
        return (
            super()
            .get_queryset(request)
            .annotate(
                active=run_reads.active_annotation(now),
                active_lanes=run_reads.active_lanes_annotation(now),
                kicked=run_reads.kicked_annotation(),
            )
        )

    def get_changelist(self, request: HttpRequest, **kwargs: object) -> type[ChangeList]:
        return _JobChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Job | None:
        """Return the job's row; for a registered job without one yet, the row it will have (unsaved)."""
        if not storable(object_id):
            return None
        job = super().get_object(request, object_id, from_field)
        if job is None and object_id in registry:
            job = Job(name=object_id)
        return job

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, object] | None = None) -> HttpResponse:
        context = {
            "fabrika_overview_url": reverse(f"{self.admin_site.name}:fabrika_django_overview"),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are declared with @cron, not made here

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False  # a registered job's row comes back on the next run

    @admin.display(description=_("schedule"))
    def schedule(self, job: Job) -> str:
        registered = _registered(job)
        if registered is None:
            return str(_("not registered"))
        return format_html("<code>{}</code>", registered.schedule.expression if registered.schedule else "—")

    @admin.display(description=_("schedule"))
    def schedule_words(self, job: Job) -> str:
        registered = _registered(job)
        if registered is None:
            return str(_("not registered"))
        if registered.schedule is None:
            shown = format_html('<span class="fabrika-quiet">{}</span>', _("kick only"))
        else:
            shown = format_html(
                '<code>{}</code> <span class="fabrika-quiet">{}</span>',
                registered.schedule.expression,
                describe_schedule(registered.schedule),
            )
        if registered.rate_limit is not None:  # the rate as declared, under the schedule
            shown = format_html(
                '{}<br><span class="fabrika-quiet">{} <code>{}</code></span>',
                shown,
                _("at most"),
                registered.rate_limit,
            )
        return shown

    @admin.display(description=_("last success"), ordering="last_success")
    def last_success_at(self, job: Job) -> str:
        return _briefly(job.last_success, timezone.now()) if job.last_success else str(_("never"))

    @admin.display(description=_("in words"))
    def in_words(self, job: Job) -> str:
        registered = _registered(job)
        return describe_schedule(registered.schedule) if registered is not None else "—"

    @admin.display(description=_("next fire"), ordering="next_fire")
    def next_fire_at(self, job: Job) -> str:
        return _when(self._next_fire(job))

    def _next_fire(self, job: Job) -> datetime | None:
        registered = _registered(job)
        fire = job.next_fire
        if fire is None and registered is not None and registered.schedule is not None:
            fire = registered.schedule.next_after(timezone.now())  # no worker has planned it yet
        return fire

    @admin.display(description=_("next fire"), ordering="next_fire")
    def next_fire_in(self, job: Job) -> str:
        """The list's short form: "in 12 minutes" over the UTC time; the local time is the tooltip."""
        fire = self._next_fire(job)
        if fire is None:
            return "—"
        local = date_format(timezone.localtime(fire), "DATETIME_FORMAT")
        zone = timezone.localtime(fire).tzname()
        return format_html(
            '<span class="fabrika-nowrap" title="{} {}">{}</span> <span class="fabrika-quiet">{}</span>',
            local,
            zone,
            relative(fire, timezone.now()),
            fire.astimezone(UTC).strftime("%m-%d %H:%M UTC"),  # the year is in the tooltip
        )

    @admin.display(description=_("failures"), ordering="failures_in_row")
    def failures(self, job: Job) -> int:
        return job.failures_in_row

    @admin.display(description=_("state"))
    def run_state(self, job: Job) -> str:
        active = bool(getattr(job, "active", False))
        pending = job.pending_since is not None or bool(getattr(job, "kicked", False))
        words = [str(_("active"))] if active else []
        lanes = registry.get(job.name).lanes if job.name in registry else 1
        if active and lanes > 1:
            # Active lanes of lanes: how many of the job's runs are active now, of how many it may have.
            words = [f"{words[0]} {getattr(job, 'active_lanes', 0)}/{lanes}"]
        if pending:
            words.append(str(_("pending")))
        if not words:
            return format_html('<span class="fabrika-quiet">{}</span>', _("idle"))
        return format_html('<span class="fabrika-badge fabrika-badge--due-now">{}</span>', ", ".join(words))

    @admin.display(description=_("last run"), ordering="last_started")
    def last_run(self, job: Job) -> str:
        if job.last_started is None:
            return str(_("never"))
        return format_html("{} · {}", _briefly(job.last_started, timezone.now()), job.last_trigger or "—")

    @admin.display(description=_("last outcome"), ordering="last_outcome")
    def outcome(self, job: Job) -> str:
        return outcome_badge(job.last_outcome)

    @admin.display(description=_("retries"))
    def retries(self, job: Job) -> int | str:
        registered = _registered(job)
        return registered.retries if registered is not None else "—"

    @admin.display(description=_("timeout"))
    def timeout(self, job: Job) -> timedelta | str:
        registered = _registered(job)
        return registered.timeout if registered is not None else "—"

    @admin.display(description=_("rate limit"))
    def rate_limit(self, job: Job) -> str:
        registered = _registered(job)
        return registered.rate_limit if registered is not None and registered.rate_limit else "—"

    @admin.display(description=_("kicks"))
    def kicks(self, job: Job) -> str:
        registered = _registered(job)
        return ", ".join(registered.kicks) if registered is not None and registered.kicks else "—"

    @admin.display(description=_("recent attempts"))
    def recent_attempts(self, job: Job) -> str:
        rows = run_reads.recent_attempts(job.name, _RECENT_ATTEMPTS)
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
                    outcome_badge(row.outcome),
                )
                for row in rows
            ),
        )
        everything = reverse(f"{self.admin_site.name}:fabrika_django_attempt_changelist") + f"?job={job.name}"
        return format_html('<ul class="fabrika-plain">{}</ul><a href="{}">{}</a>', items, everything, _("All attempts"))

    @admin.action(description=_("Run selected now"), permissions=["change"])
    def run_selected_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """Kick each selected registered job: a worker runs it within seconds."""
        # A registered job listed without a row yet is selected by name: the queryset holds rows only.
        selected = set(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))
        names = sorted({job.name for job in queryset} | selected & set(_registered_names()))
        names = [name for name in names if name in registry]
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

    def get_urls(self) -> list[URLPattern]:
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
        job = self.get_object(request, unquote(object_id))
        if job is None:
            raise Http404
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

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, object],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Job | None = None,
    ) -> HttpResponse:
        job = obj  # Django passes the row as ``obj`` (and as the context's "original")
        context.update(
            title=_("Job"),
            show_save=False,
            show_save_and_continue=False,
            show_save_and_add_another=False,
            show_delete=False,
        )
        if job is not None and job.name in registry and self.has_change_permission(request, job):
            context["fabrika_run_url"] = reverse(f"{self.admin_site.name}:fabrika_django_job_run", args=[quote(job.pk)])
        return super().render_change_form(request, context, add, change, form_url, obj)


def _kick(name: str) -> None:
    kick(name)


class _JobChangeList(ChangeList):
    """The jobs list: a registered job without rows yet is listed too, as the row it will have (unsaved).

    Nothing is written on a GET: the rows are made by the job's first run, a kick, or a worker's start.
    """

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        if self.query or self.get_filters_params() or self.page_num > 1:
            return
        listed = run_reads.job_names()
        missing = [Job(name=job.name) for job in registry if job.name not in listed]
        if not missing:
            return
        for job in missing:
            job.active = False  # type: ignore[attr-defined]
            job.active_lanes = 0  # type: ignore[attr-defined]
        self.result_list = sorted([*self.result_list, *missing], key=lambda job: job.name)
        self.result_count += len(missing)
        self.full_result_count = (self.full_result_count or 0) + len(missing)


def _registered_names() -> list[str]:
    return [job.name for job in registry]


def _registered(job: Job) -> CronJob | None:
    return registry.get(job.name) if job.name in registry else None
