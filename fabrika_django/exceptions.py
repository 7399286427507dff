"""The errors fabrika_django raises. Every message says what to do instead."""

from __future__ import annotations


class FabrikaError(Exception):
    """Base of every fabrika error; never raised itself."""

    #: The fixed code an attempt that ends with this error is recorded under.
    code = "handler_failed"


class UnknownJob(FabrikaError, LookupError):
    """No cron job is registered under that name."""

    code = "unknown_job"


class VersionConflict(FabrikaError):
    """The row changed since it was claimed or read; nothing was written."""

    code = "version_conflict"


class LeaseLost(FabrikaError):
    """The attempt's lease is no longer its own: it may not begin or commit a transaction."""

    code = "lease_lost"


class AttemptTimedOut(LeaseLost):
    """The attempt ran past its timeout: it may not begin or commit a transaction."""

    code = "timed_out"


class WorkerStopping(LeaseLost):
    """The worker is shutting down: the attempt may not begin or commit a transaction."""

    code = "shutdown"


class ClaimOutsideJob(FabrikaError, RuntimeError):
    """claim() was called outside a job run."""

    code = "claim_outside_job"


class ClaimInsideTransaction(FabrikaError, RuntimeError):
    """claim() was called inside ctx.transaction()."""

    code = "claim_inside_transaction"


class WriteOutsideTransaction(FabrikaError, RuntimeError):
    """A job wrote to the database outside ctx.transaction()."""

    code = "write_outside_transaction"


class UndeclaredKick(FabrikaError, PermissionError):
    """A job kicked a job it did not declare in ``kicks``."""

    code = "undeclared_kick"


class CapabilityRefused(FabrikaError, PermissionError):
    """A job used a capability it did not declare (an action, an egress origin, a token purpose)."""

    code = "capability_refused"

    def __init__(self, message: str, *, missing: str = "") -> None:
        super().__init__(message)
        self.missing = missing


class EmailDeliveryError(FabrikaError):
    """A send was refused. ``code`` is fixed; ``outcome`` is ``"not_sent"`` or ``"unknown"``."""

    def __init__(self, message: str, *, code: str, outcome: str = "not_sent") -> None:
        super().__init__(message)
        self.code = code
        self.outcome = outcome


class TokenInvalid(FabrikaError, ValueError):
    """A signed token was tampered with, signed for another purpose, or is not a token at all."""

    code = "token_invalid"


class TokenExpired(TokenInvalid):
    """A signed token was genuine but its ``days`` have passed."""

    code = "token_expired"


class EgressRefused(CapabilityRefused):
    """``ctx.fetch`` was asked for a URL outside the job's declared HTTPS origins (or a redirect led there)."""

    code = "egress_refused"


class FetchError(FabrikaError, ConnectionError):
    """``ctx.fetch`` got no HTTP answer (DNS, connection, TLS or timeout), or one larger than its ``max_bytes``
    (``code`` is then ``"fetch_too_large"``). ``origin`` and ``reason`` are facts.

    The message names the origin and the error's class only, never the URL's path or query.
    """

    code = "fetch_failed"

    def __init__(self, message: str, *, origin: str = "", reason: str = "", code: str = "") -> None:
        super().__init__(message)
        self.origin = origin
        self.reason = reason
        if code:
            self.code = code
