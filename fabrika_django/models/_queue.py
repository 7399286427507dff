"""``QueueModel``: the abstract base of a table whose rows are work, and the partial indexes every queue table gets."""

from __future__ import annotations

import re
from datetime import datetime

from django.db import models, router, transaction
from django.db.models.deletion import Collector
from django.db.models.signals import class_prepared
from django.dispatch import receiver
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .._queuestate import DEFAULT_MAX_ATTEMPTS, max_attempts_of, row_state, state_q
from .._row_writes import refuse_own_fields, run_now, update_row
from ..exceptions import VersionConflict
from ..queues import QueueManager

FAILURE_CODE = re.compile(r"[a-z0-9_.-]{1,64}")  # matched whole (fullmatch): "send\n" is not a code


class QueueModel(models.Model):
    """A table whose rows are work: mix it into a model, claim its rows in a job.

    A row is *waiting* while ``due`` is set and its attempts are below ``Queue.max_attempts``, *dead* once
    they reach it, and *done* when ``due`` is null. Optional options::

        class Queue:
            max_attempts = 5    # default 10
    """

    attempts = models.PositiveIntegerField(_("attempts"), default=0, editable=False)
    due = models.DateTimeField(_("due"), null=True, blank=True, default=timezone.now, editable=False)
    version = models.PositiveIntegerField(_("version"), default=0, editable=False)
    last_failure = models.CharField(_("last failure"), max_length=64, blank=True, default="", editable=False)

    objects = QueueManager()

    class Meta:
        abstract = True

    class Queue:
        max_attempts = DEFAULT_MAX_ATTEMPTS

    @property
    def state(self) -> str:
        """Return ``"waiting"``, ``"dead"`` or ``"done"``."""
        return row_state(self)

    @property
    def is_due_now(self) -> bool:
        """Return whether the row is waiting and its time has come (by the run's clock inside a run)."""
        return row_state(self) == "waiting" and self.due is not None and self.due <= run_now()

    def finish(self, **values: object) -> None:
        """Write ``values``, mark the row done and bump its version, if it is unchanged since it was read."""
        refuse_own_fields("finish", values)
        write_versioned(self, dict(values, due=None))

    def requeue(self, at: datetime | None = None) -> None:
        """Make the row due again at ``at`` (now by default) with no attempts, if it is unchanged.

        "Now" is the run's clock inside a job run (a test's fixed one), the wall clock elsewhere (the admin).
        """
        write_versioned(self, {"due": at if at is not None else run_now(), "attempts": 0})

    def record_failure(self, code: str, *, give_up: bool = False) -> None:
        """Keep a fixed step code (``[a-z0-9_.-]``, at most 64) in ``last_failure``; never an error message.

        ``give_up=True`` also makes the row dead at once (its attempts reach ``max_attempts``): for a failure no
        retry can fix, such as a refused message; a person requeues it from the admin.
        """
        if not isinstance(code, str) or not FAILURE_CODE.fullmatch(code):
            # The value is not quoted back: a wrong code is often an error's message, which can quote a user's data.
            raise ValueError(
                "record_failure() needs a fixed code: 1-64 characters of a-z, 0-9, '_', '.', '-' "
                "naming the step (e.g. 'send'), never an error message."
            )
        values: dict[str, object] = {"last_failure": code}
        if give_up:
            values["attempts"] = max(self.attempts, max_attempts_of(type(self)))
        write_versioned(self, values)

    def remove(self) -> None:
        """Delete the row, if it is unchanged since it was read."""
        using = self._state.db or router.db_for_write(type(self), instance=self)
        mine = type(self)._base_manager.using(using).filter(pk=self.pk, version=self.version)
        if Collector(using, origin=self).can_fast_delete(mine):
            deleted, _rows = mine.delete()  # one DELETE ... WHERE pk AND version
        else:
            # Cascades and delete signals make Django read the row before it deletes it by pk: lock it in that
            # read, so the version checked there still holds when the DELETE comes.
            with transaction.atomic(using=using):
                deleted, _rows = mine.select_for_update().delete()
        if not deleted:
            raise self._conflict()

    def _conflict(self) -> VersionConflict:
        return VersionConflict(
            f"{self._meta.label} {self.pk} changed since it was read (version {self.version}): nothing was written. "
            "Re-read it with select_for_update() inside ctx.transaction() and decide again."
        )


def write_versioned(row: QueueModel, values: dict[str, object]) -> None:
    """Write ``values`` and the next version to ``row`` in one UPDATE conditioned on the version it was read
    with, and mirror them on the object; ``VersionConflict`` if it changed since (nothing written)."""
    using = row._state.db or router.db_for_write(type(row), instance=row)
    if not update_row(type(row), using, row.pk, row.version, values):
        raise row._conflict()
    for name, value in values.items():
        setattr(row, name, value)
    row.version += 1


@receiver(class_prepared)
def _add_queue_indexes(sender: type[models.Model], **kwargs: object) -> None:
    """Give every concrete queue model its claim index and its dead-row index, both partial.

    The claim index, on ``(due, pk)`` (claim's order: oldest due, then pk), holds waiting rows only: done rows
    (due null) are most of a busy table and dead ones can pile up by the million, and the claim walks this
    index, so neither may be in it. The dead-row index, on ``pk``, holds dead rows only, so the overview counts
    them and the admin lists them without reading the table. Both predicates are the states' own ``Q``
    (``_queuestate``), with the model's ``max_attempts`` in them: changing it makes a migration. A backend
    without partial indexes (MariaDB, MySQL) builds both whole; a model that declares an index of either
    name keeps its own.
    """
    if not issubclass(sender, QueueModel) or sender._meta.abstract or sender._meta.proxy:
        return
    pk = sender._meta.pk.name
    wanted = [
        _named_index(sender, ["due", pk], state_q(sender, "waiting")),
        _named_index(sender, [pk], state_q(sender, "dead")),
    ]
    declared = {index.name for index in sender._meta.indexes}
    added = [index for index in wanted if index.name not in declared]
    if added:
        _declare_indexes(sender, added)


def _declare_indexes(model: type[models.Model], indexes: list[models.Index]) -> None:
    """Give ``model`` ``indexes`` besides its own, as if its ``Meta`` had declared them all.

    The one write to Django's internals in the models: Django has no public way to add an index to a model
    class once it is made, and the migrations read a model's ``_meta.indexes`` only when its ``Meta`` declared
    ``indexes`` (``_meta.original_attrs``), so both are written. A Django release that reads them otherwise
    makes ``makemigrations --check`` find a change: tests/test_django_seams.py, on each Django the suite runs
    (5.2 and 6.x).
    """
    model._meta.indexes = [*model._meta.indexes, *indexes]
    model._meta.original_attrs["indexes"] = model._meta.indexes


def _named_index(model: type[models.Model], fields: list[str], condition: models.Q) -> models.Index:
    """Return an index on ``fields`` with Django's own short, stable name for them, and ``condition``."""
    named = models.Index(fields=fields)
    named.set_name_with_model(model)
    return models.Index(fields=fields, name=named.name, condition=condition)
