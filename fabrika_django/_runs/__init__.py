"""The run machinery: every write and query of a job's ``Job``, ``Lease`` and ``Attempt`` rows and its kick rows.

The runner orchestrates attempts, the worker loops, kicks mark jobs pending, the admin and the status command
report; all of them read and write a job's rows through the modules here, so the rules those rows keep are
written once:

- Starting and ending a run lock the job's ``Job`` row first, then its ``Lease`` row (SQLite: the database
  write lock), on every path: a kick is either seen by the run that ends or finds the lease free (``rows``,
  ``start``, ``lease``).
- The lease is free when its ``token`` is null; *active* when a token is set and ``expires`` is still ahead
  (``rows.lease_active``); a token whose ``expires`` passed is a holder that vanished, taken over by the next
  start. How long a lease is granted for is one rule (``_lease_time.lease_seconds``).
- A run's first attempt row is written in the start's own commit; a cut-off attempt is marked ``crashed``.
- A stale attempt never commits after its replacement started (``fence``).

The statements these modules send by hand live in ``_sql``.
"""
