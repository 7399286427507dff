"""The admin of the application's queue tables: state column and filter, requeue action and button."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin, messages
from django.contrib.admin.options import IS_POPUP_VAR
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .._queuestate import STATES, row_state_at, state_q
from .._requeue import RunningTasks, requeue_rows
from ._display import flat_fields, moment

if TYPE_CHECKING:
    from collections.abc import Iterable

    from django.db.models import QuerySet
    from django.urls import URLPattern
    from django_stubs_ext import StrOrPromise

    from ..models import QueueModel
    from ._display import Fieldsets, ListDisplay, ListFilterSpec

# The fields the framework writes: shown, never edited (an edited attempts/version/due would lie to claim()).
_READ_ONLY = ("queue_state", "attempts", "queue_due", "version", "last_failure")
_REQUEUED = [{"changed": {"fields": ["due", "attempts"]}}]  # the admin history's entry of a requeue
_COLUMNS = ("queue_state", "attempts", "queue_due", "last_failure")
# The version column's smallest range (PostgreSQL's integer) bounds what a row's page can have shown.
_VERSION_MAX = 2_147_483_647
_BAD_VERSION = _("The page's version of this row is not a whole number: reload the page and try again.")


def _version(text: str) -> int | None:
    """The version a row's page posted, or None for text no page shows (not ASCII digits, or past the column)."""
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(_VERSION_MAX))):
        return None
    value = int(text)
    return value if value <= _VERSION_MAX else None


def _badge(state: str, label: object) -> str:
    return format_html('<span class="fabrika-badge fabrika-badge--{}">{}</span>', state.replace("_", "-"), label)


class StateListFilter(admin.SimpleListFilter):
    """Filter a queue table by waiting / due now / dead / done."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: object) -> Iterable[tuple[str, StrOrPromise]]:
        return STATES

    def queryset(self, request: HttpRequest, queryset: QuerySet[QueueModel]) -> QuerySet[QueueModel]:
        value = self.value()
        if value not in dict(STATES):
            return queryset
        return queryset.filter(state_q(queryset.model, str(value), timezone.now()))


if TYPE_CHECKING:
    _AdminBase = admin.ModelAdmin[QueueModel]
else:
    _AdminBase = object  # the mixin goes before a ModelAdmin in the bases; it is none itself


class QueueModelAdminMixin(_AdminBase):
    """Mix into any ``ModelAdmin`` of a ``QueueModel`` for the state column and filter and the requeue tools.

    Adds to what the admin declares: the columns ``queue_state``, ``attempts``, ``queue_due`` and
    ``last_failure`` (name them in ``list_display`` to place them yourself), the state filter, the
    "Requeue selected" action, the framework's fields as read-only fields, and a "Requeue" button on a
    row's page (``change_form_template``; a template of your own can extend ours). Both requeue paths
    need the model's change permission and go through ``row.requeue()``, so a row changed meanwhile
    is reported and left as it is.
    """

    change_form_template: ClassVar[str | None] = "admin/fabrika_django/queue_change_form.html"

    class Media:
        css = {"all": ["fabrika_django/admin.css"]}

    def get_list_display(self, request: HttpRequest) -> ListDisplay[QueueModel]:
        shown = list(super().get_list_display(request))
        return [*shown, *(column for column in _COLUMNS if column not in shown)]

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> Any:
        # Django 6.1 asks per place (the list, or a change form); earlier versions have the list only.
        where = () if action_location is None else (action_location,)
        actions = super().get_actions(request, *where)
        # Added here rather than in `actions`, so an admin that declares its own actions keeps this one.
        if self.actions is None or IS_POPUP_VAR in request.GET or "requeue_selected" in actions:
            return actions
        if self.has_change_permission(request):
            action = self.get_action("requeue_selected", *where)
            if action is not None:  # Django 6.1: not an action of the change form (that page has its button)
                actions["requeue_selected"] = action
        return actions

    def get_list_filter(self, request: HttpRequest) -> list[ListFilterSpec] | tuple[ListFilterSpec, ...]:
        filters = list(super().get_list_filter(request))
        return filters if StateListFilter in filters else [StateListFilter, *filters]

    def get_readonly_fields(self, request: HttpRequest, obj: QueueModel | None = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, *(name for name in _READ_ONLY if name not in fields)]

    def get_fieldsets(self, request: HttpRequest, obj: QueueModel | None = None) -> Fieldsets:
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is None:
            return fieldsets
        placed = {name for _title, options in fieldsets for name in flat_fields(options.get("fields", ()))}
        if self.fieldsets is not None and not placed.isdisjoint(_READ_ONLY):
            return fieldsets  # the admin placed them itself
        # The queue's own fields first, on a row of their own: what a person opens a stuck row for.
        rest: Fieldsets = [
            (title, {**options, "fields": [line for line in options.get("fields", ()) if line not in _READ_ONLY]})
            for title, options in fieldsets
        ]
        return [(_("Queue"), {"fields": [_READ_ONLY[:3], _READ_ONLY[3:]]}), *rest]

    @admin.display(description=_("state"), ordering="due")
    def queue_state(self, row: QueueModel) -> str:
        state = row_state_at(row, timezone.now())
        return _badge(state, dict(STATES)[state])

    @admin.display(description=_("due"), ordering="due")
    def queue_due(self, row: QueueModel) -> str:
        return moment(row.due, timezone.now())

    @admin.action(description=_("Requeue selected"), permissions=["change"])
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet[QueueModel]) -> None:
        """Make each selected waiting or dead row due now with no attempts; leave done rows and changed rows."""
        self._requeue(request, queryset)

    def _requeue(self, request: HttpRequest, rows: QuerySet[QueueModel] | list[QueueModel]) -> None:
        """Requeue ``rows`` (a queryset, or the one row a page showed) and say what was done."""
        try:
            done = requeue_rows(rows, self.model, on_requeued=lambda row: self.log_change(request, row, _REQUEUED))
        except RunningTasks as refused:
            self.message_user(request, str(refused), messages.ERROR)
            return
        opts = self.model._meta
        requeued = len(done.requeued)
        message = ngettext("Requeued %(count)d %(name)s.", "Requeued %(count)d %(plural)s.", requeued) % {
            "count": requeued,
            "name": opts.verbose_name,
            "plural": opts.verbose_name_plural,
        }
        if done.kicked:
            message += " " + str(_("Kicked %(jobs)s.") % {"jobs": ", ".join(done.kicked)})
        self.message_user(request, message, messages.SUCCESS if requeued else messages.INFO)
        if done.conflicted:
            self.message_user(
                request,
                _("Changed since they were read, so left as they are: %(ids)s. Reload the list and try again.")
                % {"ids": ", ".join(done.conflicted)},
                messages.WARNING,
            )
        if done.skipped_done:
            self.message_user(
                request,
                ngettext(
                    "Skipped %(count)d done row: its work is finished.",
                    "Skipped %(count)d done rows: their work is finished.",
                    done.skipped_done,
                )
                % {"count": done.skipped_done},
                messages.INFO,
            )

    def get_urls(self) -> list[URLPattern]:
        opts = self.model._meta
        view = self.admin_site.admin_view(self._requeue_view)
        mine = [path("<path:object_id>/requeue/", view, name=f"{opts.app_label}_{opts.model_name}_requeue")]
        return [*mine, *super().get_urls()]

    def _requeue_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Requeue one row from its page: POST only, the change permission, the version the page showed."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        # Permission first: a user who may not change the table learns nothing about which rows exist.
        if not self.has_change_permission(request):
            raise PermissionDenied
        row = self.get_object(request, unquote(object_id))  # None for an id that is no row, or no id at all
        if row is None:
            raise Http404(_("No such row: it may have been deleted."))
        if not self.has_change_permission(request, row):
            raise PermissionDenied
        opts = self.model._meta
        page = reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change", args=[quote(row.pk)])
        if row.due is None:  # the button's own word for the rule that skips done rows
            self.message_user(
                request, _("This row is done: its work is finished, so it was not requeued."), messages.WARNING
            )
            return HttpResponseRedirect(page)
        shown = request.POST.get("version", "")
        if shown:
            version = _version(shown)
            if version is None:
                self.message_user(request, _BAD_VERSION, messages.ERROR)
                return HttpResponseRedirect(page)
            row.version = version  # the version the person saw: a change since then is a conflict
        self._requeue(request, [row])
        return HttpResponseRedirect(page)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, object],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: QueueModel | None = None,
    ) -> HttpResponse:
        # Django passes the row as ``obj`` (and as the context's "original").
        if obj is not None and obj.pk is not None:
            opts = self.model._meta
            context["fabrika_requeue_url"] = (
                reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_requeue", args=[quote(obj.pk)])
                if self._requeue_button(request, obj)
                else None
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _requeue_button(self, request: HttpRequest, row: QueueModel) -> bool:
        """Whether a row's page shows the Requeue button: a row not done, to a user who may change it."""
        return row.due is not None and self.has_change_permission(request, row)


class QueueModelAdmin(QueueModelAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """The ``ModelAdmin`` of a queue table: ``admin.site.register(Outbox, QueueModelAdmin)`` or subclass it."""

    list_display = ("__str__",)
    list_per_page = 50
