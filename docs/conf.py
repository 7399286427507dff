"""Sphinx configuration of fabrika_django's documentation (built by bin/docs with -W -n)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# autodoc imports the package's models and admin: Django is set up with the test project's settings (SQLite
# by default, so building the docs needs no server).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
os.environ.setdefault("DATABASE_URL", f"sqlite:///{ROOT / 'var' / 'docs.sqlite3'}")
import django  # noqa: E402

django.setup()

import fabrika_django  # noqa: E402

project = "fabrika_django"
author = "fabrika_django contributors"
copyright = "fabrika_django contributors"
release = fabrika_django.__version__
version = release

extensions = ["myst_parser", "sphinx.ext.autodoc"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "tutorial_project", "screenshots/README.md"]

html_theme = "furo"
html_title = f"fabrika_django {release}"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}

# Nitpicky references hold every cross-reference to fabrika's own names. Names of Python, Django and other
# libraries are not checked: the build fetches no other project's inventory (it runs offline).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(?!fabrika_django\b).*"),
    # Private names in public signatures (a TypeVar, a capabilities record): not documented, never linked.
    (r"py:.*", r"fabrika_django(\.\w+)*\._\w+(\.\w+)*"),
    # What @cron returns: the registry's record of the job, named in cron's signature, not an API of its own.
    (r"py:class", r"fabrika_django\.jobs\.CronJob"),
]
