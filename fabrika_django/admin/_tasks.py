"""The tasks page: Django tasks (``fabrika_django.tasks.FabrikaBackend``), their status, and requeue for failed ones.

The list shows where each task is, never what it was called with: args and the return value (which can hold a
person's data) are on a task's own page only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..models import QueuedTask, TaskStatus
from ._attempts import storable
from ._display import breakable, flat_fields, time_column
from ._queues import QueueModelAdminMixin, StateListFilter

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from ..models import QueueModel
    from ._display import ListDisplay, ListFilterSpec


class _FunctionFilter(admin.SimpleListFilter):
    """Filter by the task's function (its dotted path), among those the table holds."""

    title = _("function")
    parameter_name = "function"

    def lookups(self, request: HttpRequest, model_admin: object) -> list[tuple[str, str]]:
        paths = QueuedTask.objects.order_by("task_path").values_list("task_path", flat=True).distinct()[:200]
        return [(path, path) for path in paths]

    def queryset(self, request: HttpRequest, queryset: QuerySet[QueuedTask]) -> QuerySet[QueuedTask]:
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(task_path=value) if storable(value) else queryset.none()


class _OverviewStateFilter(StateListFilter):
    """The queue's state filter, shown only while it filters: the overview's counts link by state.

    A task's status already says where it is in Django's words; a second filter of nearly the same choices
    beside it would only make a person wonder which one to use.
    """

    def has_output(self) -> bool:
        return self.value() is not None


class _TaskChangeList(ChangeList):
    """The list reads no call or result: a page of 50 tasks of a few MB each would load them all for nothing."""

    def get_queryset(
        self, request: HttpRequest, exclude_parameters: list[str | None] | None = None
    ) -> QuerySet[QueuedTask]:
        return super().get_queryset(request, exclude_parameters).defer(*_NOT_LISTED)


#: The columns only a task's own page shows.
_NOT_LISTED = ("args", "kwargs", "return_value", "errors")


@admin.register(QueuedTask)
class QueuedTaskAdmin(QueueModelAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Tasks: read-only; "Requeue" makes a FAILED task READY with no attempts and kicks its queue's job."""

    # Seven columns fit 1280 px with both sidebars open; when it started and its last attempt are on its page.
    list_display = ("function", "status", "queue_name", "priority", "enqueued", "finished", "tries")
    list_filter = ("status", "queue_name", _FunctionFilter, "backend", _OverviewStateFilter)
    list_per_page = 50
    search_fields = ("=result_id",)
    # No date_hierarchy: on MySQL/MariaDB it needs the server's time zone tables, which many servers lack,
    # and the page would answer 500 there; the list sorts by time and filters by status instead.
    fieldsets = (
        (None, {"fields": ("result_id", "task_path", "backend", "queue_name", "priority", "status", "tries")}),
        (_("Times"), {"fields": ("enqueued", "run_after_at", "started", "last_attempted", "finished")}),
        (_("Call and result"), {"fields": ("args", "kwargs", "return_value", "errors", "worker_ids")}),
        (_("Queue"), {"fields": ("attempts", "queue_due", "version", "failure")}),
    )

    enqueued = time_column("enqueued_at", _("enqueued"))
    run_after_at = time_column("run_after", _("run after"))
    started = time_column("started_at", _("started"))
    last_attempted = time_column("last_attempted_at", _("last attempted"))
    finished = time_column("finished_at", _("finished"))

    def get_list_display(self, request: HttpRequest) -> ListDisplay[QueueModel]:
        return self.list_display  # status, not the queue's state column: a task speaks Django's words

    def get_changelist(self, request: HttpRequest, **kwargs: object) -> type[ChangeList]:
        return _TaskChangeList

    def get_list_filter(self, request: HttpRequest) -> list[ListFilterSpec] | tuple[ListFilterSpec, ...]:
        return self.list_filter

    def get_readonly_fields(self, request: HttpRequest, obj: QueueModel | None = None) -> list[str]:
        return [name for _title, options in self.fieldsets for name in flat_fields(options["fields"])]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a task is enqueued by code, with @task's validation

    @admin.display(description=_("function"), ordering="task_path")
    def function(self, row: QueuedTask) -> str:
        return breakable(row.task_path)

    @admin.display(description=_("last failure"))
    def failure(self, row: QueuedTask) -> str:
        """The code of the last failed attempt; kept after a later success, as the errors it stands for are."""
        if not row.last_failure:
            return "—"
        if row.status == TaskStatus.SUCCESSFUL:
            return format_html(
                '<code>{}</code> <span class="fabrika-quiet">{}</span>', row.last_failure, _("(before the success)")
            )
        return format_html("<code>{}</code>", row.last_failure)

    @admin.display(description=_("attempts"))
    def tries(self, row: QueuedTask) -> int:
        return len(row.worker_ids)  # Django's TaskResult.attempts; the queue's own column jumps when given up

    @admin.action(description=_("Requeue selected failed tasks"), permissions=["change"])
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet[QueuedTask]) -> None:  # type: ignore[override]
        """Requeue the FAILED tasks among those selected and leave READY and SUCCESSFUL ones; a RUNNING one
        refuses the whole action, as ``fabrika_job requeue`` does."""
        failed = queryset.filter(status__in=(TaskStatus.FAILED, TaskStatus.RUNNING))
        others = queryset.count() - failed.count()
        self._requeue(request, failed)
        if others:
            self.message_user(
                request,
                ngettext(
                    "Left %(count)d task that has not failed.", "Left %(count)d tasks that have not failed.", others
                )
                % {"count": others},
                messages.INFO,
            )

    def _requeue_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        # Only a failed task (a RUNNING one is refused by the requeue itself); everything else (POST only,
        # permission first, a missing row) as for any queue row.
        if request.method == "POST" and self.has_change_permission(request):
            row = self.get_object(request, unquote(object_id))
            if isinstance(row, QueuedTask) and row.status not in (TaskStatus.FAILED, TaskStatus.RUNNING):
                self.message_user(request, _("Only a failed task can be requeued."), messages.WARNING)
                opts = self.model._meta
                page = reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change", args=[row.pk])
                return HttpResponseRedirect(page)
        return super()._requeue_view(request, object_id)

    def _requeue_button(self, request: HttpRequest, row: QueueModel) -> bool:
        # The button is for failed tasks only (a row of this admin is a task).
        failed = isinstance(row, QueuedTask) and row.status == TaskStatus.FAILED
        return failed and super()._requeue_button(request, row)
