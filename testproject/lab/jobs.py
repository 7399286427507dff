"""Jobs the tests run in other processes (``manage.py fabrika_job run``, workers). Kick-only: no schedule."""

import os
import time
from datetime import timedelta

from fabrika_django import cron

from .models import Mark


def _mark(ctx, note):
    with ctx.transaction():
        Mark.objects.create(job=ctx.job.name, note=note, pid=os.getpid(), attempt=ctx.attempt)


@cron(None, timeout=timedelta(seconds=30))
def lab_slow(ctx):
    """Marks its start, works two seconds, marks its end."""
    _mark(ctx, "start")
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
