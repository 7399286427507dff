"""fabrika_django: background work for Django without a broker.

Work is rows in the application's own tables; cron jobs claim them; a request kicks a job after its commit.
This module names the public API and imports no model, so it is safe to import before Django is set up.
"""

from .context import JobContext
from .exceptions import (
    AttemptTimedOut,
    CapabilityRefused,
    ClaimInsideTransaction,
    ClaimOutsideJob,
    EgressRefused,
    EmailDeliveryError,
    FabrikaError,
    FetchError,
    LeaseLost,
    TokenExpired,
    TokenInvalid,
    UndeclaredKick,
    UnknownJob,
    VersionConflict,
    WriteOutsideTransaction,
)
from .jobs import cron
from .kicks import kick

__version__ = "0.3.0"

__all__ = [
    "AttemptTimedOut",
    "CapabilityRefused",
    "ClaimInsideTransaction",
    "ClaimOutsideJob",
    "EgressRefused",
    "EmailDeliveryError",
    "FabrikaError",
    "FetchError",
    "JobContext",
    "LeaseLost",
    "TokenExpired",
    "TokenInvalid",
    "UndeclaredKick",
    "UnknownJob",
    "VersionConflict",
    "WriteOutsideTransaction",
    "cron",
    "kick",
]
