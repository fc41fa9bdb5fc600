"""The durable engine: executes runs, wave by wave, node by node, step by step.

What it does, as a runbook:

- A run executes its plan's waves in order. Inside a wave, nodes go in parallel, at most
  `max_parallel_nodes` started and unfinished at once; per node, steps go in order, and a
  step starts only when every earlier step of its node is `done` (so `uncordon` comes
  only after the validation steps before it passed).
- A step moves `pending -> running -> done | failed`. The move to `running` stores the
  step's intent (what `prepare` found and is about to change) and happens BEFORE the
  first side effect; each move is one storage transaction holding the step's
  compare-and-set, an audit row (actor `gpuops`, `k8s_identity` = the gateway's
  Kubernetes identity, detail naming this replica) and an outbox message. Per-object
  intents inside a step (one eviction per pod) are audit rows committed before each
  first call (`StepContext.record`).
- After a crash or a lease change the engine resumes every unfinished run at its current
  step: a step found `running` is re-entered through `advance`, which looks at the
  cluster before acting (workflows.engine.steps), so no side effect is repeated.
- It reacts to the watch cache (FleetCache listeners: any change to a node or a pod on
  it wakes that node's steps) and to its own timers (a heap: retries, deadlines), not to
  a fixed poll. It reads the database every `control_check` for runs started and
  controls (pause, resume, abort) written by other processes, and `wake()` makes it look
  at once.
- Before a wave starts (the first one too), the pool is checked again as it is now
  (workflows.pools.capacity.check_wave): inside its windows and the request's, no node in
  another run's current wave, max_unavailable and min_ready_gpus counting whatever people
  or other runs took out since approval. A wave that does not fit waits, its thread
  told why once per reason, and the run halts if the window ends first. A dry run says
  so and goes on.
- A failing step halts the run: no further steps or waves, nodes left as they are (so a
  drained node stays cordoned), and the reason goes to the run's `halted_reason`, the
  audit log and the request's thread. A step may instead leave its node out (a PDB
  still blocking at the timeout, when the pool says `skip`): that node's remaining steps
  are skipped except its `uncordon`, which gives back what this run cordoned, and the
  run goes on with the other nodes.
- A step whose params say `on_failure: true` is none of its wave's normal work: it runs
  only when a step of its wave fails, before the run halts (a paused run too), and its
  note joins the halt's text (a failed canary's driver object set back); a wave that
  ends well skips it.
- A waiting step may have something to tell (a PDB holding up an eviction, a window
  about to end): it is posted to the request's thread once (per step, or per run).
- Pause lets steps in flight finish and starts nothing new; abort (workflows.engine.runs) ends
  the run at once.
- A change freeze on the run's pool (or the cluster) stops it at the next node boundary:
  nodes under way finish every step (their uncordon too), no further node or wave starts,
  the thread hears why once; when the freeze ends or is lifted the run goes on by itself
  from there (nothing was left half-done), and if its window ended meanwhile it halts
  instead (workflows.pools.freezes). A freeze that lets running runs finish holds only
  runs that have not started a step.
- Only the replica holding the engine lease acts: `lease.held()` is checked before every
  transaction and every side effect; a replica that loses it forgets what it was doing
  and waits, and whoever holds the lease next resumes from the database.
- A dry run sends every mutation with dryRun=All (the API server checks it, persists
  nothing) and records what it would have done; waits are evaluated once and reported.

Outbox messages go to the request's channel and thread (none when the request has no
channel): run events (started, halted, finished) as `post`, step transitions as
`update` (payload `run_id`, so the notifier can keep one status message per run).

Time: the engine is the one place that reads the clock (`clock` for what is stored,
`monotonic` for timers); both are arguments so tests can drive them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import heapq
import itertools
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

from storage import audit, outbox
from storage import freezes as stored_freezes
from storage.freezes import FreezeId
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import Database
from storage.codec import JsonInput
from storage.ids import RunId, StepId
from storage.requests import Request
from storage.runs import Run
from storage.steps import Step, StepKind
from workflows import logfields
from workflows.engine import messages as say
from workflows.engine.lease import EngineLease, LeaseSettings
from workflows.engine.runs import WAITING, nodes_left_cordoned, step_intent, step_params
from workflows.engine.steps import (
    Done,
    Failed,
    LeaseLost,
    LeftOut,
    Notice,
    Outcome,
    StepParamsError,
    Waiting,
    logic_for,
)
from workflows.fleet.assessment import NodeInventory
from workflows.kube.errors import Forbidden, Invalid, KubeError, NotFound
from workflows.kube.gateway import KubeGateway
from workflows.kube.objects import NodeName
from workflows.plans import Plan, plan_from_json
from workflows.pools import freezes
from workflows.pools import messages as gate_say
from workflows.pools.capacity import HOLDING_STATES, ConcurrentWork, WaveGate, check_wave, pool_nodes
from workflows.pools.config import PoolConfig
from workflows.pools.freezes import Freeze

log = logging.getLogger("gpuops.engine")


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass(frozen=True)
class EngineSettings:
    """How the engine behaves; every field has a production default.

    lease: the Lease that elects the one acting replica (namespace, name, duration).
    max_parallel_nodes: nodes of one wave changed at once (the plan's waves decide what
    may go together; this caps it).
    control_check: how often the database is read for runs and controls written by
    other processes.
    resync: a safety net: a waiting step is looked at again after this long even if no
    watch event came.
    api_retry_max: the longest wait between tries after the API did not answer.
    """

    lease: LeaseSettings = LeaseSettings()
    max_parallel_nodes: int = 4
    control_check: dt.timedelta = dt.timedelta(seconds=1)
    resync: dt.timedelta = dt.timedelta(seconds=30)
    api_retry_max: dt.timedelta = dt.timedelta(seconds=30)

    def __post_init__(self) -> None:
        if self.max_parallel_nodes < 1:
            raise ValueError("max_parallel_nodes must be at least 1")


class Lease(Protocol):
    def held(self) -> bool: ...


class NodeSource(Protocol):
    """What the engine reads from the watch cache (workflows.fleet.watchcache.FleetCache)."""

    def add_listener(self, listener: Callable[[str, str, Any], None]) -> None: ...

    def fleet(self, now: dt.datetime) -> Any: ...


class _Changed(Exception):
    """A compare-and-set lost: someone (an abort, another replica) moved the row first."""


@dataclass
class _RunInfo:
    request: Request
    plan: Plan


@dataclass
class _Live:
    """What this process knows about a step in flight, beyond the database."""

    step_id: StepId
    # Per-object intents on record (their audit rows' keys), with when each was recorded.
    intents: dict[str, dt.datetime] = field(default_factory=dict)
    evaluate_now: bool = True
    due: float | None = None
    failures: int = 0
    reason: str | None = None
    # Notices already posted for this step (their outbox dedupe keys).
    noticed: set[str] = field(default_factory=set)
    # The `extended_until` control last evaluated (a new one is looked at at once).
    extended_until: Any = None


class Engine:
    """Runs the unfinished runs of one database against one cluster; see the module doc."""

    def __init__(self, *, db: Database, gateway: KubeGateway, cache: NodeSource, lease: Lease, replica: str,
                 settings: EngineSettings = EngineSettings(),
                 clock: Callable[[], dt.datetime] = _utc_now,
                 monotonic: Callable[[], float] = time.monotonic,
                 on_commit: Callable[[int], None] | None = None,
                 pools: Mapping[str, PoolConfig] | None = None,
                 cluster: str | None = None, home: bool = True) -> None:
        self._db = db
        # With several clusters, each has its engine (one database, one Lease in the home
        # cluster): this one drives the runs of requests for `cluster`, and the home
        # cluster's also those that name none (made before `clusters:` was configured).
        # NB: never another cluster's run: its node names mean other machines here.
        self._cluster = cluster
        self._home = home
        self._gateway = gateway
        self._cache = cache
        self._lease = lease
        self.replica = replica
        self.settings = settings
        self._clock = clock
        self._mono = monotonic
        self._on_commit = on_commit
        # The pools' policies, for the check before every wave; None: no check (only
        # tests of step mechanics and `python -m bot.engine_process` without --config).
        self._pools = pools
        # What each run's next wave waits for, as last told (one line per change).
        self._gated: dict[RunId, str] = {}
        # The freeze each run was last told it is stopped by (its id).
        self._frozen: dict[RunId, Freeze] = {}
        # Runs whose last freeze notice was read back from the audit (after a start).
        self._frozen_read: set[RunId] = set()
        # Steps whose start the API did not answer (logged once, not per try).
        self._cannot_start: set[StepId] = set()
        self._queue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._timers: list[tuple[float, int, StepId]] = []
        self._timer_seq = itertools.count()
        self._live: dict[StepId, _Live] = {}
        self._info: dict[RunId, _RunInfo] = {}
        self._listening = False
        # Counters for logs and tests: transactions committed, passes over the runs made.
        self.commits = 0
        self.passes = 0

    # --- the loop ----------------------------------------------------------------------
    def wake(self, node: str | None = None) -> None:
        """Look at the runs now (thread-safe); `node` marks that node's steps as woken."""
        self._queue.put(node or "")

    def _on_cache_event(self, resource: str, event_type: str, view: Any) -> None:
        if not self._listening or view is None:
            return
        if resource == "nodes":
            self._queue.put(str(view.name))
        elif resource == "pods" and getattr(view, "node_name", None):
            self._queue.put(str(view.node_name))

    def run(self, stop: threading.Event, *, exit_when_idle: bool = False) -> None:
        """Work until `stop` is set (or, with `exit_when_idle`, until no run is left
        unfinished while this replica holds the lease)."""
        if not self._listening:
            self._cache.add_listener(self._on_cache_event)
        self._listening = True
        try:
            while not stop.is_set():
                woken = self._wait()
                if stop.is_set():
                    return
                if not self._lease.held():
                    self._forget("the engine lease is not held")
                    continue
                try:
                    busy = self.run_pass(woken)
                except LeaseLost:
                    self._forget("the engine lease was lost")
                    continue
                except sqlite3.OperationalError as err:  # e.g. the database is locked
                    log.warning("engine pass stopped by the database: %s", err)
                    continue
                if exit_when_idle and not busy:
                    return
        finally:
            self._listening = False

    def _wait(self) -> set[str]:
        timeout = self.settings.control_check.total_seconds()
        if self._timers:
            timeout = max(0.0, min(timeout, self._timers[0][0] - self._mono()))
        woken: set[str] = set()
        try:
            woken.add(self._queue.get(timeout=timeout))
        except queue.Empty:
            return woken
        while True:
            try:
                woken.add(self._queue.get_nowait())
            except queue.Empty:
                break
        woken.discard("")
        return woken

    def _forget(self, why: str) -> None:
        if self._live:
            log.warning("%s: %s; %d steps in flight are left to the next holder", self.replica, why, len(self._live))
        self._live.clear()
        self._timers.clear()
        self._info.clear()
        self._gated.clear()
        self._frozen.clear()
        self._frozen_read.clear()
        self._cannot_start.clear()

    def run_pass(self, woken: AbstractSet[str] = frozenset()) -> bool:
        """Drive every unfinished run once; True if any is left unfinished."""
        self.passes += 1
        now_mono = self._mono()
        due: set[StepId] = set()
        while self._timers and self._timers[0][0] <= now_mono:
            due.add(heapq.heappop(self._timers)[2])
        runs = self._unfinished()
        seen: set[StepId] = set()
        evaluated: set[StepId] = set()  # a waiting step is looked at once per pass
        for run in runs:
            self._drive(run, woken, due, seen, evaluated)
        for step_id in set(self._live) - seen:
            self._live.pop(step_id, None)
        return bool(self._unfinished())

    def _ours(self, request: Request) -> bool:
        """Whether `request` changes this engine's cluster."""
        return request.cluster == self._cluster or (self._home and request.cluster is None)

    def _unfinished(self) -> list[Run]:
        """This cluster's unfinished runs."""
        return [run for run in stored_runs.unfinished(self._db) if self._ours(self._run_info(run).request)]

    # --- one run -----------------------------------------------------------------------
    def _drive(self, run: Run, woken: AbstractSet[str], due: set[StepId], seen: set[StepId],
               evaluated: set[StepId]) -> None:
        info = self._current_info(run)
        with logfields.bound(request_id=info.request.id, run_id=run.id):
            for _ in range(10_000):  # each turn commits something or returns
                current = stored_runs.get(self._db, id=run.id)
                if current is None or current.state not in ("pending", "running", "paused"):
                    return
                run = current
                try:
                    if not self._turn(run, info, woken, due, seen, evaluated):
                        return
                except _Changed:
                    continue

    def _turn(self, run: Run, info: _RunInfo, woken: AbstractSet[str], due: set[StepId], seen: set[StepId],
              evaluated: set[StepId]) -> bool:
        """One decision about the run; True if it committed something (look again)."""
        if run.state == "pending":
            if self._frozen_now(run, info, ()) is not None:
                return False  # a change freeze: the run starts when it ends
            self._start_run(run, info)
            return True
        steps = stored_steps.for_run(self._db, run_id=run.id)
        if not steps:
            self._finish_run(run, info, steps)
            return False
        failed = next((s for s in steps if s.state == "failed" and not on_failure(s)), None)
        if failed is not None:
            fallback = _fallback_of(failed, steps)
            if fallback is not None:  # it runs before the run halts
                return self._run_fallback(run, info, fallback, steps, due, seen, evaluated)
            self._halt(run, info, failed, failed.error or "failed")  # not yet turned into a halt (defensive)
            return False
        if run.current_wave is None:
            if run.state == "paused":
                return False
            first = min(s.wave for s in steps)
            freeze = self._frozen_now(run, info, steps)
            if freeze is not None:
                self._halt_if_window_ended(run, info, freeze, steps, wave=first)
                return False
            if not self._wave_may_start(run, info, steps, first):
                return False
            self._enter_wave(run, info, steps, None, first)
            return True
        # A step that runs only when its wave fails is none of the wave's normal work.
        wave_steps = [s for s in steps if s.wave == run.current_wave and not on_failure(s)]

        progressed = False
        for step in wave_steps:
            if step.state != "running":
                continue
            seen.add(step.id)
            live = self._live.get(step.id)
            if live is None:
                live = self._adopt(run, info, step)
            elif not live.evaluate_now and (step.id in evaluated or not (
                    step.node in woken or step.id in due or (live.due is not None and live.due <= self._mono())
                    # NB: `drain done` (RunService.release_hold) is a control written to the
                    # step's params, maybe by another process: look at once, not at the old due.
                    # So is a drain's extension (workflows.requests.extension), once.
                    or step_params(step).get("released_at")
                    or step_params(step).get("extended_until") != live.extended_until)):
                continue
            evaluated.add(step.id)
            with logfields.bound(step_id=step.id, step=step.kind, node=step.node):
                outcome = self._evaluate(run, info, step, live, steps)
                if isinstance(outcome, Done):
                    self._finish_step(run, info, step, outcome)
                    progressed = True
                elif isinstance(outcome, Failed):
                    # NB: True when the wave's fallback step runs first (the next turn starts it).
                    return self._halt(run, info, step, outcome.reason, detail=outcome.detail)
                elif isinstance(outcome, LeftOut):
                    self._leave_out(run, info, step, outcome)
                    progressed = True
                else:
                    self._show_waiting(run, info, step, live, outcome.reason)
                    if outcome.notice is not None:
                        self._tell(run, info, step, live, outcome.notice)
        if progressed:
            return True

        if run.state == "paused":
            return False  # steps in flight were looked at above; nothing new starts
        # A change freeze: the nodes under way finish every step; no node or wave starts.
        freeze = self._frozen_now(run, info, steps)
        if self._start_next(run, info, wave_steps, steps, frozen=freeze is not None):
            return True

        last_done = (all(s.state in ("done", "skipped") for s in wave_steps)
                     and not any(s.wave > run.current_wave for s in steps))
        if freeze is not None and not last_done:  # a run whose last node is done still finishes
            self._halt_if_window_ended(run, info, freeze, steps, wave=run.current_wave)
            return False
        if all(s.state in ("done", "skipped") for s in wave_steps):
            later = sorted({s.wave for s in steps if s.wave > run.current_wave})
            if later:
                if not self._wave_may_start(run, info, steps, later[0]):
                    return False
                self._enter_wave(run, info, steps, run.current_wave, later[0])
                return True
            self._finish_run(run, info, steps)
        return False

    def _start_next(self, run: Run, info: _RunInfo, wave_steps: list[Step], steps: list[Step], *,
                    frozen: bool = False) -> bool:
        """Start the next step of every node that may take one now (each its own commit;
        reading the run's steps again between them would cost a read per node); True if
        any started, or one failed to (the run halted: nothing more starts). `frozen`: a
        change freeze holds the run, so only nodes already under way go on."""
        by_node: dict[str, list[Step]] = {}
        for step in sorted(wave_steps, key=lambda s: s.seq):
            by_node.setdefault(step.node, []).append(step)
        in_progress = sum(1 for node_steps in by_node.values()
                          if any(s.state != "pending" for s in node_steps)
                          and not all(s.state in ("done", "skipped") for s in node_steps))
        free = self.settings.max_parallel_nodes - in_progress
        wave = next((w for w in info.plan.waves if w.index == run.current_wave), None)
        order = list(wave.nodes) if wave else sorted(by_node)
        order += [n for n in sorted(by_node) if n not in order]
        started = False
        for node in order:
            node_steps = by_node.get(node, [])
            if any(s.state == "running" for s in node_steps):
                continue
            following = next((s for s in node_steps if s.state == "pending"), None)
            if following is None:
                continue
            earlier = [s for s in node_steps if s.seq < following.seq]
            if any(s.state != "done" for s in earlier) and not (
                    following.kind == "uncordon" and _left_out(earlier)
                    and all(s.state in ("done", "skipped") for s in earlier)):
                continue  # fail closed: only after every earlier step of the node is done
            if not any(s.state != "pending" for s in node_steps):
                if frozen:
                    continue  # the node boundary: a freeze starts no new node
                if free <= 0:
                    continue
                free -= 1
            if self._start_step(run, info, following, steps):
                started = True
                if following.id not in self._live:
                    return True  # it halted the run
        return started

    # --- transitions -----------------------------------------------------------------------
    @contextlib.contextmanager
    def _commit(self) -> Iterator[None]:
        """One storage transaction, written only while this replica holds the lease."""
        self._check_lease()
        with self._db.transaction():
            yield
        self.commits += 1
        if self._on_commit is not None:
            self._on_commit(self.commits)

    def _check_lease(self) -> None:
        if not self._lease.held():
            raise LeaseLost(f"{self.replica} does not hold the engine lease")

    def _start_run(self, run: Run, info: _RunInfo) -> None:
        now = self._clock()
        with self._commit():
            if not stored_runs.transition(self._db, id=run.id, expected="pending", new="running", at=now):
                raise _Changed()
            text = say.run_started(run.id, info.request.id, len(info.plan.nodes), len(info.plan.waves),
                                   dry_run=run.dry_run)
            self._audit(run, info, action="run.started", target=info.request.pool, before="pending",
                        after="running", detail={"text": text})
            self._notify(run, info, event="run.started", state="running", text=text, kind="post",
                         dedupe=f"{run.id}/started")
        log.info("%s: %s", self.replica, text)

    def _frozen_now(self, run: Run, info: _RunInfo, steps: Sequence[Step]) -> Freeze | None:
        """The change freeze that keeps the run from starting its next node now, if any
        (workflows.pools.freezes; a freeze that lets running runs finish holds only runs
        with nothing under way or done). The thread hears it once per freeze, and again
        when the freeze is over and the run goes on by itself."""
        now = self._clock()
        started = run.state != "pending" and any(s.state != "pending" for s in steps)
        freeze = freezes.holding_run(self._db, pool=info.request.pool, started=started, now=now,
                                     cluster=info.request.cluster)
        told = self._told_frozen(run)
        if freeze is None:
            if told is not None:
                del self._frozen[run.id]
                text = gate_say.run_unfrozen(run_id=run.id, target=told.target)
                with self._commit():
                    stored_runs.set_waiting(self._db, id=run.id, waiting=None)
                    self._audit(run, info, action="run.unfrozen", target=info.request.pool, before=run.state,
                                after=run.state, detail={"freeze": told.id, "text": text})
                    self._notify(run, info, event="run.unfrozen", state=run.state, text=text, kind="post",
                                 dedupe=f"{run.id}/unfrozen/{told.id}")
                log.info("%s: %s", self.replica, text)
            return None
        if told is None or told.id != freeze.id:
            touched = {s.node for s in steps if s.state != "pending"}
            unfinished = {s.node for s in steps if s.state not in ("done", "skipped")}
            under_way = sorted(touched & unfinished)
            text = gate_say.run_frozen(run_id=run.id, target=freeze.target, by=freeze.set_by_name,
                                       until=freeze.until, reason=freeze.reason, in_flight=under_way)
            with self._commit():
                self._audit(run, info, action="run.frozen", target=info.request.pool, before=run.state,
                            after=run.state, detail={"freeze": freeze.id, "freeze_target": freeze.target,
                                                     "until": freeze.until.isoformat(), "in_flight": under_way,
                                                     "text": text})
                self._notify(run, info, event="run.frozen", state=run.state, text=text, kind="post",
                             dedupe=f"{run.id}/frozen/{freeze.id}")
            self._frozen[run.id] = freeze
            log.info("%s: %s", self.replica, text)
        self._say_waiting(run, gate_say.run_waits_for_freeze(target=freeze.target, by=freeze.set_by_name,
                                                             until=freeze.until, reason=freeze.reason,
                                                             cluster=freeze.cluster))
        return freeze

    def _say_waiting(self, run: Run, text: str | None) -> None:
        """Keep what the run waits for before its next node or wave (`runs.waiting`: the
        request view and App Home show it), written when it changes, not at every look."""
        if run.waiting != text:
            with self._commit():
                stored_runs.set_waiting(self._db, id=run.id, waiting=text)

    def _told_frozen(self, run: Run) -> Freeze | None:
        """The freeze the run's thread was last told holds it: remembered, or, the first
        time a (re)started engine looks at the run, read back from the audit (its last
        `run.frozen` not followed by `run.unfrozen`). So a restart neither tells (and
        audits) the freeze again nor forgets to say that the run goes on."""
        if run.id not in self._frozen and run.id not in self._frozen_read:
            self._frozen_read.add(run.id)
            last = next((e for e in reversed(audit.for_run(self._db, run.id))
                         if e.action in ("run.frozen", "run.unfrozen")), None)
            if last is not None and last.action == "run.frozen" and isinstance(last.detail, dict):
                freeze_id = last.detail.get("freeze")
                told = stored_freezes.get(self._db, id=FreezeId(freeze_id)) if isinstance(freeze_id, int) else None
                if told is not None:
                    self._frozen[run.id] = told
        return self._frozen.get(run.id)

    def _halt_if_window_ended(self, run: Run, info: _RunInfo, freeze: Freeze, steps: Sequence[Step], *,
                              wave: int) -> None:
        """A run a freeze holds past its window's end halts once no node is under way: it
        must not start nodes outside the window it was approved for."""
        end = info.request.window_end
        if end is None or self._clock() < end or run.state != "running":
            return
        by_node: dict[str, list[Step]] = {}
        for step in steps:
            if not on_failure(step):
                by_node.setdefault(step.node, []).append(step)
        if any(any(s.state != "pending" for s in node) and not all(s.state in ("done", "skipped") for s in node)
               for node in by_node.values()):
            return  # a node under way finishes first
        self._halt_run(run, info, gate_say.run_window_ended_while_frozen(run_id=run.id, target=freeze.target,
                                                                         window_end=end), wave=wave)
        self._frozen.pop(run.id, None)

    def _wave_may_start(self, run: Run, info: _RunInfo, steps: Sequence[Step], wave: int) -> bool:
        """Check the pool again before a wave (the first one too): windows, other runs on
        its nodes, max_unavailable and min_ready_gpus on the pool as it is now. A wave
        that does not fit waits (the thread hears why, once per reason) and the run
        halts when the window ends; a dry run reports it and goes on."""
        if self._pools is None:
            return True
        verdict = self._wave_gate(run, info, steps, wave)
        if verdict.fits:
            if self._gated.pop(run.id, None) is not None:
                log.info("%s: run %s: wave %d fits now", self.replica, run.id, wave + 1)
            self._say_waiting(run, None)
            return True
        reason = verdict.reason or ""
        if verdict.over and not run.dry_run:
            self._halt_run(run, info, reason, wave=wave)
            return False
        if self._gated.get(run.id) != reason:
            with self._commit():
                text = say.dry_run_wave_would_wait(reason) if run.dry_run else reason
                self._audit(run, info, action="run.waiting", target=info.request.pool, before=run.current_wave,
                            after=run.current_wave, detail={"wave": wave, "rule": verdict.rule, "text": text})
                self._notify(run, info, event="run.waiting", state=run.state, text=text, kind="post",
                             dedupe=f"{run.id}/wave/{wave}/waits/{verdict.rule}")
            self._gated[run.id] = reason
            log.info("%s: run %s: %s", self.replica, run.id, reason)
        if not run.dry_run:
            self._say_waiting(run, reason)
        return run.dry_run

    def _wave_gate(self, run: Run, info: _RunInfo, steps: Sequence[Step], wave: int) -> WaveGate:
        assert self._pools is not None
        request = info.request
        policy = self._pools.get(request.pool)
        if policy is None:
            return WaveGate("window", gate_say.pool_gone(wave, request.pool))
        now = self._clock()
        nodes = sorted({NodeName(s.node) for s in steps if s.wave == wave})
        concurrent: list[ConcurrentWork] = []
        for other in stored_requests.in_states(self._db, states=HOLDING_STATES):
            if other.pool != request.pool or other.id == request.id or not self._ours(other):
                continue
            other_plan = plan_from_json(other.plan)
            concurrent.append(ConcurrentWork(label=str(other.id), start=other.window_start, end=other.window_end,
                                             waves=tuple(tuple(w.nodes) for w in other_plan.waves)))
        busy: dict[NodeName, str] = {}
        for other_run in self._unfinished():
            if other_run.id == run.id or other_run.current_wave is None:
                continue  # NB: a run's later waves touch nothing yet (two queued runs never deadlock)
            for step in stored_steps.for_run(self._db, run_id=other_run.id, wave=other_run.current_wave):
                if step.node in nodes and step.state in ("pending", "running"):
                    busy[NodeName(step.node)] = str(other_run.id)
        members = pool_nodes(self._cache.fleet(now), request.pool)
        # The cordons this run takes over (a rollback's, a continuation's) are its own.
        undone = {str(step_params(s)["takes_over"]) for s in steps
                  if s.kind == "cordon" and step_params(s).get("takes_over")}
        mine = {s.node for s in steps}
        taken_over = frozenset(n.name for n in members if n.cordon_run in undone and n.name in mine)
        return check_wave(pool=request.pool, wave=wave, nodes=nodes, pool_nodes=members, now=now,
                          window_end=request.window_end, allowed_now=policy.window_set.contains(now),
                          max_unavailable=policy.unavailable_budget, min_ready_gpus=policy.min_ready_gpus,
                          concurrent=concurrent, busy=busy, taken_over=taken_over)

    def _enter_wave(self, run: Run, info: _RunInfo, steps: Sequence[Step], old: int | None, new: int) -> None:
        nodes = sorted({s.node for s in steps if s.wave == new})
        with self._commit():
            if not stored_runs.advance_wave(self._db, id=run.id, expected_wave=old, wave=new):
                raise _Changed()
            self._skip_fallbacks(steps, now=self._clock(), before=new)
            text = say.wave_started(new, nodes, **wave_progress(steps, new, started=run.started_at,
                                                                now=self._clock()))
            self._audit(run, info, action="run.wave", target=info.request.pool, before=old, after=new,
                        detail={"nodes": nodes, "text": text})
            self._notify(run, info, event="run.wave", state=run.state, text=text, kind="post",
                         dedupe=f"{run.id}/wave/{new}")

    def _start_step(self, run: Run, info: _RunInfo, step: Step, steps: Sequence[Step]) -> bool:
        live = _Live(step_id=step.id)
        ctx = _StepContext(self, run, info, step, live, steps, intent={})
        logic = logic_for(step.kind)
        try:
            intent = logic.prepare(ctx)
            logic.timeout(ctx)  # refuse unusable params before anything starts
        except StepParamsError as err:
            self._halt(run, info, step, say.bad_params(str(err)))
            return True
        except (Forbidden, Invalid, NotFound) as err:
            self._halt(run, info, step, say.api_refused(str(err)))
            return True
        except KubeError as err:
            if step.id not in self._cannot_start:  # one line when it starts failing, not one per try
                log.warning("%s: cannot start %s on %s yet: %s", self.replica, step.kind, step.node, err)
            self._cannot_start.add(step.id)
            return False
        if step.id in self._cannot_start:
            self._cannot_start.discard(step.id)
            log.info("%s: the API answers again; starting %s on %s", self.replica, step.kind, step.node)
        now = self._clock()
        detail = {"params": step_params(step), "intent": intent}
        with self._commit():
            self._check_controls(step, live)
            if not stored_steps.transition(self._db, id=step.id, expected="pending", new="running", at=now,
                                           detail=detail):
                raise _Changed()
            text = say.step_started(step.kind, step.node, dry_run=run.dry_run)
            self._audit(run, info, action="step.running", target=step.node, before="pending", after="running",
                        detail={"step": step.id, "kind": step.kind, "intent": intent})
            self._notify(run, info, event="step.running", state="running", text=text, kind="update",
                         dedupe=f"{run.id}/step/{step.id}/running", node=step.node)
        self._live[step.id] = live
        log.info("%s: %s", self.replica, text)
        return True

    def _adopt(self, run: Run, info: _RunInfo, step: Step) -> _Live:
        """A step found running that this process did not start: after a restart or a
        lease change. Its earlier per-object intents come back from the audit log."""
        live = _Live(step_id=step.id)
        for entry in audit.for_run(self._db, run.id):
            detail = entry.detail if isinstance(entry.detail, dict) else {}
            if detail.get("step") == step.id and isinstance(key := detail.get("intent_key"), str):
                live.intents.setdefault(key, entry.at)
        with self._commit():
            self._audit(run, info, action="step.resumed", target=step.node, before="running", after="running",
                        detail={"step": step.id, "kind": step.kind, "attempt": step.attempt,
                                "text": say.step_resumed(step.kind, step.node, self.replica)})
        self._live[step.id] = live
        log.info("%s: resuming %s on %s (step %s)", self.replica, step.kind, step.node, step.id)
        return live

    def _evaluate(self, run: Run, info: _RunInfo, step: Step, live: _Live, steps: Sequence[Step]) -> Outcome:
        ctx = _StepContext(self, run, info, step, live, steps, intent=step_intent(step))
        logic = logic_for(step.kind)
        live.evaluate_now = False
        live.extended_until = step_params(step).get("extended_until")
        outcome: Outcome
        try:
            ctx.timeout = logic.timeout(ctx)
            ctx.deadline = (step.started_at or ctx.now) + ctx.timeout if ctx.timeout is not None else None
            outcome = logic.advance(ctx)
            live.failures = 0
        except LeaseLost:
            raise
        except StepParamsError as err:
            outcome = Failed(say.bad_params(str(err)))
        except (Forbidden, Invalid, NotFound) as err:
            outcome = Failed(say.api_refused(str(err)))
        except KubeError as err:
            live.failures += 1
            retry = min(self.settings.api_retry_max.total_seconds(), 0.5 * 2 ** live.failures)
            outcome = Waiting(say.api_unreachable(str(err)), retry_in=retry)
        if isinstance(outcome, Waiting):
            if ctx.expired and not outcome.overdue_ok:
                return Failed(say.step_timed_out(ctx.timeout, outcome.reason))
            delay = outcome.retry_in if outcome.retry_in is not None else self.settings.resync.total_seconds()
            if ctx.deadline is not None and not outcome.overdue_ok:
                delay = min(delay, max(0.0, (ctx.deadline - ctx.now).total_seconds()) + 0.05)
            live.due = self._mono() + delay
            heapq.heappush(self._timers, (live.due, next(self._timer_seq), step.id))
        return outcome

    def _finish_step(self, run: Run, info: _RunInfo, step: Step, outcome: Done) -> None:
        now = self._clock()
        detail: dict[str, JsonInput] = {"params": step_params(step), "intent": step_intent(step),
                                        "note": outcome.note, "result": dict(outcome.detail)}
        with self._commit():
            self._check_controls(step, self._live.get(step.id))
            if not stored_steps.transition(self._db, id=step.id, expected="running", new="done", at=now,
                                           detail=detail):
                raise _Changed()
            text = say.step_done(step.kind, step.node, outcome.note)
            self._audit(run, info, action="step.done", target=step.node, before="running", after="done",
                        detail={"step": step.id, "kind": step.kind, "note": outcome.note,
                                "result": dict(outcome.detail)})
            self._notify(run, info, event="step.done", state="done", text=text, kind="update",
                         dedupe=f"{run.id}/step/{step.id}/done", node=step.node)
        self._live.pop(step.id, None)
        log.info("%s: %s", self.replica, text)

    def _check_controls(self, step: Step, live: _Live | None) -> None:
        """Inside the transaction that moves `step`: a control written into its params
        since it was read (`drain done`, a drain's extension, maybe by another process)
        is looked at again before the step starts or ends, and is never written over."""
        current = stored_steps.get(self._db, id=step.id)
        if current is not None and step_params(current) != step_params(step):
            if live is not None:
                live.evaluate_now = True
            raise _Changed()

    def _leave_out(self, run: Run, info: _RunInfo, step: Step, outcome: LeftOut) -> None:
        """Skip what is left of the step's node, except the uncordon that gives it back."""
        now = self._clock()
        node_steps = [s for s in stored_steps.for_run(self._db, run_id=run.id) if s.node == step.node]
        uncordon_next = any(s.kind == "uncordon" and s.state == "pending" for s in node_steps)
        text = say.node_left_out(outcome.reason, uncordon_next=uncordon_next)
        detail: dict[str, JsonInput] = {"params": step_params(step), "intent": step_intent(step), "note": text,
                                        "result": {**outcome.detail, LEFT_OUT: True}}
        with self._commit():
            if not stored_steps.transition(self._db, id=step.id, expected="running", new="skipped", at=now,
                                           detail=detail, error=outcome.reason):
                raise _Changed()
            for other in node_steps:
                if other.state == "pending" and other.kind != "uncordon":
                    stored_steps.transition(self._db, id=other.id, expected="pending", new="skipped", at=now)
            self._audit(run, info, action="node.left_out", target=step.node, before="running", after="skipped",
                        detail={"step": step.id, "kind": step.kind, "reason": outcome.reason, "text": text})
            self._notify(run, info, event="node.left_out", state=run.state, text=text, kind="post",
                         dedupe=f"{run.id}/step/{step.id}/left-out", node=step.node)
        # NB: no _live.pop here: the step is no longer running, and run_pass forgets what it no longer sees.
        log.warning("%s: %s", self.replica, text)

    def _show_waiting(self, run: Run, info: _RunInfo, step: Step, live: _Live, reason: str) -> None:
        """Keep what a running step waits for in its detail (`/gpu request` and the
        request's card show it), written when it changes, not at every look."""
        if live.reason == reason:
            return
        with self._commit():
            current = stored_steps.get(self._db, id=step.id)  # NB: `drain done` may have written it
            if current is None or current.state != "running":
                return
            detail = dict(current.detail) if isinstance(current.detail, dict) else {}
            if detail.get(WAITING) != reason:
                detail[WAITING] = reason
                stored_steps.replace_detail(self._db, id=step.id, expected="running", detail=detail)
                self._notify(run, info, event="step.waiting", state="running", text=reason, kind="update",
                             dedupe=None, node=step.node)
        live.reason = reason

    def _tell(self, run: Run, info: _RunInfo, step: Step, live: _Live, notice: Notice) -> None:
        """Post a waiting step's notice to the thread, once (the outbox dedupes by key,
        across restarts too; `live.noticed` spares the transaction)."""
        key = f"{run.id}/notice/{notice.key}" if notice.per_run else f"{run.id}/step/{step.id}/{notice.key}"
        if notice.again_for is not None:
            key += f"/{notice.again_for}"
        if key in live.noticed:
            return
        with self._commit():
            self._notify(run, info, event=f"step.{notice.key}", state=run.state, text=notice.text, kind="post",
                         dedupe=key, node=None if notice.per_run else step.node)
        live.noticed.add(key)

    def _halt(self, run: Run, info: _RunInfo, step: Step, reason: str,
              detail: Mapping[str, Any] | None = None) -> bool:
        """The step failed: the run stops here, every node left as it is; unless its wave
        has a step that runs on a failure (`on_failure`) still to run: then only the step
        fails now, and the run halts once that one has ended. True in that case."""
        now = self._clock()
        with self._commit():
            if step.state in ("pending", "running"):
                step_detail: dict[str, JsonInput] = {"params": step_params(step), "intent": step_intent(step),
                                                     "note": reason, "result": dict(detail or {})}
                if not stored_steps.transition(self._db, id=step.id, expected=step.state, new="failed", at=now,
                                               detail=step_detail, error=reason):
                    raise _Changed()
                self._audit(run, info, action="step.failed", target=step.node, before=step.state, after="failed",
                            detail={"step": step.id, "kind": step.kind, "reason": reason})
            steps = stored_steps.for_run(self._db, run_id=run.id)
            if not on_failure(step) and _fallback_of(step, steps) is not None:
                return True
            failed = step if not on_failure(step) else next(
                (s for s in steps if s.state == "failed" and not on_failure(s)), step)
            why = reason if failed is step else (failed.error or "failed")
            after = _fallback_note(failed, steps)
            self._fail_run(run, info, now, stopped=say.halted_elsewhere(failed.node),
                           text=lambda left: say.halted(failed.node, failed.kind, why, left_cordoned=left,
                                                        after=after),
                           detail={"node": failed.node, "kind": failed.kind, "reason": why,
                                   **({"after": after} if after else {})})
        return False

    def _run_fallback(self, run: Run, info: _RunInfo, step: Step, steps: Sequence[Step], due: set[StepId],
                      seen: set[StepId], evaluated: set[StepId]) -> bool:
        """A step of the wave failed: run the wave's `on_failure` step (a failed canary's
        driver version set back) to its end before the run halts. Like any step, its start
        and end are commits of their own, so a restart in between resumes it."""
        if step.state == "pending":
            return self._start_step(run, info, step, steps)
        seen.add(step.id)
        live = self._live.get(step.id)
        if live is None:
            live = self._adopt(run, info, step)
        elif not live.evaluate_now and (step.id in evaluated or not (
                step.id in due or (live.due is not None and live.due <= self._mono()))):
            return False
        evaluated.add(step.id)
        with logfields.bound(step_id=step.id, step=step.kind, node=step.node):
            outcome = self._evaluate(run, info, step, live, steps)
            if isinstance(outcome, Done):
                self._finish_step(run, info, step, outcome)
                return True
            if isinstance(outcome, (Failed, LeftOut)):
                self._halt(run, info, step, outcome.reason, detail=outcome.detail)
                return False
            self._show_waiting(run, info, step, live, outcome.reason)
            if outcome.notice is not None:
                self._tell(run, info, step, live, outcome.notice)
        return False

    def _halt_run(self, run: Run, info: _RunInfo, reason: str, *, wave: int) -> None:
        """The run cannot go on (its next wave missed the window): it stops before that
        wave, every node left as it is."""
        with self._commit():
            self._fail_run(run, info, self._clock(), stopped=reason,
                           text=lambda left: say.halted_before_wave(reason, left_cordoned=left),
                           detail={"wave": wave, "reason": reason})
        self._gated.pop(run.id, None)

    def _fail_run(self, run: Run, info: _RunInfo, now: dt.datetime, *, stopped: str,
                  text: Callable[[tuple[str, ...]], str], detail: Mapping[str, Any]) -> None:
        """Inside a transaction: unfinished steps stopped, the run and its request failed,
        audited and told, with the nodes the run leaves cordoned."""
        stored_steps.stop_unfinished(self._db, stored_steps.for_run(self._db, run_id=run.id), at=now, error=stopped)
        left = nodes_left_cordoned(run, stored_steps.for_run(self._db, run_id=run.id))
        said = text(left)
        if not stored_runs.transition(self._db, id=run.id, expected=("running", "paused"), new="failed", at=now,
                                      halted_reason=said):
            raise _Changed()
        stored_requests.transition(self._db, id=info.request.id, expected="running", new="failed", at=now)
        self._audit(run, info, action="run.failed", target=info.request.pool, before=run.state, after="failed",
                    detail={**detail, "left_cordoned": list(left), "text": said})
        self._notify(run, info, event="run.failed", state="failed", text=said, kind="post",
                     dedupe=f"{run.id}/failed", halted_on=detail.get("kind"))
        for other in stored_steps.for_run(self._db, run_id=run.id):
            self._live.pop(other.id, None)
        log.warning("%s: run %s halted: %s", self.replica, run.id, said)

    def _skip_fallbacks(self, steps: Sequence[Step], *, now: dt.datetime, before: int | None = None) -> None:
        """Inside a transaction: the `on_failure` steps of waves that ended without a
        failure (before wave `before`; all of them when the run ends) will never run."""
        for step in steps:
            if on_failure(step) and step.state == "pending" and (before is None or step.wave < before):
                stored_steps.transition(self._db, id=step.id, expected="pending", new="skipped", at=now)

    def _finish_run(self, run: Run, info: _RunInfo, steps: Sequence[Step]) -> None:
        now = self._clock()
        still = sorted({s.node for s in steps if s.kind == "cordon" and s.state == "done"
                        and (step_intent(s).get("prior_unschedulable") or "other_mark" in step_intent(s))})
        left_out = sorted({s.node for s in steps if _left_out([s])})
        text = say.run_succeeded(run.id, dry_run=run.dry_run, left_cordoned=[] if run.dry_run else still,
                                 left_out=left_out)
        with self._commit():
            if not stored_runs.transition(self._db, id=run.id, expected=("running", "paused"), new="succeeded",
                                          at=now):
                raise _Changed()
            self._skip_fallbacks(steps, now=now)
            stored_requests.transition(self._db, id=info.request.id, expected="running", new="done", at=now)
            self._audit(run, info, action="run.succeeded", target=info.request.pool, before=run.state,
                        after="succeeded", detail={"text": text})
            self._notify(run, info, event="run.succeeded", state="succeeded", text=text, kind="post",
                         dedupe=f"{run.id}/succeeded")
        log.info("%s: %s", self.replica, text)

    # --- records -----------------------------------------------------------------------------
    def _audit(self, run: Run, info: _RunInfo, *, action: str, target: str, before: Any, after: Any,
               detail: Mapping[str, Any]) -> audit.AuditEntry:
        return audit.append(self._db, actor=audit.GPUOPS_ACTOR, k8s_identity=self._gateway.identity,
                            action=action, target=target, at=self._clock(), request_id=info.request.id,
                            run_id=run.id, before=before, after=after,
                            detail={**detail, "replica": self.replica, "dry_run": run.dry_run})

    def _notify(self, run: Run, info: _RunInfo, *, event: str, state: str, text: str, kind: outbox.MessageKind,
                dedupe: str | None, node: str | None = None, halted_on: str | None = None) -> None:
        request = info.request
        if request.channel is None:
            return
        payload: dict[str, Any] = {"event": event, "request_id": request.id, "run_id": run.id,
                                   "pool": request.pool, "kind": request.kind, "state": state, "text": text,
                                   "dry_run": run.dry_run}
        if node is not None:
            payload["node"] = node
        if halted_on is not None:  # the step kind a halted run failed on (its runbook)
            payload["halted_on"] = halted_on
        outbox.enqueue(self._db, channel=request.channel, thread_ts=request.thread_ts, kind=kind,
                       payload=payload, at=self._clock(), dedupe_key=dedupe)

    def _current_info(self, run: Run) -> _RunInfo:
        """`_run_info` with the request read again: a running drain's extension moves its
        window end (and plan hash), which the wave gate and a frozen run's halt read."""
        info = self._run_info(run)
        request = stored_requests.get(self._db, id=run.request_id)
        if request is not None and (request.window_end, request.plan_hash) != (info.request.window_end,
                                                                                info.request.plan_hash):
            info = _RunInfo(request=request, plan=plan_from_json(request.plan))
            self._info[run.id] = info
        return info

    def _run_info(self, run: Run) -> _RunInfo:
        info = self._info.get(run.id)
        if info is None:
            request = stored_requests.get(self._db, id=run.request_id)
            if request is None:
                raise RuntimeError(f"run {run.id} names request {run.request_id}, which does not exist")
            info = _RunInfo(request=request, plan=plan_from_json(request.plan))
            self._info[run.id] = info
        return info

    def record_intent(self, run: Run, info: _RunInfo, step: Step, live: _Live, *, key: str, action: str,
                      target: str, detail: Mapping[str, Any]) -> None:
        if key in live.intents:
            return
        with self._commit():
            self._audit(run, info, action=action, target=target, before=None, after=None,
                        detail={**detail, "step": step.id, "kind": step.kind, "intent_key": key})
        live.intents[key] = self._clock()

    def node_inventory(self, node: str, now: dt.datetime) -> NodeInventory | None:
        fleet = self._cache.fleet(now)
        return fleet.nodes.get(NodeName(node))


LEFT_OUT = "left_out"
# A step's param: it runs only when a step of its wave fails, and the run halts after it.
ON_FAILURE = "on_failure"


def on_failure(step: Step) -> bool:
    """Whether `step` runs only when a step of its wave fails (a failed canary's driver
    version set back): never in the wave's order, skipped when the wave ends well."""
    return step_params(step).get(ON_FAILURE) is True


def _fallback_of(failed: Step, steps: Sequence[Step]) -> Step | None:
    """The `on_failure` step still to run (or running) for a failure of `failed`'s wave."""
    return next((s for s in steps if on_failure(s) and s.wave == failed.wave
                 and s.state in ("pending", "running")), None)


def _fallback_note(failed: Step, steps: Sequence[Step]) -> str | None:
    """What the wave's `on_failure` step did after `failed` failed, for the halt's text."""
    ran = next((s for s in steps if on_failure(s) and s.wave == failed.wave and s.state in ("done", "failed")), None)
    if ran is None:
        return None
    if ran.state == "failed":
        return say.fallback_failed(ran.kind, ran.error or "failed")
    detail = ran.detail if isinstance(ran.detail, dict) else {}
    note = detail.get("note")
    return str(note) if note else None


def wave_progress(steps: Sequence[Step], wave: int, *, started: dt.datetime | None,
                  now: dt.datetime) -> dict[str, Any]:
    """Where a run stands as `wave` starts: its place among the run's waves, the nodes of
    the waves before it, and the time left at the pace of those waves (None before any
    has finished)."""
    waves = sorted({s.wave for s in steps})
    before = [w for w in waves if w < wave]
    nodes = {s.node for s in steps}
    done = {s.node for s in steps if s.wave in before}
    eta = None
    if before and started is not None:
        eta = (now - started) / len(before) * (len(waves) - len(before))
    return {"position": waves.index(wave) + 1, "waves": len(waves), "nodes_done": len(done),
            "nodes_total": len(nodes), "eta": eta}


def _left_out(steps: Sequence[Step]) -> bool:
    """Whether one of `steps` left its node out of the run (see `Engine._leave_out`)."""
    for step in steps:
        result = (step.detail or {}).get("result") if isinstance(step.detail, dict) else None
        if step.state == "skipped" and isinstance(result, dict) and result.get(LEFT_OUT):
            return True
    return False


class _StepContext:
    """`workflows.engine.steps.StepContext` for one evaluation of one step."""

    def __init__(self, engine: Engine, run: Run, info: _RunInfo, step: Step, live: _Live,
                 steps: Sequence[Step], *, intent: Mapping[str, Any]) -> None:
        self._engine = engine
        self._run = run
        self._info = info
        self._step = step
        self._live = live
        self._steps = steps
        # Annotated as the protocol has them (its attributes are invariant).
        self.run_id: str = run.id
        self.request_id: str = info.request.id
        self.node = step.node
        self.kind: StepKind = step.kind
        self.params: Mapping[str, Any] = step_params(step)
        self.intent = intent
        self.plan_kind: str = info.plan.kind
        self.dry_run = run.dry_run
        self.now = engine._clock()
        self.timeout: dt.timedelta | None = None
        self.deadline: dt.datetime | None = None
        self.cordoned_by = f"gpuops for {info.request.requester_name}"
        self.window_end = info.request.window_end
        self.gateway = engine._gateway

    @property
    def expired(self) -> bool:
        return self.deadline is not None and self.now >= self.deadline

    def act(self) -> None:
        self._engine._check_lease()

    def record(self, *, key: str, action: str, target: str, detail: Mapping[str, Any]) -> None:
        self._engine.record_intent(self._run, self._info, self._step, self._live, key=key, action=action,
                                   target=target, detail=detail)

    def recorded(self, key: str) -> bool:
        return key in self._live.intents

    def recorded_at(self, key: str) -> dt.datetime | None:
        return self._live.intents.get(key)

    def node_inventory(self) -> NodeInventory | None:
        return self._engine.node_inventory(self.node, self.now)

    def step_intent(self, kind: StepKind) -> Mapping[str, Any] | None:
        for step in self._steps:
            if step.node == self.node and step.kind == kind and step.seq < self._step.seq:
                return step_intent(step)
        return None

    def run_unfinished(self, run_id: str) -> bool:
        other = stored_runs.get(self._engine._db, id=RunId(run_id))
        return other is not None and not other.finished


# --- running it ---------------------------------------------------------------------------------


def run_engine(config: EngineSettings, gateway: KubeGateway, cache: NodeSource, db: Database, identity: str,
               stop_event: threading.Event, *, lease: Any | None = None,
               on_commit: Callable[[int], None] | None = None, exit_when_idle: bool = False,
               pools: Mapping[str, PoolConfig] | None = None, cluster: str | None = None,
               home: bool = True) -> Engine:
    """Run the engine in the calling thread until `stop_event` is set.

    `cache` must be started (FleetCache.start()); `db` belongs to the calling thread;
    `identity` names this replica in the lease and the audit log (unique per replica,
    e.g. the pod name). Without `lease`, one is created from `config.lease` and given back
    when the engine stops. `pools` (the configuration's) are checked before every wave;
    without them nothing is. `cluster` and `home`: which cluster's runs it drives, with
    several (see Engine). Returns the engine (its `commits` count, for tests)."""
    engine_ref: list[Engine] = []
    own_lease = lease is None
    if lease is None:
        lease = EngineLease(gateway, identity=identity, settings=config.lease,
                            on_change=lambda held: engine_ref[0].wake() if engine_ref else None)
        lease.start()
    if pools is None:
        log.warning("%s: no pool policies given: waves are not checked against the pools before they start",
                    identity)
    engine = Engine(db=db, gateway=gateway, cache=cache, lease=lease, replica=identity, settings=config,
                    on_commit=on_commit, pools=pools, cluster=cluster, home=home)
    engine_ref.append(engine)
    try:
        engine.run(stop_event, exit_when_idle=exit_when_idle)
    finally:
        if own_lease:
            lease.stop(release=True)
    return engine


__all__ = ["Engine", "EngineSettings", "run_engine"]
