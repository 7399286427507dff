"""The reference pages under docs/reference/ hold every public name the code has, and no name it no longer has.

Names are read from the code generically, over the whole package (modules move between files and subpackages):
the ``FABRIKA`` keys from ``DEFAULTS``, the check ids from every module's source, the ``fabrika_job`` actions and
flags from the command's parser (built through Django's public API), the metric names from the metric
constructors in every module, the health codes from every ``Finding(...)``, and the outcome codes from the
``Attempt`` model's choices. Each failure names the page and the missing (or stale) name.
"""

import argparse
import re
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import load_command_class
from django.core.management.base import BaseCommand

import fabrika_django
from fabrika_django.conf import DEFAULTS

PACKAGE = Path(fabrika_django.__file__).parent
REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference"

_CHECK_ID = re.compile(r"\bfabrika\.[EW]\d{3}\b")
# A metric is named where it is made: prometheus_client's instruments and the collectors' metric families.
_METRIC = re.compile(r"\b(Counter|Gauge|Histogram|Summary|Info|\w+MetricFamily)\(\s*[\"'](fabrika_\w+)[\"']")
_FINDING = re.compile(r"\bFinding\(\s*(?:check\s*=\s*)?[\"']([a-z_]+)[\"']")
_ROW_NAME = re.compile(r"^\|\s*`([^`]+)`")
_FLAG = re.compile(r"^\|\s*`(--[a-z][a-z-]*)")


def _sources() -> list[tuple[str, str]]:
    return [(path.relative_to(PACKAGE).as_posix(), path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))]


def _sections(page: str) -> dict[str, str]:
    """The page's text by second-level heading (the text before the first one under "")."""
    sections: dict[str, str] = {}
    heading = ""
    for line in (REFERENCE / page).read_text().splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            continue
        sections[heading] = sections.get(heading, "") + line + "\n"
    return sections


def _first_column(text: str, pattern: re.Pattern[str] = _ROW_NAME) -> set[str]:
    """The names in backticks that open a table row's first cell."""
    return {match.group(1) for line in text.splitlines() if (match := pattern.match(line))}


def _table(page: str, heading: str) -> set[str]:
    sections = _sections(page)
    assert heading in sections, f"docs/reference/{page} has no section '## {heading}'"
    return _first_column(sections[heading])


def _differences(page: str, what: str, in_code: set[str], in_page: set[str]) -> list[str]:
    lacks = [f"docs/reference/{page} lacks {what} {name!r}, which the code has" for name in sorted(in_code - in_page)]
    stale = [
        f"docs/reference/{page} lists {what} {name!r}, which the code no longer has"
        for name in sorted(in_page - in_code)
    ]
    return lacks + stale


def _check(page: str, what: str, in_code: set[str], in_page: set[str]) -> None:
    assert in_code, f"found no {what} in the code: the test's extraction is broken"
    problems = _differences(page, what, in_code, in_page)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def test_every_fabrika_setting_is_documented():
    _check("settings.md", "FABRIKA key", set(DEFAULTS), _table("settings.md", "`FABRIKA` keys"))


def test_every_check_id_is_documented():
    in_code = {match for _path, text in _sources() for match in _CHECK_ID.findall(text)}
    _check("checks.md", "check id", in_code, _first_column((REFERENCE / "checks.md").read_text()))


def _command_parser() -> argparse.ArgumentParser:
    command = load_command_class("fabrika_django", "fabrika_job")
    return command.create_parser("manage.py", "fabrika_job")


def _django_options() -> set[str]:
    """The options every management command has (--settings, -v, ...): Django's, not fabrika's."""
    parser = BaseCommand().create_parser("manage.py", "any")
    return {option for action in parser._actions for option in action.option_strings}


def _actions_and_flags() -> dict[str, set[str]]:
    parser = _command_parser()
    common = _django_options()
    actions: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                actions[name] = {
                    option
                    for sub_action in subparser._actions
                    for option in sub_action.option_strings
                    if option.startswith("--") and option not in common
                }
    return actions


def test_every_fabrika_job_action_and_flag_is_documented():
    in_code = _actions_and_flags()
    sections = {
        heading.strip("`"): text for heading, text in _sections("commands.md").items() if heading.startswith("`")
    }
    _check("commands.md", "fabrika_job action", set(in_code), set(sections))
    problems = []
    for action in sorted(set(in_code) & set(sections)):
        in_page = _first_column(sections[action], _FLAG)
        problems += _differences("commands.md", f"flag of '{action}'", in_code[action], in_page)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def _metric_names() -> set[str]:
    """Every metric the package makes, under the name Prometheus shows (a counter's ends in _total)."""
    names = set()
    for _path, text in _sources():
        for kind, name in _METRIC.findall(text):
            counter = kind in ("Counter", "CounterMetricFamily")
            names.add(f"{name}_total" if counter and not name.endswith("_total") else name)
    return names


def test_every_metric_is_documented():
    _check("metrics.md", "metric", _metric_names(), _first_column((REFERENCE / "metrics.md").read_text()))


def test_every_health_code_is_documented():
    in_code = {match for _path, text in _sources() for match in _FINDING.findall(text)}
    _check("codes.md", "health code", in_code, _table("codes.md", "Health codes"))


def test_every_outcome_and_failure_code_is_documented():
    outcome = apps.get_model("fabrika_django", "Attempt")._meta.get_field("outcome")
    in_code = {value for value, _label in outcome.choices}
    in_page = _table("codes.md", "Attempt outcomes") | _table("codes.md", "Mail failure codes")
    _check("codes.md", "outcome code", in_code, in_page)
