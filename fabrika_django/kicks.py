"""kick(): ask for a run of a job once the current transaction commits."""

from __future__ import annotations


def kick(name: str, *, using: str | None = None) -> None:
    """Ask for a run of ``name`` once the current transaction commits (at once outside one)."""
    raise NotImplementedError
