"""The test kit: run_job(), JobResult, captured kicks, a fixed clock, and pytest fixtures (a pytest11 plugin).

Imported by pytest at start-up, before Django is set up: import no model at module level.
"""

from __future__ import annotations
