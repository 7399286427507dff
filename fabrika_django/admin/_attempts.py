"""The read-only history pages of the admin: attempts (and the base of the sent-mail page)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..jobs import registry
from ..models import Attempt, Outcome
from ._display import breakable, time_column, took

if TYPE_CHECKING:
    from django.db.models import Model, QuerySet

    from ._display import FieldGroups


def outcome_badge(outcome: str) -> str:
    if not outcome:
        return "—"
    kind = "done" if outcome == Outcome.SUCCEEDED else "waiting" if outcome == Outcome.RUNNING else "dead"
    return format_html('<span class="fabrika-badge fabrika-badge--{}">{}</span>', kind, outcome)


def storable(text: str) -> bool:
    """Whether a text column can hold ``text``: PostgreSQL refuses a NUL in one (a DataError, so a 500), and a name
    with one is no job's, so a page asking for it is answered as for any name no row holds."""
    return "\x00" not in text


class _JobFilter(admin.SimpleListFilter):
    """The registered jobs' names: no DISTINCT over a long history to build the list."""

    title = _("job")
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: object) -> list[tuple[str, str]]:
        return [(job.name, job.name) for job in registry]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Attempt]) -> QuerySet[Attempt]:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(job=value) if storable(value) else queryset.none()


class HistoryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A framework history table, read-only: nobody adds, changes or deletes a row, a superuser neither.

    Attempts leave with the history pruning (``RUN_HISTORY_DAYS``). A sent-mail row is the promise that its
    key never sends twice: deleting it by hand would let the next try of that key send the message again.
    """

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Attempt)
class AttemptAdmin(HistoryAdmin):
    """Attempts: read-only history."""

    # The run's id is on the attempt's page: seven columns fit 1280 px beside both sidebars.
    list_display = ("job_name", "number", "trigger", "outcome_badge", "started_at", "took", "error_class")
    list_filter = (_JobFilter, "outcome", "trigger")
    fields = (
        "job",
        "run_id",
        "number",
        "lane",
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

    def get_fields(self, request: HttpRequest, obj: Attempt | None = None) -> FieldGroups:
        fields = list(super().get_fields(request, obj))
        return fields if obj is not None and obj.message else [name for name in fields if name != "message"]

    @admin.display(description=_("outcome"), ordering="outcome")
    def outcome_badge(self, attempt: Attempt) -> str:
        return outcome_badge(attempt.outcome)

    started_at = time_column("started", _("started"))

    @admin.display(description=_("job"), ordering="job")
    def job_name(self, attempt: Attempt) -> str:
        return breakable(attempt.job)

    @admin.display(description=_("took"))
    def took(self, attempt: Attempt) -> str:
        return took(attempt.duration.total_seconds()) if attempt.duration is not None else "—"

    @admin.display(description=_("frames"))
    def frames_block(self, attempt: Attempt) -> str:
        return format_html('<pre class="fabrika-frames">{}</pre>', attempt.frames) if attempt.frames else "—"
