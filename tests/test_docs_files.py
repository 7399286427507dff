"""The short documents stay short and their links resolve; the shipped monitoring files are valid and name
only metrics the reference documents."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "docs" / "monitoring"
SHORT_DOCUMENTS = ["README.md", "bench/README.md"]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_METRIC_NAME = re.compile(r"\bfabrika_[a-z_]*[a-z]\b")


def _relative_links(document: Path) -> list[str]:
    links = _LINK.findall(document.read_text())
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link) and not link.startswith("#")]


@pytest.mark.parametrize("name", SHORT_DOCUMENTS)
def test_a_short_document_has_at_most_150_lines(name):
    lines = len((ROOT / name).read_text().splitlines())
    assert lines <= 150, f"{name} has {lines} lines: move what it grew into the docs site (docs/), keep it at 150"


@pytest.mark.parametrize("name", SHORT_DOCUMENTS)
def test_every_relative_link_of_a_short_document_resolves(name):
    document = ROOT / name
    missing = [
        link for link in _relative_links(document) if not (document.parent / link.split("#", 1)[0]).resolve().exists()
    ]
    assert not missing, f"{name} links to files that are not in the repository: {', '.join(missing)}"


def test_the_readme_names_the_two_commands_and_ci_runs_its_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "bin/demo" in readme and "bin/test" in readme, "README.md must name the two commands bin/demo and bin/test"
    assert "bin/docs" in readme and "bin/release-check" in readme, "README.md's development section names both"
    assert re.search(r"^bin/test\b", (ROOT / ".ci" / "run").read_text(), re.M), ".ci/run must run bin/test"


def _documented_metrics() -> set[str]:
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    return {match.group(1) for line in page.splitlines() if (match := re.match(r"^\|\s*`(fabrika_\w+)`", line))}


def _base_name(series: str) -> str:
    """A histogram's series (``_bucket``, ``_sum``, ``_count``) belong to the histogram's name."""
    return re.sub(r"_(bucket|sum|count)$", "", series)


@pytest.mark.parametrize("name", ["alerts.yml", "grafana-dashboard.json"])
def test_the_monitoring_files_name_only_documented_metrics(name):
    documented = _documented_metrics()
    text = (MONITORING / name).read_text()
    used = {_base_name(series) for series in _METRIC_NAME.findall(text)} - {"fabrika_django"}
    assert used, f"docs/monitoring/{name} names no fabrika metric"
    unknown = sorted(used - documented)
    assert not unknown, f"docs/monitoring/{name} uses metrics docs/reference/metrics.md lacks: {', '.join(unknown)}"


def test_the_grafana_dashboard_is_a_dashboard():
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert dashboard["title"] and dashboard["panels"]
    assert all(panel["targets"][0]["expr"] for panel in dashboard["panels"])


def test_promtool_accepts_the_alert_rules_and_the_scrape_config():
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("FABRIKA_REQUIRE_PROMTOOL") == "1":
            pytest.fail("promtool is missing and FABRIKA_REQUIRE_PROMTOOL=1 (Debian: apt-get install prometheus)")
        pytest.skip("promtool is missing (Debian: apt-get install prometheus): the alert rules are not checked")
    for args in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"]):
        done = subprocess.run([promtool, *args], cwd=MONITORING, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{done.stdout}{done.stderr}"


def test_every_admin_screenshot_in_docs_is_shown_by_a_page_of_the_site():
    # The Chromium tests keep both themes' screenshots here (FABRIKA_SCREENSHOTS=docs/screenshots); a reader sees
    # them only where a page shows them.
    pages = "\n".join(page.read_text() for page in (ROOT / "docs").rglob("*.md"))
    shown = set(re.findall(r"screenshots/([\w.-]+\.png)", pages))
    kept = {shot.name for shot in (ROOT / "docs" / "screenshots").glob("admin-*.png")}
    assert sorted(kept - shown) == [], "docs/screenshots holds admin screenshots no page of docs/ shows"
