"""The leader's clock: the periodic jobs only the replica holding the engine lease runs.

    every 60 s   handovers      post each rotation's due handover, then send due reminders
    every 60 s   expiry         expire pending requests whose approval deadline passed
    every 10 s   window starts  start the run of each approved request whose window has begun,
                                and again at the next window start and when a request is approved
    every 60 s   stale marks    remove gpuops cordon marks from nodes a person uncordoned by hand
    hourly       idempotency    forget delivery keys older than 7 days
    every 5 min  capacity       sample each pool's GPUs advertised and out for its chart (kept a day)

Each job is a function of `now`; a job may return when it wants to run next, before its
interval (window starts: the next approved window's start), and `poke(name)` runs it now
(a request approved on this replica). The state it works from is all in the database, so the
schedule needs no memory of its own: every job runs once as the scheduler starts (a
restarted or newly elected leader catches up at once) and then at its interval. What
makes a repeat harmless is the job's, not the scheduler's: a handover is stored once per
(rotation, shift start), an expiry and a run start are compare-and-sets, a prune is a
delete.

Jobs run on apscheduler's BackgroundScheduler (UTC), at most one instance of each at a
time, a missed run coalesced into one. Before each run the job asks `gate` (the lease):
if this replica no longer leads, it does nothing. A job that raises is logged with its
name and runs again at its next time; it never stops the scheduler or the other jobs.
`run(name)` runs one job now, exactly as the timer would (tests and the console use it
with a frozen clock).

The window-starts job only schedules: what becomes of an approved request at a tick (its
run started, its window missed, held by a change freeze) is the engine's rule
(workflows.engine.window_start); the engine, on this same replica, picks a started run up
within its control check.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bot import messages as msg
from commands.services import ClusterDirectory
from commands.pictures import capacity_now
from storage import capacity, idempotency, inbox, outbox
from storage.database import PerThreadDatabase
from workflows.config import GpuopsConfig
from workflows.engine.cordons import ClusterNodes, Cordons
from workflows.engine.runs import RunService
from workflows.engine.window_start import start_at_window
from workflows.fleet.clusters import ClusterUnreachable
from workflows.fleet.summary import FleetSource
from workflows.handover.service import HandoverService
from workflows.pools.windows import UTC
from workflows.requests.records import RoleLookup
from workflows.requests.service import RequestService
from workflows.signals.service import SignalsService

log = logging.getLogger("gpuops.bot.scheduler")

MINUTE = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
# How often the leader samples each pool's capacity for its chart: a day is 288 rows a pool.
CAPACITY_EVERY = dt.timedelta(minutes=5)
# Longer than any redelivery Slack makes (minutes) and than a button is likely clicked twice.
IDEMPOTENCY_KEEP = dt.timedelta(days=7)
# Sent messages are kept a month: long enough that a dedupe key freed by pruning is never
# enqueued again by the request or handover that made it.
OUTBOX_KEEP = dt.timedelta(days=30)
WORKERS = 4
WINDOW_STARTS = "window-starts"
# How often window starts are looked for in any case (an approval on another replica is
# seen within this; one on this replica, and every known window start, at once).
WINDOW_CHECK = dt.timedelta(seconds=10)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(UTC)


@dataclass(frozen=True)
class Job:
    """A named piece of periodic work: `work(now)` every `every`."""

    name: str
    every: dt.timedelta
    work: Callable[[dt.datetime], object]


@dataclass(frozen=True)
class JobRun:
    """One run of a job: `outcome` is "done", "failed" (with the error) or "skipped"
    (this replica did not lead)."""

    job: str
    at: dt.datetime
    outcome: str
    error: str | None = None


class JobRuns:
    """The newest job runs, in order: for the log and for tests, which wait on it."""

    def __init__(self, keep: int = 1000) -> None:
        self._cond = threading.Condition()
        self._seen: deque[JobRun] = deque(maxlen=keep)

    def record(self, run: JobRun) -> None:
        with self._cond:
            self._seen.append(run)
            self._cond.notify_all()

    def all(self, job: str | None = None) -> list[JobRun]:
        with self._cond:
            return [r for r in self._seen if job is None or r.job == job]

    def wait_for(self, predicate: Callable[[list[JobRun]], bool], timeout: float = 30.0) -> list[JobRun]:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(list(self._seen)), timeout=timeout):
                raise TimeoutError(f"job runs so far: {list(self._seen)}")
            return list(self._seen)


class LeaderScheduler:
    """The jobs on a BackgroundScheduler; see the module docstring."""

    def __init__(self, jobs: Sequence[Job], *, clock: Callable[[], dt.datetime] = _utc_now,
                 gate: Callable[[], bool] = lambda: True, runs: JobRuns | None = None) -> None:
        names = [j.name for j in jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"job names must be unique: {names}")
        self._jobs = {j.name: j for j in jobs}
        self._clock = clock
        self._gate = gate
        self.runs = runs or JobRuns()
        self._scheduler: BackgroundScheduler | None = None
        self._stopped = threading.Event()
        # One run of a job at a time, whether the timer, a poke or a due time started it.
        self._running = {name: threading.Lock() for name in self._jobs}

    def start(self) -> LeaderScheduler:
        """Schedule every job: first run now, then every interval."""
        if self._scheduler is not None:
            raise RuntimeError("the scheduler is already running")
        self._stopped.clear()
        scheduler = BackgroundScheduler(timezone=UTC, executors={"default": ThreadPoolExecutor(WORKERS)},
                                        job_defaults={"coalesce": True, "max_instances": 1,
                                                      "misfire_grace_time": None})
        first = dt.datetime.now(UTC)
        for job in self._jobs.values():
            scheduler.add_job(self.run, IntervalTrigger(seconds=job.every.total_seconds(), timezone=UTC),
                              args=[job.name], id=job.name, name=job.name, next_run_time=first)
        self._scheduler = scheduler  # NB: before start: the first runs may ask for a due time
        scheduler.start()
        log.info("scheduler started: %s", ", ".join(f"{j.name} every {_every(j.every)}" for j in self._jobs.values()))
        return self

    def stop(self) -> None:
        """No job starts after this; a job in flight finishes on its own thread."""
        self._stopped.set()
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.shutdown(wait=False)
            log.info("scheduler stopped")

    @property
    def running(self) -> bool:
        return self._scheduler is not None

    def poke(self, name: str) -> None:
        """Run job `name` as soon as a worker is free (never twice at once); nothing when
        the scheduler is not running."""
        self._run_at(name, dt.datetime.now(UTC), key="poke")

    def _run_at(self, name: str, at: dt.datetime, *, key: str) -> None:
        scheduler = self._scheduler
        if scheduler is None or name not in self._jobs:
            return
        try:
            scheduler.add_job(self.run, DateTrigger(run_date=at, timezone=UTC), args=[name],
                              id=f"{name}/{key}", name=name, replace_existing=True)
        except Exception as err:  # noqa: BLE001 - e.g. shut down meanwhile; the interval still runs
            log.debug("could not schedule %s at %s: %s", name, at.isoformat(), err)

    def run(self, name: str) -> JobRun:
        """Run job `name` now (if this replica leads and the scheduler was not stopped);
        never raises."""
        with self._running[name]:
            return self._run_once(name)

    def _run_once(self, name: str) -> JobRun:
        job = self._jobs[name]
        now = self._clock()
        if self._stopped.is_set():
            result = JobRun(job.name, now, "skipped", "the scheduler is stopped")
        elif not self._gate():
            result = JobRun(job.name, now, "skipped", "this replica does not hold the engine lease")
        else:
            try:
                due = job.work(now)
            except Exception as err:  # noqa: BLE001 - one failing job must not stop the others
                log.exception("scheduled job %s failed; it runs again in %s", job.name, _every(job.every))
                result = JobRun(job.name, now, "failed", f"{type(err).__name__}: {err}")
            else:
                result = JobRun(job.name, now, "done")
                if isinstance(due, dt.datetime) and due > now:
                    # The job's own clock may be frozen (tests): the due time, in real time.
                    self._run_at(name, dt.datetime.now(UTC) + (due - now), key="due")
        self.runs.record(result)
        return result

    def run_all(self) -> list[JobRun]:
        """Every job once, in order (what a start does, synchronously)."""
        return [self.run(name) for name in self._jobs]


def _every(interval: dt.timedelta) -> str:
    seconds = int(interval.total_seconds())
    if seconds and seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds and seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{interval.total_seconds():g} s"


# ------------------------------------------------------------------ the jobs


class LeaderHost(Protocol):
    """What the jobs need from the runtime."""

    config: GpuopsConfig
    fleet: FleetSource
    database: PerThreadDatabase
    signals: SignalsService | None

    @property
    def gateway(self) -> ClusterNodes | None:
        """The home cluster's API, for its cordon marks (None: no cluster)."""

    @property
    def clusters(self) -> ClusterDirectory | None:
        """The other clusters, for the handover (None: one)."""

    def notify(self) -> None: ...

    def roles_in(self, config: GpuopsConfig) -> RoleLookup | None:
        """Who holds which role now in the cluster `config` is about (None: the
        configuration alone)."""


def post_handovers(host: LeaderHost, now: dt.datetime) -> None:
    """Post each rotation's due handover, then remind or escalate unacknowledged ones."""
    if not host.config.rotations:
        return
    service = HandoverService(host.database.get(), host.config, signals=host.signals,
                              others=host.clusters.others if host.clusters is not None else None)
    posted = service.post_due(host.fleet, now=now)
    fired = service.send_reminders(now)
    for view in posted:
        log.info("handover %s queued for %s (%s shift from %s); %s", view.id, view.rotation, view.shift,
                 view.shift_start.isoformat(), msg.audit_head_log(view.audit_head or "unknown"))
    if posted or fired:
        host.notify()


def _each_cluster(host: LeaderHost) -> list[GpuopsConfig]:
    """The configuration as each cluster sees it (its pools' rules decide its requests)."""
    if host.clusters is None:
        return [host.config]
    return [host.clusters.config.for_cluster(name) for name in host.clusters.names()]


def expire_requests(host: LeaderHost, now: dt.datetime) -> None:
    expired = [view for config in _each_cluster(host)
               for view in RequestService(host.database.get(), config).expire_due(now)]
    for view in expired:
        log.info("request %s expired (deadline %s)", view.id, view.expires_at.isoformat())
    if expired:
        host.notify()


def start_window_runs(host: LeaderHost, now: dt.datetime) -> dt.datetime | None:
    """Apply the window rule (workflows.engine.window_start) to each open request: start
    the run of each approved request whose window has begun and not ended, mark missed one
    whose window passed while no replica could start it. Returns the next window start of
    an approved request, when this job should run again."""
    db = host.database.get()
    changed = 0  # runs started and windows marked missed: messages to send
    upcoming: list[dt.datetime] = []
    for config in _each_cluster(host):
        requests = RequestService(db, config)
        runs = RunService(db, requests=RequestService(db, config, roles=host.roles_in(config)),
                          zone=config.display_zone)
        for view in requests.open_requests():
            done = start_at_window(db, view, requests=requests, runs=runs, now=now)
            changed += done.changed
            if done.next_start is not None:
                upcoming.append(done.next_start)
            elif done.outcome == "missed":
                log.warning("request %s missed its window (%s - %s)", view.id, view.window_start,
                            view.window_end)
            elif done.outcome == "not marked missed":
                log.info("request %s not marked missed: %s", view.id, done.refusal)
            elif done.outcome == "frozen":
                # Looked at again every tick, so not logged above debug; `/gpu freeze` named
                # the requests it holds.
                log.debug("run of %s waits: a change freeze covers pool %s", view.id, view.pool)
            elif done.outcome == "not started":
                log.info("run of %s not started: %s", view.id, done.refusal)
            elif done.run is not None:
                log.info("started %s for %s at its window", done.run.id, view.id)
    if changed:
        host.notify()
    return min(upcoming, default=None)


def clear_stale_marks(host: LeaderHost, now: dt.datetime) -> None:
    """Remove gpuops' cordon mark from each node a person uncordoned by hand after its run
    finished (workflows.engine.cordons), so a later cordon is not shown as gpuops'; in
    every cluster gpuops serves that answers."""
    apis: list[tuple[FleetSource, ClusterNodes]] = [(host.fleet, host.gateway)] if host.gateway is not None else []
    if host.clusters is not None:  # every other cluster, through its own API (node names are its own)
        apis += [(source, gateway) for name, source in host.clusters.sources.items()
                 if name != host.clusters.home and (gateway := getattr(source, "gateway", None)) is not None]
    for fleet, gateway in apis:
        try:
            candidates = [n.name for n in fleet.fleet(now).nodes.values() if n.stale_mark_run]
        except ClusterUnreachable:
            continue  # the cluster says so itself; its marks wait for it to answer
        if candidates:
            Cordons(host.database.get(), gateway).clear_stale_marks(candidates, now=now)


def prune_idempotency(host: LeaderHost, now: dt.datetime) -> None:
    """Forget delivery keys, answered deliveries of the inbox (and heartbeats of replicas
    long gone) as old: their key is the inbox's duplicate check as long as they are kept."""
    forgotten = idempotency.prune(host.database.get(), older_than=now - IDEMPOTENCY_KEEP)
    forgotten += inbox.forget_closed(host.database.get(), older_than=now - IDEMPOTENCY_KEEP)
    if forgotten:
        log.info("forgot %d delivery keys older than %s", forgotten, _every(IDEMPOTENCY_KEEP))


def prune_outbox(host: LeaderHost, now: dt.datetime) -> None:
    forgotten = outbox.prune_sent(host.database.get(), older_than=now - OUTBOX_KEEP)
    if forgotten:
        log.info("forgot %d sent messages older than %s", forgotten, _every(OUTBOX_KEEP))


def sample_capacity(host: LeaderHost, now: dt.datetime) -> None:
    """Each pool's GPUs advertised and out, kept a day for `/gpu status <pool> --chart`
    (`storage.capacity`); nothing while the cluster does not answer (a gap in the chart)."""
    try:
        seen = host.fleet.fleet(now)
    except ClusterUnreachable:
        return
    capacity.record_samples(host.database.get(), capacity_now(seen, at=now), cluster=host.config.cluster_name or "",
                    at=now)


def leader_jobs(host: LeaderHost) -> list[Job]:
    """The leader's jobs over `host`'s database (each job thread on its own connection)."""
    return [
        Job("handovers", MINUTE, lambda now: post_handovers(host, now)),
        Job("expiry", MINUTE, lambda now: expire_requests(host, now)),
        Job(WINDOW_STARTS, WINDOW_CHECK, lambda now: start_window_runs(host, now)),
        Job("stale-marks", MINUTE, lambda now: clear_stale_marks(host, now)),
        Job("idempotency", HOUR, lambda now: prune_idempotency(host, now)),
        Job("outbox", HOUR, lambda now: prune_outbox(host, now)),
        Job("capacity", CAPACITY_EVERY, lambda now: sample_capacity(host, now)),
    ]
