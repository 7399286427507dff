"""The write guard's two rules: writes inside ctx.transaction(), and only to tables the job holds."""

import pytest
from django.db import connection
from django.test import override_settings

from fabrika_django.exceptions import CapabilityRefused
from fabrika_django.guards import is_write, required_permissions
from fabrika_django.models import Attempt, KickRequest
from fabrika_django.testing import run_job
from testproject.lab.models import Item, Mark

from .jobs_helpers import temporary_job

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "sql, writes",
    [
        ('INSERT INTO "lab_mark" ("job") VALUES (%s)', True),
        ('  update "lab_mark" SET "note" = %s', True),
        ('DELETE FROM "lab_mark" WHERE "id" = %s', True),
        ('WITH k AS (UPDATE "x" SET a = 1 RETURNING 1) SELECT 1', True),
        ('SELECT "lab_mark"."id" FROM "lab_mark" FOR UPDATE', False),
        ('WITH p AS (SELECT id FROM "x" FOR UPDATE SKIP LOCKED) SELECT * FROM p', False),
        ("SAVEPOINT s1", False),
        ("", False),
        ('/* x */ UPDATE "lab_item" SET "n" = 1', True),
        ('-- a note\nDELETE FROM "lab_item"', True),
        ('SELECT 1; UPDATE "lab_item" SET "n" = 1', True),
        ("(SELECT 1) UNION (SELECT 2)", False),
        ('SELECT 1 FROM "lab_item" FOR NO KEY UPDATE SKIP LOCKED', False),
        ('WITH k AS (SELECT 1) SELECT * FROM "lab_mark" WHERE "note" = \'update x set y\'', False),
        ("DO $$ BEGIN UPDATE lab_item SET n = 1; END $$", True),
        ('SELECT REPLACE ("note", %s, %s) AS "delete" FROM "lab_mark"', False),
        ("EXPLAIN ANALYZE DELETE FROM lab_mark", True),
        ("/*!50000 UPDATE lab_item SET n = 1 */", True),
        ("SELECT 1 /*! ; DELETE FROM lab_item */", True),
        ("/*M!100100 DELETE FROM lab_item */", True),
        ("/* ! not executable: UPDATE lab_item SET n = 1 */ SELECT 1", False),
        ("SELECT * INTO newtab FROM lab_item", True),
        ("SELECT n INTO @n FROM lab_item", True),
    ],
)
def test_is_write_tells_writes_from_reads(sql, writes):
    assert is_write(sql) is writes


@pytest.mark.parametrize(
    "sql, needed",
    [
        ('INSERT INTO "lab_mark" ("job") VALUES (%s)', ("lab.add_mark",)),
        ('UPDATE "lab_item" SET "n" = 1', ("lab.change_item",)),
        ("DELETE FROM `lab_item` WHERE 1", ("lab.delete_item",)),
        ('UPDATE "fabrika_django_lease" SET "expires" = 1', ()),
        ('UPDATE ONLY "lab_item" SET "n" = 1', ("lab.change_item",)),
        ("DELETE FROM ONLY lab_item", ("lab.delete_item",)),
        ('UPDATE "public"."lab_item" SET "n" = 1', ("lab.change_item",)),
        ("UPDATE `fabrika`.`lab_item` SET `n` = 1", ("lab.change_item",)),
        ('/* x */ UPDATE "lab_item" SET "n" = 1', ("lab.change_item",)),
        ('SELECT 1; DELETE FROM "lab_item"', ("lab.delete_item",)),
        (
            'WITH k AS (DELETE FROM "lab_item" RETURNING 1) INSERT INTO "lab_mark" ("job") SELECT 1 FROM k',
            ("lab.delete_item", "lab.add_mark"),
        ),
        ('INSERT INTO "lab_mark" ("job") VALUES (%s) ON CONFLICT ("id") DO UPDATE SET "job" = 1', ("lab.add_mark",)),
        ("INSERT INTO lab_mark (job) VALUES (1) ON DUPLICATE KEY UPDATE job = 1", ("lab.add_mark",)),
        ("INSERT OR REPLACE INTO lab_mark (job) VALUES (1)", ("lab.add_mark",)),
        ("TRUNCATE lab_item", ("lab.delete_item",)),
        ('PREPARE p (int) AS UPDATE "lab_item" SET "n" = $1', ("lab.change_item",)),
    ],
)
def test_required_permissions_name_each_model_and_action(sql, needed):
    assert required_permissions(sql) == needed


@pytest.mark.parametrize(
    "sql, needed",
    [
        ("/*!50000 UPDATE `lab_item` SET `n` = 1 */", ("lab.change_item",)),
        ("SELECT 1; /*! DELETE FROM lab_item */", ("lab.delete_item",)),
        ("/*M! INSERT INTO lab_mark (job) VALUES ('x') */", ("lab.add_mark",)),
    ],
)
def test_mysqls_executable_comments_are_read_as_the_sql_mysql_runs(sql, needed):
    assert required_permissions(sql) == needed


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * INTO newtab FROM lab_item",
        "SELECT * INTO TEMP newtab FROM lab_item",
        'UPDATE U&"lab_item" SET "n" = 1',
        'UPDATE U&"l\\0061b_item" SET "n" = 1',
        "UPDATE lab_item JOIN lab_mark ON 1 = 1 SET lab_mark.note = 'x'",
        "UPDATE lab_item i INNER JOIN lab_mark m ON 1 = 1 SET m.note = 'x'",
        "UPDATE lab_mark, lab_item SET lab_item.n = 1",
        "DELETE lab_mark, lab_item FROM lab_mark JOIN lab_item",
    ],
)
def test_a_write_whose_table_the_guard_cannot_be_sure_of_is_an_unknown_write(sql):
    assert is_write(sql)
    with pytest.raises(ValueError, match="cannot tell which table"):
        required_permissions(sql)


@pytest.mark.parametrize(
    "sql, needed",
    [
        ('UPDATE "lab_item" SET "n" = 1 FROM "lab_mark", "auth_user" WHERE 1 = 1', ("lab.change_item",)),
        ('DELETE FROM "lab_item" USING "lab_mark", "auth_user"', ("lab.delete_item",)),
        ("INSERT INTO lab_mark (job) SELECT 'x' FROM lab_item", ("lab.add_mark",)),
    ],
)
def test_postgresqls_read_only_tables_of_a_write_are_not_more_tables_to_write(sql, needed):
    assert required_permissions(sql) == needed


def _writer(ctx):
    with ctx.transaction():
        Mark.objects.create(job="writer", note="hello")


def test_a_job_that_declares_the_permission_may_write():
    with temporary_job(_writer, name="writer", actions=["lab.add_mark"]):
        assert run_job("writer").ok
    assert Mark.objects.count() == 1


def test_a_write_without_the_declared_permission_is_refused_naming_it():
    caught = []

    def writer(ctx):
        try:
            _writer(ctx)
        except CapabilityRefused as exc:
            caught.append((exc.missing, str(exc)))
            raise

    with temporary_job(writer, actions=["lab.change_mark"]):
        result = run_job("writer")
    assert result.failure == "capability_refused"
    assert Attempt.objects.get(job="writer").outcome == "capability_refused"
    assert caught == [
        (
            "lab.add_mark",
            "Job 'writer' needs the permission 'lab.add_mark' for this write: "
            "add it to @cron(..., actions=[..., 'lab.add_mark']).",
        )
    ]
    assert not Mark.objects.exists()


def test_claim_needs_the_tables_change_permission():
    Item.objects.create()

    def claimer(ctx):
        Item.objects.claim(limit=1)

    with temporary_job(claimer, actions=["lab.add_item"]):
        assert run_job("claimer").failure == "capability_refused"
    assert Item.objects.get().attempts == 0
    with temporary_job(claimer, actions=["lab.change_item"]):
        assert run_job("claimer").ok
    assert Item.objects.get().attempts == 1


def test_without_actions_a_job_holds_everything_unless_the_setting_enforces_them():
    with temporary_job(_writer, name="writer"):
        assert run_job("writer").ok
        with override_settings(FABRIKA={"ENFORCE_ACTIONS": True}):
            assert run_job("writer").failure == "capability_refused"
    assert Mark.objects.count() == 1


def _raw(sql, *, in_transaction):
    def raw_writer(ctx):
        if in_transaction:
            with ctx.transaction(), connection.cursor() as cursor:
                cursor.execute(sql)
        else:
            with connection.cursor() as cursor:
                cursor.execute(sql)

    return raw_writer


@pytest.mark.parametrize(
    "sql",
    ['/* x */ UPDATE "lab_item" SET "attempts" = 1', 'SELECT 1; UPDATE "lab_item" SET "attempts" = 1'],
)
def test_a_write_hidden_behind_a_comment_or_a_read_is_still_refused_outside_the_transaction(sql):
    Item.objects.create()
    with temporary_job(_raw(sql, in_transaction=False), name="raw_writer"):
        assert run_job("raw_writer").failure == "write_outside_transaction"
    assert Item.objects.get().attempts == 0


@pytest.mark.parametrize(
    "sql",
    [
        'UPDATE ONLY "lab_item" SET "attempts" = 1',
        '/* x */ UPDATE "lab_item" SET "attempts" = 1',
        "DO $$ BEGIN UPDATE lab_item SET attempts = 1; END $$",
        'UPDATE U&"lab_item" SET "attempts" = 1',
    ],
)
def test_a_write_the_job_holds_no_permission_for_is_refused_however_it_is_spelled(sql):
    Item.objects.create()
    with temporary_job(_raw(sql, in_transaction=True), name="raw_writer", actions=["lab.add_mark"]):
        assert run_job("raw_writer").failure == "capability_refused"
    assert Item.objects.get().attempts == 0


@pytest.mark.django_db(transaction=True)
def test_a_job_held_to_its_actions_still_kicks_through_the_frameworks_prepared_statement():
    # On PostgreSQL a kick outside a transaction is an EXECUTE of a prepared statement: unreadable to the
    # guard, yet the framework's own, on its own table.
    def kicker(ctx):
        ctx.kick("lab_stamp")

    with temporary_job(kicker, actions=["lab.add_mark"], kicks=["lab_stamp"]):
        for _ in range(2):  # the first kick prepares the statement, the second only executes it
            KickRequest.objects.filter(job="lab_stamp").delete()
            assert run_job("kicker").ok
            assert KickRequest.objects.filter(job="lab_stamp").exists()


def test_execute_of_a_prepared_statement_is_refused_to_a_job_held_to_its_actions():
    with temporary_job(_raw("EXECUTE p(1)", in_transaction=True), name="raw_writer", actions=["lab.add_mark"]):
        assert run_job("raw_writer").failure == "capability_refused"


def _refused_write(write):
    """Run ``write(cursor)`` in ctx.transaction() of a job holding only a read permission; answer what was missing."""
    from django.db import connection

    caught = []

    def writer(ctx):
        try:
            with ctx.transaction(), connection.cursor() as cursor:
                write(cursor)
        except CapabilityRefused as exc:
            caught.append(exc.missing)

    with temporary_job(writer, name="writer", actions=["lab.view_mark"]):
        assert run_job("writer").ok
    return caught


def _upsert(connection):
    # MySQL and MariaDB take no conflict target (ON DUPLICATE KEY UPDATE); the others need one.
    target = ["id"] if connection.features.supports_update_conflicts_with_target else None
    Mark.objects.bulk_create(
        [Mark(pk=1, job="x", note="y")], update_conflicts=True, unique_fields=target, update_fields=["note"]
    )


@pytest.mark.parametrize(
    "write, needed",
    [
        (lambda cursor: Mark.objects.bulk_create([Mark(job="x", note="y")], ignore_conflicts=True), "lab.add_mark"),
        (lambda cursor: _upsert(cursor.db), "lab.add_mark"),
        (lambda cursor: Mark.objects.filter(job="x").update(note="z"), "lab.change_mark"),
        (lambda cursor: Mark.objects.filter(job="x").delete(), "lab.delete_mark"),
    ],
    ids=["ignore-conflicts", "upsert", "update", "delete"],
)
def test_the_orms_writes_as_each_database_spells_them_need_their_permission(write, needed):
    assert _refused_write(write) == [needed]
    assert not Mark.objects.exists()


@pytest.mark.mysql
@pytest.mark.parametrize(
    "sql, needed",
    [
        ("INSERT IGNORE INTO `lab_mark` (`job`, `note`, `pid`, `attempt`, `at`) VALUES ('x', 'y', 0, 0, NOW())", "add"),
        (
            "INSERT LOW_PRIORITY INTO `lab_mark` (`job`, `note`, `pid`, `attempt`, `at`) "
            "VALUES ('x', 'y', 0, 0, NOW())",
            "add",
        ),
        (
            "REPLACE INTO `lab_mark` (`id`, `job`, `note`, `pid`, `attempt`, `at`) VALUES (1, 'x', 'y', 0, 0, NOW())",
            "add",
        ),
        ("UPDATE LOW_PRIORITY IGNORE `lab_mark` SET `note` = 'z'", "change"),
        ("DELETE QUICK FROM `lab_mark` WHERE `id` = 0", "delete"),
        ("DELETE `lab_mark` FROM `lab_mark` WHERE `lab_mark`.`id` = 0", "delete"),
    ],
)
def test_mysqls_own_write_syntax_and_backtick_quoting_need_their_permission(sql, needed):
    assert _refused_write(lambda cursor: cursor.execute(sql)) == [f"lab.{needed}_mark"]
    assert not Mark.objects.exists()


@pytest.mark.mysql
@pytest.mark.parametrize(
    "sql",
    [
        "/*!50000 UPDATE `lab_item` SET `attempts` = 1 */",
        "SELECT 1 /*! ; UPDATE `lab_item` SET `attempts` = 1 */",
        "UPDATE `lab_item` JOIN `lab_mark` ON 1 = 1 SET `lab_item`.`attempts` = 1",
    ],
)
def test_on_mysql_an_executable_comment_or_a_join_writes_and_is_refused(sql):
    Item.objects.create()
    with temporary_job(_raw(sql, in_transaction=False), name="raw_writer"):
        assert run_job("raw_writer").failure == "write_outside_transaction"
    with temporary_job(_raw(sql, in_transaction=True), name="raw_writer", actions=["lab.add_mark"]):
        assert run_job("raw_writer").failure == "capability_refused"
    assert Item.objects.get().attempts == 0


@pytest.mark.postgresql
def test_on_postgresql_select_into_makes_a_table_and_is_refused():
    with temporary_job(
        _raw("SELECT * INTO fabrika_test_newtab FROM lab_item", in_transaction=False), name="raw_writer"
    ):
        assert run_job("raw_writer").failure == "write_outside_transaction"
    with temporary_job(
        _raw("SELECT * INTO fabrika_test_newtab FROM lab_item", in_transaction=True),
        name="raw_writer",
        actions=["lab.view_item"],
    ):
        assert run_job("raw_writer").failure == "capability_refused"
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('fabrika_test_newtab')")
        assert cursor.fetchone() == (None,)
