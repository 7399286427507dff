"""The code's layout rules that a reader relies on, checked over the package's source.

- Every statement on ``Job``, ``Lease`` and ``Attempt`` rows is written in the run machinery (``_runs/``) or the
  SQL home (``_sql/``): no manager of those models, no table name of theirs, anywhere else.
- A queue row's states are defined once, in ``_queuestate.py``: no other module spells a state's condition.
"""

import re
from pathlib import Path

import fabrika_django

PACKAGE = Path(fabrika_django.__file__).parent

_JOB_STATE_SQL = re.compile(
    r"\b(Job|Lease|Attempt|Overview)\.(objects|_default_manager|_base_manager)\b"
    r"|\b(Job|Lease|Attempt)\._meta\.db_table\b"
    r"|\bfabrika_django_(job|lease|attempt)\b"
)
_QUEUE_STATE_PREDICATE = re.compile(
    r"\b(attempts|due)__(lt|lte|gt|gte|isnull)\b"
    r"|\battempts\b[^\n]*(<|>=)[^\n]*max_attempts|\battempts\}?\s*(<|>=)\s"
    r"|\bIS (NOT )?NULL\b[^\n]*\b(due|attempts)\b|\b(due|attempts)\b[^\n]*\bIS (NOT )?NULL\b"
    r"|\bdue\b\s*(<=|<)\s*(now|%s)"
)


def _sources(*allowed: str) -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        homes = ("migrations/", *(home for home in allowed if home.endswith("/")))
        if relative in allowed or relative.startswith(homes):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found.append((relative, number, line))
    return found


def _hits(pattern: re.Pattern[str], *allowed: str) -> list[str]:
    return [f"{path}:{number}: {line.strip()}" for path, number, line in _sources(*allowed) if pattern.search(line)]


def test_job_lease_and_attempt_rows_are_read_and_written_only_in_the_job_state_module():
    assert _hits(_JOB_STATE_SQL, "_runs/", "_sql/") == []


def test_a_queue_rows_state_is_defined_only_in_its_one_home():
    assert _hits(_QUEUE_STATE_PREDICATE, "_queuestate.py") == []


def test_the_checks_find_what_they_look_for():
    # A check that cannot fail is a defect: each pattern matches what it forbids.
    assert _JOB_STATE_SQL.search("Lease.objects.filter(job=name).update(token=None)")
    assert _JOB_STATE_SQL.search("table = quote(Attempt._meta.db_table)")
    assert _JOB_STATE_SQL.search('"UPDATE fabrika_django_job SET pending_since = NULL"')
    assert _QUEUE_STATE_PREDICATE.search("Q(due__isnull=False, attempts__lt=limit)")
    assert _QUEUE_STATE_PREDICATE.search('f"COUNT(CASE WHEN {attempts} >= %s THEN 1 END)"')
    assert _QUEUE_STATE_PREDICATE.search('"WHERE due IS NOT NULL"')
    assert _QUEUE_STATE_PREDICATE.search("row.attempts >= max_attempts_of(type(row))")
    assert _QUEUE_STATE_PREDICATE.search("row.due <= now")
