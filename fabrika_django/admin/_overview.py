"""The overview: every queue table's counts by state, and every job's health, on one admin page."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.contrib.admin import AdminSite
from django.contrib.admin.utils import quote
from django.db import connections, models, router
from django.db.models import Exists, OuterRef
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext_lazy as _

from ..jobs import registry
from ..models import Job, Lease, Overview, QueueModel
from ..queues import max_attempts_of

#: Done rows are counted up to this many: past it the page says "10000+" instead of reading the whole table.
DONE_COUNT_CAP = 10_000


@dataclass
class _QueueCounts:
    model: type[models.Model]
    waiting: int
    due_now: int
    dead: int
    done: int  # DONE_COUNT_CAP + 1 means "more than the cap"
    oldest_due: datetime | None


def queue_models() -> list[type[models.Model]]:
    """Return every concrete queue model of the project, by label."""
    found = [
        model
        for model in apps.get_models()
        if issubclass(model, QueueModel) and not model._meta.abstract and not model._meta.proxy
    ]
    return sorted(found, key=lambda model: model._meta.label)


def _count_sql(model: type[models.Model], now: datetime, using: str) -> tuple[str, list[Any]]:
    """Return the one statement that counts a queue table's states, and its parameters.

    The outer query reads only rows with ``due`` set, the predicate of the table's partial index, so waiting,
    due-now and dead rows are counted from that index however many done rows the table holds. Done rows are
    counted in a sub-select that stops at ``DONE_COUNT_CAP + 1``: a million finished rows cost no more than
    ten thousand. Written by hand because the ORM's ``aggregate()`` refuses the scalar sub-select.
    """
    connection = connections[using]
    quote = connection.ops.quote_name
    opts = model._meta
    due_field: Any = opts.get_field("due")
    attempts_field: Any = opts.get_field("attempts")
    table, due, attempts = quote(opts.db_table), quote(due_field.column), quote(attempts_field.column)
    limit, moment = max_attempts_of(model), due_field.get_db_prep_save(now, connection)
    waiting = f"{attempts} < %s"
    due_now = f"{attempts} < %s AND {due} <= %s"
    sql = (
        f"SELECT COUNT(CASE WHEN {waiting} THEN 1 END), "  # noqa: S608  quoted names, values as parameters
        f"COUNT(CASE WHEN {due_now} THEN 1 END), "
        f"COUNT(CASE WHEN {attempts} >= %s THEN 1 END), "
        f"MIN(CASE WHEN {due_now} THEN {due} END), "
        f"(SELECT COUNT(*) FROM (SELECT 1 FROM {table} WHERE {due} IS NULL LIMIT %s) fabrika_done) "
        f"FROM {table} WHERE {due} IS NOT NULL"
    )
    return sql, [limit, limit, moment, limit, limit, moment, DONE_COUNT_CAP + 1]


def count_queue(model: type[models.Model], now: datetime) -> _QueueCounts:
    """Count one queue table's rows by state in one statement (see ``_count_sql``)."""
    using = router.db_for_read(model)
    sql, params = _count_sql(model, now, using)
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        waiting, due_now, dead, oldest, done = cursor.fetchone()
    return _QueueCounts(model, waiting, due_now, dead, done, _as_datetime(oldest))


def _as_datetime(value: Any) -> datetime | None:
    """Return a MIN() of a datetime column as an aware datetime (SQLite answers text, MySQL a naive UTC value)."""
    if value is None or isinstance(value, datetime) and timezone.is_aware(value):
        return value
    moment = value if isinstance(value, datetime) else parse_datetime(str(value))
    if moment is not None and settings.USE_TZ and timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    return moment


def _changelist(site: AdminSite, request: HttpRequest, model: type[models.Model]) -> str | None:
    model_admin = site._registry.get(model)
    if model_admin is None or not model_admin.has_view_or_change_permission(request):
        return None
    opts = model._meta
    try:
        return reverse(f"{site.name}:{opts.app_label}_{opts.model_name}_changelist")
    except NoReverseMatch:
        return None


def _queue_rows(site: AdminSite, request: HttpRequest, now: datetime) -> list[dict[str, Any]]:
    rows = []
    for model in queue_models():
        counts = count_queue(model, now)
        url = _changelist(site, request, model)
        cells = []
        for state, label in (
            ("waiting", _("waiting")),
            ("due_now", _("due now")),
            ("dead", _("dead")),
            ("done", _("done")),
        ):
            value = getattr(counts, state)
            shown = f"{DONE_COUNT_CAP}+" if state == "done" and value > DONE_COUNT_CAP else str(value)
            cells.append(
                {
                    "state": state,
                    "css": state.replace("_", "-"),
                    "label": label,
                    "count": value,
                    "shown": shown,
                    "url": f"{url}?state={state}" if url else None,
                }
            )
        rows.append(
            {
                "label": model._meta.verbose_name_plural,
                "model": model._meta.label,
                "url": url,
                "cells": cells,
                "oldest_due": counts.oldest_due,
                "oldest_age": now - counts.oldest_due if counts.oldest_due else None,
                "dead": counts.dead,
            }
        )
    return rows


def _job_rows(site: AdminSite, request: HttpRequest, now: datetime) -> list[dict[str, Any]]:
    from ._jobs import _sync_registered_jobs

    _sync_registered_jobs()
    leased = Lease.objects.filter(job=OuterRef("name"), token__isnull=False, expires__gt=now)
    jobs = {job.name: job for job in Job.objects.annotate(active=Exists(leased))}
    rows = []
    for registered in registry:
        job = jobs.get(registered.name)
        try:
            url = reverse(f"{site.name}:fabrika_django_job_change", args=[quote(registered.name)])
        except NoReverseMatch:
            url = None
        failures = job.failures_in_row if job else 0
        rows.append(
            {
                "name": registered.name,
                "url": url,
                "active": bool(job and getattr(job, "active", False)),
                "pending": bool(job and job.pending_since),
                "last_outcome": job.last_outcome if job else "",
                "last_finished": job.last_finished if job else None,
                "last_success": job.last_success if job else None,
                "failures_in_row": failures,
            }
        )
    return rows


def overview_view(site: AdminSite) -> Callable[[HttpRequest], HttpResponse]:
    """Return the overview view of ``site`` (wrap it in ``site.admin_view``: staff only, like every admin page)."""

    def overview(request: HttpRequest) -> HttpResponse:
        request.current_app = site.name  # {% url 'admin:...' %} resolves in this site's namespace
        now = timezone.now()
        context = {
            **site.each_context(request),
            "title": _("Background work overview"),
            "subtitle": None,
            "now": now,
            "queues": _queue_rows(site, request, now),
            "jobs": _job_rows(site, request, now),
            "done_cap": DONE_COUNT_CAP,
        }
        return TemplateResponse(request, "admin/fabrika_django/overview.html", context)

    return overview


@admin.register(Overview)
class OverviewAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The overview's entry in the admin index: every staff user sees it; nothing is added, changed or deleted."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(overview_view(self.admin_site))
        return [
            path("", view, name="fabrika_django_overview"),
            path("", view, name="fabrika_django_overview_changelist"),  # the name the admin index links by
        ]
