"""``fabrika.E001``–``E012``, ``W002``: the registered jobs, their kicks and their declared actions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from django.apps import AppConfig, apps
from django.core import checks

from ..jobs import MAX_LANES, MAX_TIMEOUT, CronJob, JobRegistry, lanes_problem, rate_problem, registry
from ..schedule import RULE, Schedule, normalize

_DECLARE_HINT = "Declare the job with @cron(...), which checks its arguments at import."


def _job_error(job: CronJob, problem: str, hint: str, id: str) -> checks.Error:
    # obj is the name: a CronJob's repr would fill the line `manage.py check` prints.
    return checks.Error(f"Cron job '{job.name}' {problem}.", hint=hint, obj=job.name, id=id)


@checks.register("fabrika")
def _check_jobs(
    app_configs: Sequence[AppConfig] | None = None, *, jobs: JobRegistry | None = None, **kwargs: object
) -> list[checks.CheckMessage]:
    """Check every registered job, the duplicates the registry refused, and the kick graph."""
    jobs = registry if jobs is None else jobs
    errors: list[checks.CheckMessage] = []
    for job in jobs:
        errors.extend(_check_job(job))
    for duplicate in jobs.duplicates:
        first = jobs.get(duplicate.name) if duplicate.name in jobs else None
        where = f"in {first.module} and {duplicate.module}" if first is not None else f"twice in {duplicate.module}"
        errors.append(
            _job_error(
                duplicate,
                f"is declared {where}",
                "Job names are unique across the project: give one of them another name with @cron(..., name=...).",
                "fabrika.E010",
            )
        )
    errors.extend(_check_kicks(jobs))
    errors.extend(_check_actions(jobs))
    return errors


def _check_job(job: CronJob) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    if job.schedule is not None and not isinstance(job.schedule, Schedule):
        try:
            normalize(job.schedule)
            reason = "a string, not a Schedule"
        except ValueError:
            reason = "not a cron expression"
        errors.append(
            _job_error(
                job,
                f"has schedule {job.schedule!r}, which is {reason}",
                f"Give {RULE}, or None. " + _DECLARE_HINT,
                "fabrika.E001",
            )
        )
    if not isinstance(job.timeout, timedelta) or not timedelta(0) < job.timeout <= MAX_TIMEOUT:
        errors.append(
            _job_error(
                job,
                f"has timeout {job.timeout!r}, which is not a timedelta of more than 0 and at most one day",
                "Give e.g. timeout=timedelta(minutes=10). " + _DECLARE_HINT,
                "fabrika.E002",
            )
        )
    retries = job.retries
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        errors.append(
            _job_error(
                job,
                f"has retries={retries!r}, which is not a whole number of 0 or more",
                "Give e.g. retries=2. " + _DECLARE_HINT,
                "fabrika.E003",
            )
        )
    problem = lanes_problem(job.lanes)
    if problem is not None:
        errors.append(
            _job_error(
                job,
                f"has {problem}",
                f"Give e.g. lanes=4 (at most {MAX_LANES}: each running lane holds a database connection). "
                + _DECLARE_HINT,
                "fabrika.E004",
            )
        )
    if job.rate_limit is not None and rate_problem(job.rate_limit) is not None:
        errors.append(
            _job_error(
                job,
                f"has {rate_problem(job.rate_limit)}",
                "Give e.g. rate_limit='20/s'. " + _DECLARE_HINT,
                "fabrika.E005",
            )
        )
    return errors


def _check_kicks(jobs: JobRegistry) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    graph: dict[str, list[str]] = {}
    for job in jobs:
        graph[job.name] = []
        for target in job.kicks:
            if target in jobs:
                graph[job.name].append(target)
            else:
                errors.append(
                    _job_error(
                        job,
                        f"kicks '{target}', which is no registered job",
                        "Fix the name in kicks=[...], or declare that job with @cron in an installed app's jobs.py.",
                        "fabrika.E011",
                    )
                )
    for cycle in _cycles(graph):
        path = " -> ".join([*cycle, cycle[0]])
        errors.append(
            checks.Error(
                f"Cron jobs kick each other in a cycle: {path}.",
                hint="Kicks must never form a cycle: remove one of these kicks and let that job's schedule pick up.",
                obj=cycle[0],
                id="fabrika.E012",
            )
        )
    return errors


def _check_actions(jobs: JobRegistry) -> list[checks.CheckMessage]:
    declared = {
        f"{model._meta.app_label}.{codename}"
        for model in apps.get_models()
        for codename in [
            *(f"{action}_{model._meta.model_name}" for action in model._meta.default_permissions),
            *(codename for codename, _name in model._meta.permissions),
        ]
    }
    warnings: list[checks.CheckMessage] = []
    for job in jobs:
        for action in sorted(job.actions or ()):
            if action not in declared:
                # A Warning, not an Error: a permission can also be a row someone added by hand.
                warnings.append(
                    checks.Warning(
                        f"Cron job '{job.name}' holds action '{action}', which no installed model declares.",
                        hint="Give app_label.codename of a model's permission, e.g. 'tasks.change_task' "
                        "(add_, change_, delete_, view_ and the Meta.permissions of each model).",
                        obj=job.name,
                        id="fabrika.W002",
                    )
                )
    return warnings


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Return each elementary cycle of ``graph`` once, rotated to start at its smallest name, sorted."""
    found: set[tuple[str, ...]] = set()

    def walk(start: str, node: str, path: list[str], on_path: set[str]) -> None:
        for target in graph.get(node, ()):
            if target == start:
                found.add(tuple(path))
            elif target > start and target not in on_path:
                # Only names after `start`: each cycle is found once, from its smallest name.
                path.append(target)
                on_path.add(target)
                walk(start, target, path, on_path)
                on_path.discard(target)
                path.pop()

    for start in sorted(graph):
        walk(start, start, [start], {start})
    return [list(cycle) for cycle in sorted(found)]
