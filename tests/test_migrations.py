"""The squashed migrations: a new database runs the squashed one (then any made after it), a database at any of
the migrations it replaces runs the rest of them, and both end with the same tables, columns, indexes and
constraints.

Each test takes an app back to zero and forward again on the test database, with Django's ``MigrationExecutor``.
"""

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

#: (app, its squashed migration, a migration it replaces that a database may still be at)
SQUASHED = [
    ("fabrika_django", "0001_squashed_0009_kickrequest", "0004_claimer"),
    ("outbox", "0001_squashed_0004_claim_index_over_waiting_rows", "0002_unsubscribe_url"),
    ("lab", "0001_squashed_0004_claim_index_over_waiting_rows", "0002_document"),
    ("reminders", "0001_squashed_0002_claim_index_over_waiting_rows", "0001_initial"),
    ("reports", "0001_squashed_0002_claim_index_over_waiting_rows", "0001_initial"),
]


def _executor(*, squashed: bool = True) -> MigrationExecutor:
    """An executor over the test database; ``squashed=False`` sees the replaced migrations as separate nodes,
    the way a database that is partway through them needs them."""
    executor = MigrationExecutor(connection)
    if not squashed:
        executor.loader = MigrationLoader(connection, replace_migrations=False)
    return executor


def _migrate(app: str, name: str | None, *, squashed: bool = True) -> None:
    executor = _executor(squashed=squashed)
    executor.migrate([(app, name)])


def _latest(app: str) -> None:
    executor = _executor()
    executor.migrate([node for node in executor.loader.graph.leaf_nodes() if node[0] == app])


def _later(app: str, squashed: str) -> list[str]:
    """The app's migrations made after its squashed one (neither it nor one it replaces), in order."""
    loader = _executor().loader
    replaced = {name for _, name in loader.disk_migrations[app, squashed].replaces}
    return sorted(name for label, name in loader.disk_migrations if label == app and name not in {squashed, *replaced})


def _recorded(app: str) -> set[str]:
    return {name for label, name in _executor().recorder.applied_migrations() if label == app}


def _schema(
    app: str, made_by_squashed: str | None = None
) -> dict[str, tuple[list[tuple[str, bool]], dict[str, tuple]]]:
    """Each table of the app: its columns (name, null) and its constraints and indexes by name; with
    ``made_by_squashed``, only the tables that squashed migration makes."""
    introspection = connection.introspection
    schema = {}
    made = None
    if made_by_squashed is not None:
        operations = _executor().loader.get_migration(app, made_by_squashed).operations
        made = {operation.name.lower() for operation in operations if type(operation).__name__ == "CreateModel"}
    with connection.cursor() as cursor:
        for model in apps.get_app_config(app).get_models():
            if model._meta.proxy or not model._meta.managed:
                continue
            if made is not None and model._meta.model_name not in made:
                continue
            table = model._meta.db_table
            columns = [
                (column.name, bool(column.null_ok)) for column in introspection.get_table_description(cursor, table)
            ]
            constraints = {
                name: (
                    tuple(found["columns"] or ()),
                    found["primary_key"],
                    found["unique"],
                    found["index"],
                    bool(found["check"]),
                    found["foreign_key"],
                )
                for name, found in introspection.get_constraints(cursor, table).items()
            }
            schema[table] = (columns, constraints)
    return schema


@pytest.fixture(params=SQUASHED, ids=[app for app, _, _ in SQUASHED])
def squashed_app(request):
    app, squashed, middle = request.param
    if not apps.is_installed(f"testproject.{app}") and app != "fabrika_django":
        pytest.skip(f"{app} is not installed")
    yield app, squashed, middle
    _latest(app)  # whatever the test left, the next test finds every table


@pytest.mark.django_db(transaction=True)
def test_a_new_database_runs_only_the_squashed_migration_then_those_made_after_it(squashed_app):
    app, squashed, _ = squashed_app
    _migrate(app, None)
    assert _recorded(app) == set()
    executor = _executor()
    targets = [node for node in executor.loader.graph.leaf_nodes() if node[0] == app]
    plan = [(migration.app_label, migration.name) for migration, _ in executor.migration_plan(targets)]
    later = _later(app, squashed)
    assert plan == [(app, squashed), *((app, name) for name in later)]
    _latest(app)
    replaced = {name for _, name in executor.loader.get_migration(app, squashed).replaces}
    assert _recorded(app) == {squashed, *replaced, *later}


@pytest.mark.django_db(transaction=True)
def test_the_squashed_migration_makes_the_tables_the_replaced_ones_make(squashed_app):
    app, squashed, _ = squashed_app
    _migrate(app, None)
    _migrate(app, squashed)
    through_squashed = _schema(app, made_by_squashed=squashed)
    replaced = _executor().loader.get_migration(app, squashed).replaces
    _migrate(app, None)
    executor = _executor(squashed=False)
    assert [migration.name for migration, _ in executor.migration_plan([replaced[-1]])] == [n for _, n in replaced]
    executor.migrate([replaced[-1]])
    assert _schema(app, made_by_squashed=squashed) == through_squashed
    assert through_squashed  # a schema with no table would compare equal to anything


@pytest.mark.django_db(transaction=True)
def test_a_database_at_a_replaced_migration_migrates_to_the_latest(squashed_app):
    app, squashed, middle = squashed_app
    _migrate(app, None)
    _latest(app)
    through_squashed = _schema(app)
    _migrate(app, None)
    _migrate(app, middle, squashed=False)
    replaced = [name for _, name in _executor(squashed=False).loader.get_migration(app, squashed).replaces]
    assert _recorded(app) == set(replaced[: replaced.index(middle) + 1])
    executor = _executor()  # as `migrate` sees it: the replaced migrations, partly applied
    targets = [node for node in executor.loader.graph.leaf_nodes() if node[0] == app]
    plan = [migration.name for migration, _ in executor.migration_plan(targets)]
    later = _later(app, squashed)
    assert plan == replaced[replaced.index(middle) + 1 :] + later
    _latest(app)
    assert _recorded(app) == {squashed, *replaced, *later}
    assert _schema(app) == through_squashed
