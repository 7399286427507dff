"""ctx.row(row, step=...): a row's exception is recorded on the row and suppressed; the attempt's end is not."""

import logging
from datetime import timedelta

import pytest

from fabrika_django import EmailDeliveryError
from fabrika_django.testing import run_job
from testproject.lab.models import Item

from .jobs_helpers import temporary_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def items(fabrika_clock):
    due = fabrika_clock.now - timedelta(seconds=1)
    return Item.objects.bulk_create([Item(n=n, due=due) for n in range(3)])


def _each_row(work, **options):
    """A job that claims every due Item and runs ``work(ctx, row)`` inside ``ctx.row(row, step="work")``."""

    def row_job(ctx):
        for row in Item.objects.claim(limit=50):
            with ctx.row(row, step="work", **options):
                work(ctx, row)

    return row_job


def _finish(ctx, row):
    with ctx.transaction():
        row.finish()


def _states():
    return [(row.n, row.attempts, row.due is None, row.last_failure) for row in Item.objects.order_by("n")]


def test_a_failing_row_keeps_its_step_and_the_next_rows_are_done(items, caplog):
    def work(ctx, row):
        if row.n == 1:
            raise ValueError("ada@example.org is not reachable")
        _finish(ctx, row)

    caplog.set_level(logging.WARNING, logger="fabrika_django")
    with temporary_job(_each_row(work)):
        result = run_job("row_job")
    assert result.ok
    assert _states() == [(0, 1, True, ""), (1, 1, False, "work"), (2, 1, True, "")]
    assert Item.objects.get(n=1).state == "waiting"  # due again after the claim's backoff
    logged = [record.getMessage() for record in caplog.records if "Row failed" in record.getMessage()]
    assert len(logged) == 1
    assert f"row={items[1].pk} step=work error=ValueError dead=0" in logged[0]
    assert "ada@example.org" not in caplog.text  # the id, the step and the class; never the message


def test_a_row_whose_transaction_rolled_back_after_its_finish_still_records_its_step(items):
    def work(ctx, row):
        with ctx.transaction():
            row.finish()  # the object now says done, with the next version: the rollback undoes both
            if row.n == 1:
                raise RuntimeError("after the finish, before the commit")

    with temporary_job(_each_row(work)):
        assert run_job("row_job").ok
    assert _states() == [(0, 1, True, ""), (1, 1, False, "work"), (2, 1, True, "")]


def test_a_row_that_failed_after_its_finish_committed_is_left_done(items, caplog):
    def work(ctx, row):
        _finish(ctx, row)
        if row.n == 1:
            raise RuntimeError("after the commit")

    with temporary_job(_each_row(work)):
        assert run_job("row_job").ok
    assert _states() == [(0, 1, True, ""), (1, 1, True, ""), (2, 1, True, "")]
    assert "changed since its claim" in caplog.text


def test_give_up_makes_the_failing_row_dead_at_once(items):
    def work(ctx, row):
        if row.n == 1:
            raise ValueError("no retry can fix this")
        _finish(ctx, row)

    with temporary_job(_each_row(work, give_up=True)):
        assert run_job("row_job").ok
    dead = Item.objects.get(n=1)
    assert (dead.state, dead.last_failure) == ("dead", "work")


@pytest.mark.parametrize(
    ("code", "outcome", "state"),
    [
        ("recipient_refused", "not_sent", "dead"),  # may_retry refuses: dead at once
        ("transport_deferred", "not_sent", "waiting"),  # may go again: the backoff brings it back
    ],
)
def test_a_mail_error_is_dead_at_once_only_when_may_retry_refuses_it(items, code, outcome, state):
    def work(ctx, row):
        if row.n == 1:
            raise EmailDeliveryError("refused", code=code, outcome=outcome)
        _finish(ctx, row)

    def mail_job(ctx):
        _each_row(work)(ctx)

    with temporary_job(mail_job, mailer="installation"):
        assert run_job("mail_job").ok
    assert Item.objects.get(n=1).state == state


def test_the_attempts_abort_propagates_and_records_nothing(items):
    def work(ctx, row):
        ctx.signal.abort("shutdown")
        ctx.signal.throw_if_aborted()

    with temporary_job(_each_row(work)):
        result = run_job("row_job")
    assert result.outcome == "shutdown"
    assert list(Item.objects.values_list("last_failure", flat=True).distinct()) == [""]


def test_an_exception_after_the_abort_propagates_and_records_nothing(items):
    def work(ctx, row):
        ctx.signal.abort("lease_lost")
        raise ValueError("anything, once the attempt is over")

    with temporary_job(_each_row(work)):
        result = run_job("row_job")
    assert result.outcome == "lease_lost"
    assert list(Item.objects.values_list("last_failure", flat=True).distinct()) == [""]


def test_a_broken_framework_rule_ends_the_attempt_with_its_code(items):
    def work(ctx, row):
        Item.objects.filter(pk=row.pk).update(n=99)  # a write outside ctx.transaction()

    with temporary_job(_each_row(work)):
        result = run_job("row_job")
    assert result.outcome == "write_outside_transaction"
    assert list(Item.objects.values_list("last_failure", flat=True).distinct()) == [""]


@pytest.mark.parametrize(
    ("step", "inside", "message"),
    [
        ("Send failed: ada@example.org", False, "needs a fixed code"),
        ("work", True, "outside ctx.transaction()"),
    ],
)
def test_bad_use_is_refused_with_what_to_do(items, step, inside, message):
    seen = []

    def misuse(ctx):
        row = Item.objects.claim(limit=1)[0]
        try:
            if inside:
                with ctx.transaction(), ctx.row(row, step=step):
                    pass
            else:
                with ctx.row(row, step=step):
                    pass
        except (ValueError, RuntimeError) as error:
            seen.append(str(error))

    with temporary_job(misuse):
        assert run_job("misuse").ok
    assert len(seen) == 1 and message in seen[0] and "ada@" not in seen[0]
