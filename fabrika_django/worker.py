"""The long-running worker: fires schedules once across all workers, takes kicks, runs jobs, stops cleanly.

One loop thread decides, a fixed set of runner threads run (each keeps its database connection between
runs, so a kicked run starts without connecting), and on PostgreSQL a listener thread hears kicks
(``_listen.Listener``) and hands each straight to a free runner slot (one thread hop less between a NOTIFY
and its run's start; a kick it cannot place waits as a row for the loop's next scan). The loop reads the
jobs' state — pending flags, next fires, leases — in one query on every poll and after every (re)connection,
so nothing a worker missed while away is lost.

- A kick is a row a request inserted (``kicks``); the worker takes it on its poll, which makes it the job's
  pending flag, and the run it starts for the NOTIFY the kick's commit sent takes it in its start's statement;
  a run that starts clears the flag. A job with a live run is left alone: that run sees the flag when it ends
  and runs once more (``run_lease.end_run``).
- Lanes: a job with ``lanes`` > 1 runs up to that many runs at once over every worker; a full claim asks for one
  more lane (``Job.lane_asked``, heard as a kick), which a free slot starts. ``concurrency`` counts runs.
- A fire is a compare-and-set of ``Job.next_fire`` from the value read to the next fire after now, so each
  fire is taken by exactly one worker, and fires missed while no worker ran collapse into one run.
- A lease that expired with a token is a holder that vanished (SIGKILL): its job is run, which takes the
  lease over and resumes the cut-off run (the runner).
- SIGTERM/SIGINT set the stop event every run watches (its attempt aborts with ``ctx.signal.reason ==
  "shutdown"`` and releases its lease); an interrupted run is handed to the other workers as a kick.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime, timedelta

from django.db import Error as DatabaseError
from django.db import connection
from django.utils import timezone

from . import _db_failure, _metrics, runner
from ._handlers import close_quietly, handler_threads
from ._listen import Backoff, Listener
from ._process import configure_logging, stop_signals
from ._runs import lease as run_lease
from ._runs import pending as run_pending
from ._runs import reads as run_reads
from ._sessions import bound_idle_transactions
from .conf import settings
from .jobs import CronJob, registry
from .kicks import request_run
from .models import Outcome, Trigger

logger = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 4
#: Runs one process may execute at once: each is a thread and a database connection, and past a few hundred the
#: process only waits on the database (more throughput comes from more workers).
MAX_CONCURRENCY = 256
#: Seconds a stopping worker waits for its runs to end (their attempts are aborted at once).
DEFAULT_GRACE = 10.0


class Worker:
    """Run the project's jobs until stopped: ``Worker(concurrency=4, only=None).run()``.

    ``concurrency``: the runs this process executes at once, whatever their jobs and lanes (a job with
    ``lanes`` spreads its runs over every worker). ``only``: the names of the jobs to serve (all by default).
    ``verbosity``: as Django's (0 warnings only, 1 one line per run start and end, 2 and more debug).
    ``clock``: the time schedules are measured by (tests move it). ``grace``: seconds a stop waits for running
    attempts. ``install_signals``: handle SIGTERM/SIGINT (only possible in the main thread).
    """

    def __init__(
        self,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        only: Iterable[str] | None = None,
        verbosity: int | None = None,
        stdout: object = None,
        clock: Callable[[], datetime] | None = None,
        grace: float = DEFAULT_GRACE,
        install_signals: bool = True,
    ) -> None:
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency={concurrency!r} is not valid: give 1 to {MAX_CONCURRENCY}.")
        jobs = [registry.get(name) for name in only] if only is not None else list(registry)
        self.jobs: dict[str, CronJob] = {job.name: job for job in jobs}
        self.concurrency = concurrency
        self.verbosity = verbosity
        self.grace = grace
        self.install_signals = install_signals
        self._clock = clock
        self._now = clock or timezone.now
        self._stop = threading.Event()
        # "scan", "stop", or a run's end: (job, whether the database failed it, holder).
        self._inbox: queue.SimpleQueue[tuple[str, bool, str] | str] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        # This worker's runs of each job (one a lane), and of all jobs.
        self._running: collections.Counter[str] = collections.Counter()
        self._busy = 0
        # Guards those two counts: the loop and the listener thread both dispatch runs.
        self._slots = threading.RLock()
        # Runs that failed in the database (holder -> job): their lease may still be held, by nobody.
        self._orphans: dict[str, str] = {}
        self._runners: list[threading.Thread] = []
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        # Bumped when a connection was found dead: runner threads then reconnect before their next run.
        self._epoch = 0
        self._backoff = Backoff()
        self._prepared = False
        self._next_scan = 0.0
        self._states = run_reads.StateReader(list(self.jobs))
        self._served = list(self.jobs)

    # -- public ----------------------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stop() or SIGTERM/SIGINT; return once running attempts ended and leases are free."""
        configure_logging(self.verbosity)
        bound_idle_transactions()  # a frozen or cut-off worker's sessions end on the server's side (_sessions)
        listener = Listener.if_configured(
            self._stop,
            on_kick=self._kicked,
            on_connect=lambda: self._inbox.put("scan"),
            on_lost=self._connection_lost,
        )
        logger.info(
            "Worker started jobs=%d concurrency=%d wake=%s",
            len(self.jobs),
            self.concurrency,
            "listen" if listener else f"poll:{settings.POLL_INTERVAL}s",
        )
        # Stop signals are ours until the runs ended: a second SIGTERM during the grace changes nothing.
        with stop_signals(self.stop, install=self.install_signals):
            for index in range(self.concurrency):
                thread = threading.Thread(target=self._serve, args=(index,), name=f"fabrika-run-{index}", daemon=True)
                thread.start()
                self._runners.append(thread)
            if listener is not None:
                listener.start()
            try:
                self._loop()
            finally:
                self._shutdown(listener)
                logger.info("Worker stopped")

    def stop(self) -> None:
        """Ask the worker to stop: no new runs, running attempts aborted (safe from any thread or a signal)."""
        self._stop.set()
        self._inbox.put("stop")

    # -- the loop --------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            timeout = self._next_scan - time.monotonic()
            if timeout <= 0:
                self._scan()
                continue
            try:
                message = self._inbox.get(timeout=timeout)
            except queue.Empty:
                continue
            self._handle(message)

    def _kicked(self, name: str) -> None:
        """A kick's NOTIFY, heard (the listener's thread): start its run in a free runner slot at once.

        Not through the loop: a kick's run starts one thread hop after its NOTIFY, whatever the loop is doing. A
        kick that finds the job at its lanes, or every slot busy, is left as it is: its row waits, and the scan
        that follows the end of a run takes it (a flag the job's live run sees as it ends).
        """
        if name not in self.jobs or self._stop.is_set():
            return
        with self._slots:
            if self._running[name] >= self.jobs[name].lanes or self._busy >= self.concurrency:
                return
            # The run's start takes the kick rows itself (run_start.start_or_join): no round trip before it.
            self._dispatch(name, Trigger.KICK)

    def _handle(self, message: tuple[str, bool, str] | str) -> None:
        if isinstance(message, tuple):
            name, failed, holder = message
            with self._slots:
                self._running[name] -= 1
                self._busy -= 1
            if failed:
                self._orphans[holder] = name
                self._connection_lost()
                self._next_scan = time.monotonic() + self._backoff.next()
            else:
                # A slot is free and the job may have been kicked meanwhile: look again at once.
                self._next_scan = 0.0
        elif message == "scan":
            self._next_scan = 0.0

    def _scan(self) -> None:
        """Read every served job's state in one query; fire what is due, run what is pending or orphaned."""
        # Polls keep their cadence from the start of each scan, however long the scan took.
        began = time.monotonic()
        try:
            if not self._prepared:
                self._prepare()
            runner.record_kept_outcomes()  # ends written while the database was away: first, and cheap when none
            if self._orphans:
                self._release_orphans()
            states = self._read_states()
            self._fire_and_dispatch(states)
        except DatabaseError as exc:
            pause = self._backoff.next()
            logger.warning(
                "Database unavailable server=%s kind=%s error=%s retry_in=%.1fs",
                _db_failure.server_of(connection.settings_dict), _db_failure.kind_of(exc), type(exc).__name__, pause,
            )  # fmt: skip
            self._connection_lost()
            close_quietly()
            self._next_scan = time.monotonic() + pause
            return
        if self._backoff.failures:
            logger.info("Database back")
            self._backoff.reset()
        wait = self._until_next_scan(states)
        # A scan slower than the interval does not make the next one follow at once.
        self._next_scan = max(began + wait, time.monotonic() + wait / 4)

    def _prepare(self) -> None:
        runner.sync_jobs(list(self.jobs))
        self._prepared = True

    def _read_states(self) -> dict[str, run_reads.ScanState]:
        run_pending.take_kicks(self._served)  # kicks no worker heard (or took yet) become pending flags first
        return self._states.read()

    def _fire_and_dispatch(self, states: dict[str, run_reads.ScanState]) -> None:
        now = self._now()
        for name, state in states.items():
            job = self.jobs[name]
            fire = state.next_fire
            if self._stop.is_set() or (job.schedule is None and fire is None):
                continue
            if job.schedule is not None and (fire is None or job.schedule.next_after(fire - _TICK) != fire):
                # A new job, or its schedule changed: its first fire is the next one from now.
                fresh = job.schedule.next_after(now)
                run_reads.take_fire(name, fire, fresh)
                states[name] = replace(state, next_fire=fresh)
                continue
            if fire is None or fire > now:  # None: a kick-only job without a wake (skipped above already)
                continue
            local = self._running[name] > 0
            if not local and self._busy >= self.concurrency:
                continue  # another worker, or this one later, takes the fire
            # Exactly one worker moves next_fire from the value it read: that one owns this fire (a kick-only
            # job's wake, _runs.wake, fires once and is cleared). Fires missed while no worker ran are all
            # behind now: one run makes them up.
            following = job.schedule.next_after(now) if job.schedule is not None else None
            if not run_reads.take_fire(name, fire, following):
                continue
            states[name] = replace(state, next_fire=following)
            logger.debug("Fire job=%s at=%s", name, fire.isoformat())
            if local:
                request_run(name)  # a fire during this worker's run: the run goes once more
            else:
                # Owned: dispatched even if the listener took the last slot meanwhile (it waits for one).
                self._dispatch(name, Trigger.SCHEDULE)
        for name, state in states.items():
            if self._stop.is_set():
                return
            with self._slots:  # a slot checked and taken at once: the listener's thread dispatches too
                self._dispatch_flagged(name, state)

    def _dispatch_flagged(self, name: str, state: run_reads.ScanState) -> None:
        """Run the job if its state asks for it and a slot and a lane of this worker are free."""
        lanes = self.jobs[name].lanes
        if self._busy >= self.concurrency or self._running[name] >= lanes:
            return
        # Pending under a live lease: its holder runs it once more when it ends. A lane asked for starts
        # while one is free; the start decides which (and whether, when another worker was first).
        if state.orphaned:
            self._dispatch(name, _TAKEOVER)
        elif (state.asked and state.active < lanes) or (state.pending and not state.held):
            self._dispatch(name, Trigger.KICK)

    def _release_orphans(self) -> None:
        """Free the leases of runs the database cut off in this worker, and run those jobs again.

        Such a run is over (runner.run raised), so nothing of this worker works under its lease: without
        this, the job would wait for the lease to expire.
        """
        runner.record_kept_outcomes()  # the real outcomes first: what is still running after them crashed
        for holder, name in list(self._orphans.items()):
            freed = run_lease.release(name, holder)
            if freed:
                logger.info("Released the lease of a run cut off by the database job=%s", name)
                request_run(name)
            del self._orphans[holder]

    def _until_next_scan(self, states: dict[str, run_reads.ScanState]) -> float:
        interval = max(0.01, float(settings.POLL_INTERVAL))
        if self._clock is not None:
            return interval
        now = timezone.now()
        # Fires already due wait for a free slot, and the end of a run scans again anyway.
        fires = [s.next_fire for s in states.values() if s.next_fire is not None and s.next_fire > now]
        if fires:
            interval = min(interval, max(0.0, (min(fires) - now).total_seconds()) + 0.001)
        return interval

    def _dispatch(self, name: str, trigger: str) -> None:
        with self._slots:
            self._running[name] += 1
            self._busy += 1
            self._work.put((name, trigger))

    def _connection_lost(self) -> None:
        """A connection was found dead: every thread's may be. Runner threads reconnect before their next run."""
        self._epoch += 1
        # Idle handler threads keep connections that may be dead too; new ones connect afresh.
        handler_threads.drain()

    # -- runner threads --------------------------------------------------------------------------------

    def _serve(self, index: int) -> None:
        holder = f"{self._holder}:{index}"
        epoch = self._epoch
        try:
            while True:
                item = self._work.get()
                if item is None:
                    return
                name, trigger = item
                if epoch != self._epoch:
                    epoch = self._epoch
                    close_quietly()
                self._inbox.put((name, not self._run_one(name, trigger, holder), holder))
        finally:
            close_quietly()

    def _run_one(self, name: str, trigger: str, holder: str) -> bool:
        """Run the job; return False when the database failed the run's bookkeeping (it is tried again)."""
        try:
            # A kick's run serves the pending flag: if another worker's run won the race for the lease, it
            # cleared the flag as it started (after the kick), or sees it when it ends. A fire joins as pending.
            # A takeover that finds the lease renewed after all (its holder came back) coalesces and leaves the
            # job pending, as a fire does: the holder's run may have been cut off meanwhile.
            with _metrics.run_in_progress(name, run_reads.KickWait(name, holder) if trigger == Trigger.KICK else None):
                result = runner.run(
                    self.jobs[name],
                    Trigger.KICK if trigger == _TAKEOVER else trigger,
                    stop=self._stop,
                    holder=holder,
                    clock=self._clock,
                    mark_pending=trigger != Trigger.KICK,
                )
            if result.outcome == Outcome.SHUTDOWN:
                # Stopped before its end: the other workers take it over at once, not after the lease.
                request_run(name)
        except DatabaseError as exc:
            logger.warning("Run could not start or end job=%s error=%s", name, type(exc).__name__)
            close_quietly()
            return False
        except Exception as exc:
            # The class only: an exception's message can quote a value.
            logger.error("Run failed in the framework job=%s error=%s", name, type(exc).__name__)
            return False
        return True

    # -- stopping --------------------------------------------------------------------------------------

    def _shutdown(self, listener: Listener | None) -> None:
        self._stop.set()
        if listener is not None:
            listener.wake()
        for _ in self._runners:
            self._work.put(None)
        deadline = time.monotonic() + self.grace
        for thread in self._runners:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [thread for thread in self._runners if thread.is_alive()]
        if stuck:
            self._release_leases()
        if listener is not None:
            listener.join(2.0)
        handler_threads.drain()
        close_quietly()

    def _release_leases(self) -> None:
        """Free the leases of runs that did not end within the grace, and hand their jobs to other workers."""
        try:
            names = run_lease.release_all(f"{self._holder}:")
            for name in names:
                request_run(name)
            logger.warning("Released leases of runs that outlived the grace jobs=%s", ",".join(names) or "-")
        except DatabaseError as exc:
            logger.warning("Could not release leases error=%s: they expire on their own", type(exc).__name__)


_TICK = timedelta(microseconds=1)
#: The dispatch of a job whose lease expired with a token: run as a kick that marks the job pending if it loses.
_TAKEOVER = "takeover"
