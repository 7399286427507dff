"""The overview: every queue table's counts by state, and every job's health, on one admin page."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict

import django
from django.contrib import admin
from django.contrib.admin import AdminSite
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.admin.utils import quote
from django.db import models
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .._queuestate import STATES
from ..jobs import registry
from ..models import Overview
from ..ops import _health
from ..ops._counts import QueueCounts, count_queue, queue_models
from ..ops._report import job_states
from ._display import relative
from ._pictures import JobPicture, job_pictures, queue_pictures

if TYPE_CHECKING:
    from django.urls import URLPattern

#: Done rows are counted up to this many: past it the page says "10000+" instead of reading the whole table.
DONE_COUNT_CAP = 10_000


class _JobRow(TypedDict):
    """A job's row on the overview."""

    name: str
    url: str | None
    active: bool
    active_lanes: int
    lanes: int
    pending: bool
    last_outcome: str
    last_finished: datetime | None
    last_success: datetime | None
    failures_in_row: int
    last_success_words: str | None
    picture: JobPicture


def _changelist(site: AdminSite, request: HttpRequest, model: type[models.Model]) -> str | None:
    try:
        model_admin = site.get_model_admin(model)
    except NotRegistered:
        return None
    if not model_admin.has_view_or_change_permission(request):
        return None
    opts = model._meta
    try:
        return reverse(f"{site.name}:{opts.app_label}_{opts.model_name}_changelist")
    except NoReverseMatch:
        return None


def _queue_rows(
    site: AdminSite, request: HttpRequest, now: datetime, counted: dict[str, QueueCounts]
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    pictures = queue_pictures(list(counted), now)
    for model in queue_models():
        counts = counted[model._meta.label]
        url = _changelist(site, request, model)
        cells: list[dict[str, object]] = []
        for state, label in STATES:
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
                "oldest_words": relative(counts.oldest_due, now) if counts.oldest_due else None,
                "dead": counts.dead,
                "picture": pictures[model._meta.label],
            }
        )
    return rows


def _job_rows(site: AdminSite, request: HttpRequest, now: datetime) -> list[_JobRow]:
    rows: list[_JobRow] = []
    pictures = job_pictures([registered.name for registered in registry], now)
    for state in job_states(now):
        try:
            url = reverse(f"{site.name}:fabrika_django_job_change", args=[quote(state.name)])
        except NoReverseMatch:
            url = None
        rows.append(
            {
                "name": state.name,
                "url": url,
                "active": state.active,
                "active_lanes": state.active_lanes,
                "lanes": state.lanes,
                "pending": state.pending,
                "last_outcome": state.last_outcome,
                "last_finished": state.last_finished,
                "last_success": state.last_success,
                "failures_in_row": state.failures_in_row,
                "last_success_words": relative(state.last_success, now) if state.last_success else None,
                "picture": pictures[state.name],
            }
        )
    return rows


def overview_view(site: AdminSite) -> Callable[[HttpRequest], HttpResponse]:
    """Return the overview view of ``site`` (wrap it in ``site.admin_view``: staff only, like every admin page)."""

    def overview(request: HttpRequest) -> HttpResponse:
        request.current_app = site.name  # {% url 'admin:...' %} resolves in this site's namespace
        now = timezone.now()
        counted = {model._meta.label: count_queue(model, now, cap=DONE_COUNT_CAP) for model in queue_models()}
        jobs = _job_rows(site, request, now)
        context = {
            **site.each_context(request),
            "title": _("Background work overview"),
            "subtitle": None,
            "now": now,
            "queues": _queue_rows(site, request, now, counted),
            "health": _health.health_report(now, counts=counted),
            "jobs": jobs,
            "idle_jobs": [job["name"] for job in jobs if job["picture"]["empty"]],
            "done_cap": DONE_COUNT_CAP,
            # Django 6.1's admin styles breadcrumbs as a list (ol.breadcrumbs); its div lost the bar there.
            "fabrika_breadcrumbs_list": django.VERSION >= (6, 1),
        }
        return TemplateResponse(request, "admin/fabrika_django/overview.html", context)

    return overview


@admin.register(Overview)
class OverviewAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The overview's entry in the admin index: every staff user sees it; nothing is added, changed or deleted."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_view_permission(self, request: HttpRequest, obj: Overview | None = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Overview | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Overview | None = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(overview_view(self.admin_site))
        return [
            path("", view, name="fabrika_django_overview"),
            path("", view, name="fabrika_django_overview_changelist"),  # the name the admin index links by
        ]
