"""Django tasks for the test suite (fabrika_django.tasks.FabrikaBackend)."""

import asyncio
import os
import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

from .models import Mark


@task
def add(a, b):
    return a + b


@task
def noop():
    return None


@task(priority=10)
def urgent(n):
    Mark.objects.create(job="task", note=f"urgent {n}")


@task(priority=-10)
def relaxed(n):
    Mark.objects.create(job="task", note=f"relaxed {n}")


@task
def mark(note):
    """Write a row outside any transaction: a task is plain Django code, without fabrika's write guard."""
    Mark.objects.create(job="task", note=note, pid=os.getpid())
    return note


@task
def always_fails(secret):
    raise ValueError(f"the secret is {secret}")


@task
def interrupts_itself():
    raise KeyboardInterrupt


@task
def returns_an_object():
    return object()


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
def with_context(context, label):
    return {"attempt": context.attempt, "id": context.task_result.id, "label": label}


@task
def stalls_the_first_time(flag_path):
    """The first attempt marks its start and stalls (a test kills its worker); a later one succeeds."""
    if not os.path.exists(flag_path):
        with open(flag_path, "w") as flag:
            flag.write(str(os.getpid()))
        Mark.objects.create(job="task", note="stalled", pid=os.getpid())
        time.sleep(600)
    return "done"


@task
def loses_the_lease():
    """Take the running job's lease away, as a takeover would, and work on past the lease's end."""
    import uuid

    from fabrika_django.models import Lease

    Lease.objects.filter(job="tasks.default.default").update(token=uuid.uuid4())
    time.sleep(1.5)
    return "late"


@task
def effect(n):
    """The soak's task: one Effect for task ``n`` (negative keys, apart from the Items'), made once however often
    the task runs (a rerun after a kill finds it), so the count of effects is the count of tasks done."""
    from .models import Effect

    Effect.objects.get_or_create(item=-n, defaults={"pid": os.getpid()})


@task
def returns_nan():
    return float("nan")


@task
def statuses(seconds=0):
    """After ``seconds``, answer every task row's status by its result id, as this task saw them while it ran."""
    from fabrika_django.models import QueuedTask

    time.sleep(seconds)
    return {str(result_id): status for result_id, status in QueuedTask.objects.values_list("result_id", "status")}


@task
def changes_a_task(result_id):
    """Change another task's row (a new version), as a person's edit between its claim and its start would."""
    from django.db.models import F

    from fabrika_django.models import QueuedTask

    QueuedTask.objects.filter(result_id=result_id).update(version=F("version") + 1)
