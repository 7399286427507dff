"""The marks a kick leaves in the transaction that wrote it: one kick row per job and transaction is enough, and
the test kit hears of each kick once it commits.

Imports no model: ``kicks`` (imported with the package root) takes these at its own import.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction

#: Lists the test kit appends kicked job names to (fabrika_django.testing's ``fabrika_kicks``).
recorders: list[list[str]] = []


def kicked_in_transaction(name: str, alias: str) -> bool:
    """Whether the open transaction of ``alias`` holds a kick of ``name`` already (one row is enough).

    Each kick leaves a marker among the transaction's on-commit callbacks, which Django drops with a
    savepoint rolled back: a marker found means a kick row that commits with this transaction.

    Read through ``connection.run_on_commit``, which Django does not document: neither 5.2 nor 6.1 offers a
    documented way to see a transaction's callbacks (or to hear of a savepoint's rollback), and a record of our
    own could not tell which savepoint dropped its kick row. Each entry holds the callback second on 5.2 and 6.1;
    tests/test_django_seams.py (and tests/test_tasks.py), which bin/test runs on Django 6 too, fail if that changes.
    """
    connection = connections[alias]
    if not connection.in_atomic_block:
        return False
    # Each entry is (savepoint ids, callback, robust) (django-stubs knows an older two-item form).
    callbacks: list[Any] = list(connection.run_on_commit)
    return any(isinstance(entry[1], Kicked) and entry[1].name == name for entry in callbacks)


def note_kick(name: str, alias: str) -> None:
    """Note a kick written in the current transaction of ``alias`` (``add_kick``, or an insert that holds one)."""
    if connections[alias].in_atomic_block:
        transaction.on_commit(Kicked(name), using=alias)
    else:
        Kicked(name)()


class Kicked:
    """On commit: the kick of ``name`` went out (the test kit's recorders hear of it). Also the marker that
    ``kicked_in_transaction`` looks for."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> None:
        for recorder in recorders:
            recorder.append(self.name)
