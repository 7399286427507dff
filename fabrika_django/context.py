"""JobContext: what a job's handler receives. (Filled in by the runner.)"""

from __future__ import annotations


class JobContext:
    """The context of one attempt of a job run."""
