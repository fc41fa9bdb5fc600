"""The gates before a run's next node or wave, each saying in plain words why the run waits
or stops (the engine, workflows.engine.loop, asks them before it starts anything):

- A change freeze on the run's pool (or the cluster) stops the run at the next node
  boundary (workflows.pools.freezes): nodes under way finish, no node or wave starts, the
  thread hears why once per freeze, and again when the run goes on by itself. A freeze
  that lets running runs finish holds only runs that have not started a step. A run a
  freeze holds past its window's end halts once no node is under way.
- Before a wave starts (the first one too), the pool is checked again as it is now
  (workflows.pools.capacity.check_wave): inside its windows and the request's, no node in
  another run's current wave, max_unavailable and min_ready_gpus counting whatever people
  or other runs took out since approval. A wave that does not fit waits, its thread told
  why once per wave and rule (the run's waiting line and the audit keep the current
  words: a different node cordoned under the same rule is not posted again), and the run
  halts if the window ends first. A dry run says so and goes on.
- Between two waves, the pool's service health (`pools.<name>.analysis`, read through
  `signals.prometheus`, workflows.signals.analysis): after a wave, every query is read
  every few seconds until its `for` has passed since the wave ended; the next wave starts
  only once all held. One past its bound halts the run with its name, query and value;
  one that cannot be read (no Prometheus, no series, several, NaN) halts it too: a gate
  that cannot see fails closed. When the watch began is audited (`run.health`), so an
  engine that restarts goes on waiting from then, not from its start. A dry run says
  what it would watch and goes on.
- What the run waits for is kept in `runs.waiting` (the request view and App Home show
  it), written when it changes.

What the gates remember (the reason last told, the freeze last told, the queries that
held) is this process's; after a restart, the freeze last told and when a health watch
began are read back from the audit log.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence

from storage import audit
from storage import freezes as stored_freezes
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.freezes import FreezeId
from storage.ids import RunId
from storage.runs import Run
from storage.steps import Step
from workflows.engine import halt_messages, run_messages
from workflows.engine import health_messages as health_say
from workflows.engine.context import EngineCore, RunInfo
from workflows.engine.halt_messages import HaltCode
from workflows.engine.runs import taken_over_run
from workflows.engine.waves import on_failure
from workflows.kube.objects import NodeName
from workflows.plans import plan_from_json
from workflows.pools import freezes
from workflows.pools import messages as gate_say
from workflows.pools.capacity import HOLDING_STATES, ConcurrentWork, WaveGate, check_wave, pool_nodes
from workflows.pools.config import AnalysisQuery, PoolConfig
from workflows.pools.freezes import Freeze
from workflows.signals.analysis import HealthQueries, QueryReading, breaches

log = logging.getLogger("gpuops.engine")

# The audit action that marks when a run began to watch service health after a wave.
HEALTH_WATCH = "run.health"
# The audit action of its verdict: every query held for its `for` (the next wave may start).
HEALTH_HELD = "run.health.held"


def health_poll_every(queries: Sequence[AnalysisQuery]) -> dt.timedelta:
    """How often a pool's analysis queries are read while a run holds them: a tenth of the
    shortest `for`, at least every 30s and at most every second."""
    shortest = min(q.for_ for q in queries)
    return max(dt.timedelta(seconds=1), min(dt.timedelta(seconds=30), shortest / 10))


class WaveGates:
    """The freeze and capacity gates of the engine's runs, and what each run was told."""

    def __init__(self, engine: EngineCore, pools: Mapping[str, PoolConfig] | None,
                 health: HealthQueries | None = None) -> None:
        self._engine = engine
        # Reads the pools' analysis queries (None: no Prometheus; a pool with queries fails closed).
        self._health = health
        # Per run: the wave whose health is watched, when the watch began, the queries that
        # held (name -> last value) and when they are read next.
        self._watch: dict[RunId, tuple[int, dt.datetime]] = {}
        self._held: dict[RunId, dict[str, float]] = {}
        self._next_read: dict[RunId, dt.datetime] = {}
        # Per run: the wave after which its health held (a verdict: not read or audited again
        # while the next wave waits on the capacity gate).
        self._passed: dict[RunId, int] = {}
        # The pools' policies, for the check before every wave; None: no check (only
        # tests of step mechanics and `python -m bot.engine_process` without --config).
        self._pools = pools
        # What each run's next wave waits for, as last told (one line per change).
        self._gated: dict[RunId, str] = {}
        # The freeze each run was last told it is stopped by (its id).
        self._frozen: dict[RunId, Freeze] = {}
        # Runs whose last freeze notice was read back from the audit (after a start).
        self._frozen_read: set[RunId] = set()

    def forget(self) -> None:
        """This replica lost the lease: whoever holds it next tells the threads."""
        self._gated.clear()
        self._frozen.clear()
        self._frozen_read.clear()
        self._watch.clear()
        self._held.clear()
        self._next_read.clear()
        self._passed.clear()

    def frozen_now(self, run: Run, info: RunInfo, steps: Sequence[Step]) -> Freeze | None:
        """The change freeze that keeps the run from starting its next node now, if any
        (workflows.pools.freezes; a freeze that lets running runs finish holds only runs
        with nothing under way or done). The thread hears it once per freeze, and again
        when the freeze is over and the run goes on by itself."""
        now = self._engine.clock()
        started = run.state != "pending" and any(s.state != "pending" for s in steps)
        freeze = freezes.holding_run(self._engine.db, pool=info.request.pool, started=started, now=now,
                                     cluster=info.request.cluster)
        told = self._told_frozen(run)
        if freeze is None:
            if told is not None:
                text = gate_say.run_unfrozen(run_id=run.id, target=told.target)
                with self._engine.commit():
                    stored_runs.set_waiting(self._engine.db, id=run.id, waiting=None)
                    self._engine.audit(run, info, action="run.unfrozen", target=info.request.pool, before=run.state,
                                       after=run.state, detail={"freeze": told.id, "text": text})
                    self._engine.notify(run, info, event="run.unfrozen", state=run.state, text=text, kind="post",
                                        dedupe=f"{run.id}/unfrozen/{told.id}")
                # Forgotten only once said: a commit that failed (a locked database) is
                # tried again at the next look, not lost.
                del self._frozen[run.id]
                log.info("%s: %s", self._engine.replica, text)
            return None
        if told is None or told.id != freeze.id:
            touched = {s.node for s in steps if s.state != "pending"}
            unfinished = {s.node for s in steps if s.state not in ("done", "skipped")}
            under_way = sorted(touched & unfinished)
            text = gate_say.run_frozen(run_id=run.id, target=freeze.target, by=freeze.set_by_name,
                                       until=freeze.until, reason=freeze.reason, in_flight=under_way,
                                       zone=self._engine.settings.display_zone)
            with self._engine.commit():
                self._engine.audit(run, info, action="run.frozen", target=info.request.pool, before=run.state,
                                   after=run.state, detail={"freeze": freeze.id, "freeze_target": freeze.target,
                                                            "until": freeze.until.isoformat(), "in_flight": under_way,
                                                            "text": text})
                self._engine.notify(run, info, event="run.frozen", state=run.state, text=text, kind="post",
                                    dedupe=f"{run.id}/frozen/{freeze.id}")
            self._frozen[run.id] = freeze
            log.info("%s: %s", self._engine.replica, text)
        self.say_waiting(run, gate_say.run_waits_for_freeze(target=freeze.target, by=freeze.set_by_name,
                                                            until=freeze.until, reason=freeze.reason,
                                                            cluster=freeze.cluster,
                                                            zone=self._engine.settings.display_zone))
        return freeze

    def say_waiting(self, run: Run, text: str | None) -> None:
        """Keep what the run waits for before its next node or wave (`runs.waiting`: the
        request view and App Home show it), written when it changes, not at every look."""
        if run.waiting != text:
            with self._engine.commit():
                stored_runs.set_waiting(self._engine.db, id=run.id, waiting=text)

    def _told_frozen(self, run: Run) -> Freeze | None:
        """The freeze the run's thread was last told holds it: remembered, or, the first
        time a (re)started engine looks at the run, read back from the audit (its last
        `run.frozen` not followed by `run.unfrozen`). So a restart neither tells (and
        audits) the freeze again nor forgets to say that the run goes on."""
        if run.id not in self._frozen and run.id not in self._frozen_read:
            self._frozen_read.add(run.id)
            last = next(reversed(audit.for_run(self._engine.db, run.id, actions=("run.frozen", "run.unfrozen"))),
                        None)
            if last is not None and last.action == "run.frozen" and isinstance(last.detail, dict):
                freeze_id = last.detail.get("freeze")
                told = (stored_freezes.get(self._engine.db, id=FreezeId(freeze_id))
                        if isinstance(freeze_id, int) else None)
                if told is not None:
                    self._frozen[run.id] = told
        return self._frozen.get(run.id)

    def halt_if_window_ended(self, run: Run, info: RunInfo, freeze: Freeze, steps: Sequence[Step], *,
                             wave: int) -> None:
        """A run a freeze holds past its window's end halts once no node is under way: it
        must not start nodes outside the window it was approved for."""
        end = info.request.window_end
        if end is None or self._engine.clock() < end or run.state != "running":
            return
        by_node: dict[str, list[Step]] = {}
        for step in steps:
            if not on_failure(step):
                by_node.setdefault(step.node, []).append(step)
        if any(any(s.state != "pending" for s in node) and not all(s.state in ("done", "skipped") for s in node)
               for node in by_node.values()):
            return  # a node under way finishes first
        self._halt_before_wave(run, info, gate_say.run_window_ended_while_frozen(run_id=run.id, target=freeze.target,
                                                                                 window_end=end,
                                                                                 zone=self._engine.settings.display_zone),
                                wave=wave,
                                code="window-ended-while-frozen")
        self._frozen.pop(run.id, None)

    def wave_may_start(self, run: Run, info: RunInfo, steps: Sequence[Step], wave: int) -> bool:
        """Check the pool again before a wave (the first one too): windows, other runs on
        its nodes, max_unavailable and min_ready_gpus on the pool as it is now. A wave
        that does not fit waits (the thread hears why, once per wave and rule) and the run
        halts when the window ends; a dry run reports it and goes on."""
        if self._pools is None:
            return True
        verdict = self._wave_gate(run, info, steps, wave)
        if verdict.fits:
            if self._gated.pop(run.id, None) is not None:
                log.info("%s: run %s: wave %d fits now", self._engine.replica, run.id, wave + 1)
            self.say_waiting(run, None)
            return True
        reason = verdict.reason or ""
        if verdict.over and not run.dry_run:
            self._halt_before_wave(run, info, reason, wave=wave, code="window-ended")
            return False
        if self._gated.get(run.id) != reason:
            with self._engine.commit():
                text = run_messages.dry_run_wave_would_wait(reason) if run.dry_run else reason
                self._engine.audit(run, info, action="run.waiting", target=info.request.pool, before=run.current_wave,
                                   after=run.current_wave, detail={"wave": wave, "rule": verdict.rule, "text": text})
                self._engine.notify(run, info, event="run.waiting", state=run.state, text=text, kind="post",
                                    dedupe=f"{run.id}/wave/{wave}/waits/{verdict.rule}")
            self._gated[run.id] = reason
            log.info("%s: run %s: %s", self._engine.replica, run.id, reason)
        if not run.dry_run:
            self.say_waiting(run, reason)
        return run.dry_run

    def service_health_held(self, run: Run, info: RunInfo, steps: Sequence[Step], *, after: int,
                            before: int) -> bool:
        """Whether the pool's service health held long enough after wave `after` for wave
        `before` to start. False while it is still watched (the run waits) or when it
        failed (the run halted)."""
        policy = self._pools.get(info.request.pool) if self._pools is not None else None
        queries = policy.analysis if policy is not None else ()
        if not queries or self._passed.get(run.id) == after or self._held_already(run, after):
            return True
        now = self._engine.clock()
        waves = sorted({s.wave for s in steps})
        position = waves.index(after) + 1 if after in waves else after + 1
        since = self._health_watch_began(run, info, queries, after=after, position=position, waves=len(waves),
                                         now=now)
        if run.dry_run:
            return True
        left = max((since + q.for_ for q in queries), default=now) - now
        if now < self._next_read.get(run.id, now):
            self.say_waiting(run, health_say.waiting(after=position, left=max(left, dt.timedelta(0))))
            return False
        held = self._held.setdefault(run.id, {})
        for query in queries:
            if query.name in held:
                continue
            reading = (self._health.read(query.query) if self._health is not None
                       else QueryReading(unread=health_say.no_reader()))
            if reading.value is None:
                reason = health_say.unread(after=position, name=query.name, query=query.query,
                                           reason=reading.unread or "")
                self._halt_on_health(run, info, reason, wave=before, code="service-health-unread",
                                     detail={"query": query.name, "promql": query.query, "unread": reading.unread})
                return False
            if breaches(reading.value, max_value=query.max, min_value=query.min):
                reason = health_say.failed(after=position, name=query.name, query=query.query, value=reading.value,
                                           max_value=query.max, min_value=query.min)
                self._halt_on_health(run, info, reason, wave=before, code="service-unhealthy",
                                     detail={"query": query.name, "promql": query.query, "value": reading.value})
                return False
            if now >= since + query.for_:
                held[query.name] = reading.value
        if len(held) == len(queries):
            text = health_say.held(after=position, values=[(q.name, held[q.name]) for q in queries])
            with self._engine.commit():
                self._engine.audit(run, info, action=HEALTH_HELD, target=info.request.pool, before=after,
                                   after=before, detail={"wave": after, "values": dict(held), "text": text})
                self._engine.notify(run, info, event=HEALTH_HELD, state=run.state, text=text, kind="post",
                                    dedupe=f"{run.id}/wave/{after}/health/held")
            self._forget_health(run)
            self._passed[run.id] = after
            log.info("%s: run %s: %s", self._engine.replica, run.id, text)
            return True
        self._next_read[run.id] = now + health_poll_every(queries)
        self.say_waiting(run, health_say.waiting(after=position, left=max(left, dt.timedelta(0))))
        return False

    def _held_already(self, run: Run, after: int) -> bool:
        """Whether the verdict for wave `after` was audited before this replica remembered
        anything of the watch (it restarted, or took the lease, with the verdict given)."""
        watched = self._watch.get(run.id)
        if watched is not None and watched[0] == after:
            return False
        if not any(isinstance(e.detail, dict) and e.detail.get("wave") == after
                   for e in audit.for_run(self._engine.db, run.id, actions=(HEALTH_HELD,))):
            return False
        self._passed[run.id] = after
        return True

    def _health_watch_began(self, run: Run, info: RunInfo, queries: Sequence[AnalysisQuery], *, after: int,
                            position: int, waves: int, now: dt.datetime) -> dt.datetime:
        """When the run began to watch service health after wave `after`: remembered, read
        back from the audit (an engine that restarted goes on from then), or now (audited,
        and the thread told which queries must hold)."""
        watched = self._watch.get(run.id)
        if watched is not None and watched[0] == after:
            return watched[1]
        self._forget_health(run)
        began = next((e.at for e in reversed(audit.for_run(self._engine.db, run.id, actions=(HEALTH_WATCH,)))
                      if isinstance(e.detail, dict) and e.detail.get("wave") == after), None)
        if began is None:
            began = now
            checks = [(q.name, health_say.bound_words(max_value=q.max, min_value=q.min), q.for_) for q in queries]
            text = health_say.watching(after=position, waves=waves, checks=checks, dry_run=run.dry_run)
            with self._engine.commit():
                self._engine.audit(run, info, action=HEALTH_WATCH, target=info.request.pool, before=after, after=after,
                                   detail={"wave": after, "queries": [q.name for q in queries], "text": text})
                self._engine.notify(run, info, event=HEALTH_WATCH, state=run.state, text=text, kind="post",
                                    dedupe=f"{run.id}/wave/{after}/health")
            log.info("%s: run %s: %s", self._engine.replica, run.id, text)
        self._watch[run.id] = (after, began)
        return began

    def _forget_health(self, run: Run) -> None:
        self._watch.pop(run.id, None)
        self._held.pop(run.id, None)
        self._next_read.pop(run.id, None)

    def _halt_on_health(self, run: Run, info: RunInfo, reason: str, *, wave: int, code: HaltCode,
                        detail: Mapping[str, object]) -> None:
        with self._engine.commit():
            self._engine.fail_run(run, info, self._engine.clock(), stopped=reason,
                                  text=lambda left: halt_messages.halted_before_wave(reason, left_cordoned=left),
                                  detail={"wave": wave, "reason": reason, "code": code, **detail})
        self._forget_health(run)

    def _wave_gate(self, run: Run, info: RunInfo, steps: Sequence[Step], wave: int) -> WaveGate:
        assert self._pools is not None
        request = info.request
        policy = self._pools.get(request.pool)
        if policy is None:
            return WaveGate("window", gate_say.pool_gone(wave, request.pool))
        now = self._engine.clock()
        nodes = sorted({NodeName(s.node) for s in steps if s.wave == wave})
        concurrent: list[ConcurrentWork] = []
        for other in stored_requests.in_states(self._engine.db, states=HOLDING_STATES):
            if other.pool != request.pool or other.id == request.id or not self._engine.ours(other):
                continue
            other_plan = plan_from_json(other.plan)
            concurrent.append(ConcurrentWork(label=str(other.id), start=other.window_start, end=other.window_end,
                                             waves=tuple(tuple(w.nodes) for w in other_plan.waves)))
        busy: dict[NodeName, str] = {}
        for other_run in self._engine.unfinished():
            if other_run.id == run.id or other_run.current_wave is None:
                continue  # NB: a run's later waves touch nothing yet (two queued runs never deadlock)
            for step in stored_steps.for_run(self._engine.db, run_id=other_run.id, wave=other_run.current_wave):
                if step.node in nodes and step.state in ("pending", "running"):
                    busy[NodeName(step.node)] = str(other_run.id)
        members = pool_nodes(self._engine.cache.fleet(now), request.pool)
        # The cordons this run takes over (a rollback's, a continuation's) are its own.
        undone = {mark.takes_over for s in steps if s.kind == "cordon" and (mark := taken_over_run(s)) is not None}
        mine = {s.node for s in steps}
        taken_over = frozenset(n.name for n in members if n.cordon_run in undone and n.name in mine)
        return check_wave(pool=request.pool, wave=wave, nodes=nodes, pool_nodes=members, now=now,
                          window_end=request.window_end, allowed_now=policy.window_set.contains(now),
                          max_unavailable=policy.unavailable_budget, min_ready_gpus=policy.min_ready_gpus,
                          concurrent=concurrent, busy=busy, taken_over=taken_over,
                          zone=self._engine.settings.display_zone)

    def _halt_before_wave(self, run: Run, info: RunInfo, reason: str, *, wave: int, code: HaltCode) -> None:
        """The run cannot go on (its next wave missed the window): it stops before that
        wave, every node left as it is."""
        with self._engine.commit():
            self._engine.fail_run(run, info, self._engine.clock(), stopped=reason,
                                  text=lambda left: halt_messages.halted_before_wave(reason, left_cordoned=left),
                                  detail={"wave": wave, "reason": reason, "code": code})
        self._gated.pop(run.id, None)
