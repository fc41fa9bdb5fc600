"""The durable engine: executes runs, wave by wave, node by node, step by step.

What it does, as a runbook:

- A run executes its plan's waves in order; inside a wave, nodes go in parallel (at most
  `max_parallel_nodes`), per node steps go in order (workflows.engine.waves).
- A step moves `pending -> running -> done | failed` (workflows.engine.transitions). The
  move to `running` stores the step's intent (what `prepare` found and is about to
  change) and happens BEFORE the first side effect; each move is one storage transaction holding the step's
  compare-and-set, an audit row (actor `gpuops`, `k8s_identity` = the gateway's
  Kubernetes identity, detail naming this replica), the Kubernetes Events it makes
  (workflows.engine.kube_events) and an outbox message. Per-object
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
- Before a node or a wave starts, the gates are asked (workflows.engine.wave_gates): a
  change freeze, the pool's service health after the wave before (its `analysis`
  queries, held for their `for`), the pool as it is now (windows, other runs,
  max_unavailable, min_ready_gpus). A run that may not go on waits, its thread told why once, and halts if
  its window ends first.
- A failing step halts the run: no further steps or waves, nodes left as they are (so a
  drained node stays cordoned), and the reason goes to the run's `halted_reason`, the
  audit log and the request's thread. A step may instead leave its node out (a PDB
  still blocking at the timeout, when the pool says `skip`): that node's remaining steps
  are skipped except its `uncordon`, which gives back what this run cordoned, and the
  run goes on with the other nodes.
- A step whose params say `on_failure: true` runs only when a step of its wave fails,
  before the run halts; its note joins the halt's text (workflows.engine.waves).
- A waiting step may have something to tell (a PDB holding up an eviction, a window
  about to end): it is posted to the request's thread once (per step, or per run).
- Pause lets steps in flight finish and starts nothing new; abort (workflows.engine.runs) ends
  the run at once.
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
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

from storage import audit, outbox
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import Database
from storage.errors import DatabaseUnavailable
from storage.ids import RunId, StepId
from storage.requests import Request
from storage.runs import Run
from storage.steps import Step
from workflows import logfields
from workflows.engine import kube_events
from workflows.engine import run_messages as say
from workflows.engine.context import Changed, LiveStep, NodeSource, RunInfo
from workflows.engine.lease import EngineLease, LeaseSettings
from workflows.engine.runs import extended_by_control, halt_code_of, nodes_left_cordoned, released_by_control
from workflows.engine.steps.contract import Done, Failed, LeaseLost, LeftOut
from workflows.engine.signal_gate import NodeSignals, SignalGate
from workflows.engine.transitions import StepTransitions
from workflows.engine.wave_gates import WaveGates
from workflows.engine.waves import Waves, fallback_of, on_failure
from workflows.fleet.assessment import NodeInventory
from workflows.kube.gateway import KubeGateway
from workflows.kube.objects import NodeName
from workflows.plans import plan_from_json
from workflows.pools.config import PoolConfig
from workflows.signals.analysis import HealthQueries

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
    display_zone: the zone the run's thread writes times in (`display.timezone`).
    people: the names the configuration gives people (`access.names`), by Slack user id:
    a Kubernetes Event's note names an approver so, else by id (never a Slack display
    name, which its owner may change to anyone's).
    """

    lease: LeaseSettings = LeaseSettings()
    max_parallel_nodes: int = 4
    control_check: dt.timedelta = dt.timedelta(seconds=1)
    resync: dt.timedelta = dt.timedelta(seconds=30)
    api_retry_max: dt.timedelta = dt.timedelta(seconds=30)
    display_zone: dt.tzinfo = dt.timezone.utc
    people: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_parallel_nodes < 1:
            raise ValueError("max_parallel_nodes must be at least 1")


class LeaseCheck(Protocol):
    """What the engine asks of its lease before every transaction and side effect
    (`workflows.engine.lease.EngineLease`): whether this replica holds it now."""

    def held(self) -> bool: ...


class Engine:
    """Runs the unfinished runs of one database against one cluster; see the module doc."""

    def __init__(self, *, db: Database, gateway: KubeGateway, cache: NodeSource, lease: LeaseCheck, replica: str,
                 settings: EngineSettings = EngineSettings(),
                 clock: Callable[[], dt.datetime] = _utc_now,
                 monotonic: Callable[[], float] = time.monotonic,
                 on_commit: Callable[[int], None] | None = None,
                 pools: Mapping[str, PoolConfig] | None = None,
                 cluster: str | None = None, home: bool = True, health: HealthQueries | None = None,
                 signals: NodeSignals | None = None) -> None:
        self.db = db
        # With several clusters, each has its engine (one database, one Lease in the home
        # cluster): this one drives the runs of requests for `cluster`, and the home
        # cluster's also those that name none (made before `clusters:` was configured).
        # NB: never another cluster's run: its node names mean other machines here.
        self._cluster = cluster
        self._home = home
        self.gateway = gateway
        self.cache = cache
        self._lease = lease
        self.replica = replica
        self.settings = settings
        self.clock = clock
        self.monotonic = monotonic
        self._on_commit = on_commit
        self._queue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._timers: list[tuple[float, int, StepId]] = []
        self._timer_seq = itertools.count()
        self.live: dict[StepId, LiveStep] = {}
        self._info: dict[RunId, RunInfo] = {}
        self._step_reads = stored_steps.RunStepReads()  # each turn reads its run's steps again
        # Subscribed once for the engine's life (the cache has no way to unsubscribe);
        # `_listening` says whether a run is under way to hear what the cache tells.
        self._subscribed = False
        self._listening = False
        # The run's waves (starting nodes, entering the next wave, finishing) and the gates
        # before them (freezes, the pool as it is now): workflows.engine.waves, .wave_gates.
        # A step's moves (start, resume, evaluate, done, left out, halt): .transitions.
        self.transitions = StepTransitions(self)
        # Each node's GPU signals before and after its change: .signal_gate.
        self._signal_gate = SignalGate(self, signals)
        self._waves = Waves(self, start_step=self.transitions.start, node_gate=self._signal_gate.may_start)
        self._gates = WaveGates(self, pools, health)
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
        if not self._subscribed:
            self.cache.add_listener(self._on_cache_event)
            self._subscribed = True
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
                except DatabaseUnavailable as err:  # e.g. the database is locked
                    log.warning("engine pass stopped by the database: %s", err)
                    continue
                if exit_when_idle and not busy:
                    return
        finally:
            self._listening = False

    def _wait(self) -> set[str]:
        timeout = self.settings.control_check.total_seconds()
        if self._timers:
            timeout = max(0.0, min(timeout, self._timers[0][0] - self.monotonic()))
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
        if self.live:
            log.warning("%s: %s; %d steps in flight are left to the next holder", self.replica, why, len(self.live))
        self.live.clear()
        self._timers.clear()
        self._info.clear()
        self._step_reads.forget()
        self._gates.forget()
        self._signal_gate.forget()
        self.transitions.forget()

    def run_pass(self, woken: AbstractSet[str] = frozenset()) -> bool:
        """Drive every unfinished run once; True if any is left unfinished."""
        self.passes += 1
        now_mono = self.monotonic()
        due: set[StepId] = set()
        while self._timers and self._timers[0][0] <= now_mono:
            due.add(heapq.heappop(self._timers)[2])
        runs = self.unfinished()
        seen: set[StepId] = set()
        evaluated: set[StepId] = set()  # a waiting step is looked at once per pass
        for run in runs:
            self._drive(run, woken, due, seen, evaluated)
        for step_id in set(self.live) - seen:
            self.live.pop(step_id, None)
        self._step_reads.keep_only([run.id for run in runs])
        return bool(self.unfinished())

    def ours(self, request: Request) -> bool:
        """Whether `request` changes this engine's cluster."""
        return request.cluster == self._cluster or (self._home and request.cluster is None)

    def unfinished(self) -> list[Run]:
        """This cluster's unfinished runs."""
        return [run for run in stored_runs.unfinished(self.db) if self.ours(self._run_info(run).request)]

    # --- one run -----------------------------------------------------------------------
    def _drive(self, run: Run, woken: AbstractSet[str], due: set[StepId], seen: set[StepId],
               evaluated: set[StepId]) -> None:
        info = self._current_info(run)
        with logfields.bound(request_id=info.request.id, run_id=run.id):
            for _ in range(10_000):  # each turn commits something or returns
                current = stored_runs.get(self.db, id=run.id)
                if current is None or current.state not in ("pending", "running", "paused"):
                    return
                run = current
                try:
                    if not self._turn(run, info, woken, due, seen, evaluated):
                        return
                except Changed:
                    continue

    def _turn(self, run: Run, info: RunInfo, woken: AbstractSet[str], due: set[StepId], seen: set[StepId],
              evaluated: set[StepId]) -> bool:
        """One decision about the run; True if it committed something (look again)."""
        if run.state == "pending":
            if self._gates.frozen_now(run, info, ()) is not None:
                return False  # a change freeze: the run starts when it ends
            self._start_run(run, info)
            return True
        steps = self._step_reads.for_run(self.db, run_id=run.id)
        if not steps:
            self._waves.finish_run(run, info, steps)
            return False
        failed = next((s for s in steps if s.state == "failed" and not on_failure(s)), None)
        if failed is not None:
            fallback = fallback_of(failed, steps)
            if fallback is not None:  # it runs before the run halts
                return self.transitions.run_fallback(run, info, fallback, steps, due, seen, evaluated)
            self.transitions.halt(run, info, failed, failed.error or "failed",  # not yet turned into a halt (defensive)
                                 code=halt_code_of(failed))
            return False
        if run.current_wave is None:
            if run.state == "paused":
                return False
            first = min(s.wave for s in steps)
            freeze = self._gates.frozen_now(run, info, steps)
            if freeze is not None:
                self._gates.halt_if_window_ended(run, info, freeze, steps, wave=first)
                return False
            if not self._gates.wave_may_start(run, info, steps, first):
                return False
            self._waves.enter(run, info, steps, None, first)
            return True
        # A step that runs only when its wave fails is none of the wave's normal work.
        wave_steps = [s for s in steps if s.wave == run.current_wave and not on_failure(s)]

        progressed = False
        for step in wave_steps:
            if step.state != "running":
                continue
            seen.add(step.id)
            live = self.live.get(step.id)
            if live is None:
                live = self.transitions.adopt(run, info, step)
            elif not live.evaluate_now and (step.id in evaluated or not (
                    step.node in woken or step.id in due or (live.due is not None and live.due <= self.monotonic())
                    # NB: `drain done` (RunService.release_hold) is a control written to the
                    # step's params, maybe by another process: look at once, not at the old due.
                    # So is a drain's extension (workflows.requests.extension), once.
                    or released_by_control(step)
                    or extended_by_control(step) != live.extended_until)):
                continue
            evaluated.add(step.id)
            with logfields.bound(step_id=step.id, step=step.kind, node=step.node):
                outcome = self.transitions.evaluate(run, info, step, live, steps)
                if isinstance(outcome, Done):
                    self.transitions.finish(run, info, step, outcome)
                    progressed = True
                elif isinstance(outcome, Failed):
                    # NB: True when the wave's fallback step runs first (the next turn starts it).
                    return self.transitions.halt(run, info, step, outcome.reason, detail=outcome.detail,
                                                 code=outcome.code)
                elif isinstance(outcome, LeftOut):
                    self.transitions.leave_out(run, info, step, outcome)
                    progressed = True
                else:
                    self.transitions.show_waiting(run, info, step, live, outcome.reason)
                    if outcome.notice is not None:
                        self.transitions.tell(run, info, step, live, outcome.notice)
        if progressed:
            return True

        if run.state == "paused":
            return False  # steps in flight were looked at above; nothing new starts
        # A change freeze: the nodes under way finish every step; no node or wave starts.
        freeze = self._gates.frozen_now(run, info, steps)
        if self._waves.start_next(run, info, wave_steps, steps, frozen=freeze is not None):
            return True

        last_done = (all(s.state in ("done", "skipped") for s in wave_steps)
                     and not any(s.wave > run.current_wave for s in steps))
        if freeze is not None and not last_done:  # a run whose last node is done still finishes
            self._gates.halt_if_window_ended(run, info, freeze, steps, wave=run.current_wave)
            return False
        if all(s.state in ("done", "skipped") for s in wave_steps):
            later = sorted({s.wave for s in steps if s.wave > run.current_wave})
            if later:
                if not self._gates.service_health_held(run, info, steps, after=run.current_wave, before=later[0]):
                    return False
                if not self._gates.wave_may_start(run, info, steps, later[0]):
                    return False
                self._waves.enter(run, info, steps, run.current_wave, later[0])
                return True
            self._waves.finish_run(run, info, steps)
        return False

    @contextlib.contextmanager
    def commit(self) -> Iterator[None]:
        """One storage transaction, written only while this replica holds the lease."""
        self.check_lease()
        with self.db.transaction():
            yield
        self.commits += 1
        if self._on_commit is not None:
            self._on_commit(self.commits)

    def check_lease(self) -> None:
        if not self._lease.held():
            raise LeaseLost(f"{self.replica} does not hold the engine lease")

    def _start_run(self, run: Run, info: RunInfo) -> None:
        now = self.clock()
        with self.commit():
            if not stored_runs.transition(self.db, id=run.id, expected="pending", new="running", at=now):
                raise Changed()
            text = say.run_started(run.id, info.request.id, len(info.plan.nodes), len(info.plan.waves),
                                   dry_run=run.dry_run)
            self.audit(run, info, action="run.started", target=info.request.pool, before="pending",
                       after="running", detail={"text": text})
            self.notify(run, info, event="run.started", state="running", text=text, kind="post",
                        dedupe=f"{run.id}/started")
        log.info("%s: %s", self.replica, text)

    def fail_run(self, run: Run, info: RunInfo, now: dt.datetime, *, stopped: str,
                 text: Callable[[tuple[str, ...]], str], detail: Mapping[str, Any]) -> None:
        """Inside a transaction: unfinished steps stopped, the run and its request failed,
        audited and told, with the nodes the run leaves cordoned."""
        stored_steps.stop_unfinished(self.db, stored_steps.for_run(self.db, run_id=run.id), at=now, error=stopped)
        left = nodes_left_cordoned(run, stored_steps.for_run(self.db, run_id=run.id))
        said = text(left)
        if not stored_runs.transition(self.db, id=run.id, expected=("running", "paused"), new="failed", at=now,
                                      halted_reason=said):
            raise Changed()
        stored_requests.transition(self.db, id=info.request.id, expected="running", new="failed", at=now)
        self.audit(run, info, action="run.failed", target=info.request.pool, before=run.state, after="failed",
                   detail={**detail, "left_cordoned": list(left), "text": said})
        self.notify(run, info, event="run.failed", state="failed", text=said, kind="post",
                    dedupe=f"{run.id}/failed", halted_on=detail.get("code"))
        for other in stored_steps.for_run(self.db, run_id=run.id):
            self.live.pop(other.id, None)
        log.warning("%s: run %s halted: %s", self.replica, run.id, said)

    # --- records -----------------------------------------------------------------------------
    def audit(self, run: Run, info: RunInfo, *, action: str, target: str, before: Any, after: Any,
              detail: Mapping[str, Any], node: str | None = None) -> audit.AuditEntry:
        """Audit an action of the run, and in the same transaction queue the Kubernetes
        Events it makes (workflows.engine.kube_events: the one place they come from).
        `node`: the node of the step the action belongs to (a step's moves name it as
        their target)."""
        at = self.clock()
        entry = audit.append(self.db, actor=audit.GPUOPS_ACTOR, k8s_identity=self.gateway.identity,
                             action=action, target=target, at=at, request_id=info.request.id,
                             run_id=run.id, before=before, after=after,
                             detail={**detail, "replica": self.replica, "dry_run": run.dry_run})
        if node is None and action.startswith(("step.", "node.")):
            node = target
        kube_events.queue_events_for(self.db, run, info, action=action, target=target, after=after, detail=detail,
                                     node=node, replica=self.replica, zone=self.settings.display_zone, at=at,
                                     people=self.settings.people)
        return entry

    def notify(self, run: Run, info: RunInfo, *, event: str, state: str, text: str, kind: outbox.MessageKind,
               dedupe: str | None, node: str | None = None, halted_on: str | None = None) -> None:
        request = info.request
        if request.channel is None:
            return
        payload: dict[str, Any] = {"event": event, "request_id": request.id, "run_id": run.id,
                                   "pool": request.pool, "kind": request.kind, "state": state, "text": text,
                                   "dry_run": run.dry_run}
        if node is not None:
            payload["node"] = node
        if halted_on is not None:  # why a run halted, its `HaltCode` (its runbook)
            payload["halted_on"] = halted_on
        outbox.enqueue(self.db, channel=request.channel, thread_ts=request.thread_ts, kind=kind,
                       payload=payload, at=self.clock(), dedupe_key=dedupe)

    def _current_info(self, run: Run) -> RunInfo:
        """`_run_info` with the request read again: a running drain's extension moves its
        window end (and plan hash), which the wave gate and a frozen run's halt read."""
        info = self._run_info(run)
        version = stored_requests.plan_version(self.db, id=run.request_id)
        if version is not None and version != (info.request.window_end, info.request.plan_hash):
            request = stored_requests.get(self.db, id=run.request_id)
            if request is not None:
                info = RunInfo(request=request, plan=plan_from_json(request.plan))
                self._info[run.id] = info
        return info

    def _run_info(self, run: Run) -> RunInfo:
        info = self._info.get(run.id)
        if info is None:
            request = stored_requests.get(self.db, id=run.request_id)
            if request is None:
                raise RuntimeError(f"run {run.id} names request {run.request_id}, which does not exist")
            info = RunInfo(request=request, plan=plan_from_json(request.plan))
            self._info[run.id] = info
        return info

    def record_intent(self, run: Run, info: RunInfo, step: Step, live: LiveStep, *, key: str, action: str,
                      target: str, detail: Mapping[str, Any]) -> None:
        if key in live.intents:
            return
        with self.commit():
            self.audit(run, info, action=action, target=target, before=None, after=None,
                       detail={**detail, "step": step.id, "kind": step.kind, "intent_key": key}, node=step.node)
        live.intents[key] = self.clock()

    def look_again(self, step_id: StepId, *, at: float) -> None:
        """Look at `step_id` again at `at` (on the `monotonic` clock) even if nothing wakes it."""
        heapq.heappush(self._timers, (at, next(self._timer_seq), step_id))

    def in_flight(self, step_id: StepId) -> bool:
        """Whether `step_id` is a step this process has under way (started and not ended)."""
        return step_id in self.live

    def node_inventory(self, node: str, now: dt.datetime) -> NodeInventory | None:
        fleet = self.cache.fleet(now)
        return fleet.nodes.get(NodeName(node))


# --- running it ---------------------------------------------------------------------------------


def run_engine(config: EngineSettings, gateway: KubeGateway, cache: NodeSource, db: Database, identity: str,
               stop_event: threading.Event, *, lease: Any | None = None,
               on_commit: Callable[[int], None] | None = None, exit_when_idle: bool = False,
               pools: Mapping[str, PoolConfig] | None = None, cluster: str | None = None,
               home: bool = True, health: HealthQueries | None = None,
               signals: NodeSignals | None = None) -> Engine:
    """Run the engine in the calling thread until `stop_event` is set.

    `cache` must be started (FleetCache.start()); `db` belongs to the calling thread;
    `identity` names this replica in the lease and the audit log (unique per replica,
    e.g. the pod name). Without `lease`, one is created from `config.lease` and given back
    when the engine stops. `pools` (the configuration's) are checked before every wave;
    without them nothing is. `cluster` and `home`: which cluster's runs it drives, with
    several (see Engine). `health` reads the pools' analysis queries between waves
    (`signals.prometheus`); `signals` reads each node's DCGM signals before and after its
    change. Returns the engine (its `commits` count, for tests)."""
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
                    on_commit=on_commit, pools=pools, cluster=cluster, home=home, health=health,
                    signals=signals)
    engine_ref.append(engine)
    try:
        engine.run(stop_event, exit_when_idle=exit_when_idle)
    finally:
        if own_lease:
            lease.stop(release=True)
    return engine


__all__ = ["Engine", "EngineSettings", "run_engine"]
