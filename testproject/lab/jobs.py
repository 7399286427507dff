"""Jobs the tests run in other processes (``manage.py fabrika_job run``, workers). Kick-only but lab_yearly."""

import os
import time
from datetime import timedelta

from django.db.models import F

from fabrika_django import EmailDeliveryError, cron

from .models import Effect, Item, Mark, Taken

try:
    from django.tasks.signals import task_enqueued
except ImportError:  # Django 5.2: the backport
    from django_tasks.signals import task_enqueued


def _mark(ctx, note):
    with ctx.transaction():
        Mark.objects.create(job=ctx.job.name, note=note, pid=os.getpid(), attempt=ctx.attempt)


@cron(None, timeout=timedelta(seconds=30))
def lab_slow(ctx):
    """Marks its start, works two seconds (or until the file LAB_SLOW_UNTIL names exists), marks its end."""
    _mark(ctx, "start")
    until = os.environ.get("LAB_SLOW_UNTIL")
    if until:
        deadline = time.monotonic() + 25
        while not os.path.exists(until) and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        time.sleep(float(os.environ.get("LAB_SLOW_SECONDS", "2")))
    _mark(ctx, "end")


@cron(None, retries=1, timeout=timedelta(seconds=2))
def lab_sleepy(ctx):
    """First attempt sleeps past its timeout without looking at ctx.signal, then tries to write."""
    _mark(ctx, "start")
    if ctx.attempt == 1:
        time.sleep(4)
        _mark(ctx, "late")
    else:
        _mark(ctx, "retry")


@cron(None, retries=3, timeout=timedelta(seconds=120))
def lab_items(ctx):
    """Claims and finishes Item rows until none is due; each finish counts itself in ``writes``."""
    pause = float(os.environ.get("LAB_ITEM_SECONDS", "0"))
    while rows := Item.objects.claim(limit=50):
        for row in rows:
            ctx.signal.throw_if_aborted()
            with ctx.transaction():
                Item.objects.filter(pk=row.pk).update(writes=F("writes") + 1)
                row.finish()
            if pause:
                time.sleep(pause)


@cron(None, timeout=timedelta(seconds=120))
def lab_patient(ctx):
    """Marks its start, then waits for its signal; writes the abort reason to LAB_SIGNAL_FILE."""
    _mark(ctx, "start")
    ctx.signal.wait(float(os.environ.get("LAB_PATIENT_SECONDS", "60")))
    target = os.environ.get("LAB_SIGNAL_FILE")
    if target:
        with open(target, "a") as out:
            out.write(f"{os.getpid()} {ctx.signal.reason}\n")


@cron("0 0 1 1 *", timeout=timedelta(seconds=30))
def lab_yearly(ctx):
    """Scheduled once a year: tests move its next fire to make it due."""
    _mark(ctx, ctx.trigger)


@cron(None, timeout=timedelta(seconds=30))
def lab_stamp(ctx):
    """Marks the moment its handler starts (time.time()), for the kick latency benchmark."""
    started = time.time()
    with ctx.transaction():
        Mark.objects.create(job=ctx.job.name, note=f"{started:.6f}", pid=os.getpid(), attempt=ctx.attempt)


@cron(None, mailer="installation", timeout=timedelta(seconds=30))
def lab_mail(ctx):
    """Sends one fixed message under the key ``lab-mail-1``; marks "accepted" or the refusal's code and outcome."""
    try:
        ctx.mail.send(to="lab@example.org", subject="Lab", text="Lab message.", idempotency_key="lab-mail-1")
    except EmailDeliveryError as error:
        _mark(ctx, f"{error.code}:{error.outcome}:{ctx.mail.may_retry(error)}")
    else:
        _mark(ctx, "accepted")


@cron(None, timeout=timedelta(seconds=120))
def lab_reader(ctx):
    """Marks its start, then reads the Mark table until aborted: a cut connection makes it raise."""
    _mark(ctx, "start")
    while not ctx.signal.wait(0.05):
        Mark.objects.filter(note="go").exists()


@cron(None, retries=1, timeout=timedelta(seconds=120))
def lab_hold(ctx):
    """Marks its start inside ctx.transaction(); with LAB_HOLD_FILE set it writes its pid there and stays inside."""
    target = os.environ.get("LAB_HOLD_FILE")
    with ctx.transaction():
        Mark.objects.create(job=ctx.job.name, note="start", pid=os.getpid(), attempt=ctx.attempt)
        if target:
            with open(target, "a") as out:
                out.write(f"{os.getpid()}\n")
            ctx.signal.wait(float(os.environ.get("LAB_HOLD_SECONDS", "60")))


#: The ``n`` of a poison Item: lab_chaos raises on it, inside ctx.row.
POISON = 999_999


@cron(None, retries=3, timeout=timedelta(minutes=10))
def lab_chaos(ctx):
    """Claims Item rows and makes one Effect per row with its finish (bench/chaos.py); a poison row raises.

    With LAB_ACK_LOG, each row whose transaction this process saw commit is appended to that file: the outside
    world's view, which a failover to a standby that lacks the commit would contradict.
    """
    pause = float(os.environ.get("LAB_ITEM_SECONDS", "0"))
    acks = os.environ.get("LAB_ACK_LOG")
    while rows := Item.objects.claim(limit=50):
        for row in rows:
            with ctx.row(row, step="effect"):
                ctx.signal.throw_if_aborted()
                if row.n == POISON:
                    raise ValueError("poison")
                with ctx.transaction():
                    Effect.objects.create(item=row.pk, pid=os.getpid())
                    row.finish()
                if acks:
                    with open(acks, "a") as log:
                        log.write(f"{row.pk}\n")
            if pause:
                time.sleep(pause)


@cron(None, retries=3, timeout=timedelta(minutes=10), lanes=int(os.environ.get("LAB_LANES", "8")))
def lab_lanes(ctx):
    """Claims Item rows in up to LAB_LANES lanes; each row waits LAB_ITEM_SECONDS (I/O, no CPU), then finishes in
    one transaction. With LAB_EFFECTS (on unless "0") it also makes one Effect there, whose unique key makes a row
    finished by two lanes an error (tests/test_lanes.py); without, a row claimed twice fails its older claim's
    finish with a VersionConflict and shows as a version past 2 (bench/lanes.py)."""
    pause = float(os.environ.get("LAB_ITEM_SECONDS", "0"))
    limit = int(os.environ.get("LAB_CLAIM", "50"))
    effects = os.environ.get("LAB_EFFECTS", "1") != "0"
    while rows := Item.objects.claim(limit=limit):
        for row in rows:
            ctx.signal.throw_if_aborted()
            if pause:
                time.sleep(pause)  # the outside world's answer: a wait that uses no CPU
            with ctx.transaction():
                if effects:
                    Effect.objects.create(item=row.pk, pid=os.getpid())
                row.finish(writes=row.writes + 1)


@cron(os.environ.get("LAB_MINUTELY_SCHEDULE") or None, timeout=timedelta(seconds=30))
def lab_minutely(ctx):
    """The soak's cron job (bench/chaos.py soak sets LAB_MINUTELY_SCHEDULE="* * * * *"): a Mark per run, noted
    with the minute it ran in, so a fire served twice shows as two marks of one minute."""
    with ctx.transaction():
        Mark.objects.create(job=ctx.job.name, note=ctx.now().strftime("%Y-%m-%d %H:%M"), pid=os.getpid())


@cron(
    None,
    retries=3,
    timeout=timedelta(minutes=2),
    lanes=int(os.environ.get("LAB_RATE_LANES", "4")),
    rate_limit=os.environ.get("LAB_RATE", "10/s") or None,
)
def lab_rated(ctx):
    """Claims Item rows under a shared rate limit (LAB_RATE, 10/s by default; empty: none) in LAB_RATE_LANES lanes,
    recording each row's claim (``Taken``, whose unique key makes a row claimed twice an error) as it finishes it
    (tests/test_ratelimit.py, bench/ratelimit.py)."""
    limit = int(os.environ.get("LAB_CLAIM", "50"))
    record = os.environ.get("LAB_TAKEN", "1") != "0"
    while rows := Item.objects.claim(limit=limit):
        with ctx.transaction():
            if record:
                Taken.objects.bulk_create([Taken(item=row.pk, due=row.due, pid=os.getpid()) for row in rows])
            for row in rows:
                row.finish(writes=row.writes + 1)


def _hold_after_a_periodic_enqueue(sender, task_result, **kwargs):
    """tests/test_periodic.py: with LAB_PERIODIC_HOLD naming a file, a periodic task's enqueue (its commit done, its
    attempt not yet ended) writes this process's pid beside it and waits while the file is there."""
    hold = os.environ.get("LAB_PERIODIC_HOLD")
    if hold and task_result.task.name == "mark":
        with open(f"{hold}.seen", "w") as seen:
            seen.write(str(os.getpid()))
        while os.path.exists(hold):
            time.sleep(0.02)


task_enqueued.connect(_hold_after_a_periodic_enqueue)
