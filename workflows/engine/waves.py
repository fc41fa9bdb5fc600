"""A run's waves: which nodes start their next step now, entering the next wave, finishing
the run, and the wave's rules that the engine (workflows.engine.loop) and its gates
(workflows.engine.wave_gates) read.

- Inside a wave, nodes go in parallel, at most `max_parallel_nodes` started and
  unfinished at once, in the plan's order; per node, a step starts only when every
  earlier step of its node is `done` (fail closed), except the `uncordon` of a node a
  step left out, which gives back what the run cordoned.
- A change freeze holds the run at the node boundary: nodes under way go on, no node
  starts (the freeze itself is a gate: workflows.engine.wave_gates).
- A step whose params say `on_failure: true` is none of its wave's normal work: it runs
  only when a step of its wave fails, before the run halts; a wave that ends well skips
  it.
- A run whose waves are all done succeeds; its thread hears which nodes stay cordoned
  (cordoned before the run, or marked by someone else) and which were left out.

Each move is one transaction through the engine (`Engine.commit`, which checks the
lease), with its audit row and thread message.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Any

from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.runs import Run
from storage.steps import Step
from workflows.engine import halt_messages, run_messages
from workflows.engine.context import Changed, EngineCore, RunInfo
from workflows.engine.runs import found_cordoned, step_params
from workflows.engine.signal_gate import GateVerdict

log = logging.getLogger("gpuops.engine")

LEFT_OUT = "left_out"
# A step's param: it runs only when a step of its wave fails, and the run halts after it.
ON_FAILURE = "on_failure"


def on_failure(step: Step) -> bool:
    """Whether `step` runs only when a step of its wave fails (a failed canary's driver
    version set back): never in the wave's order, skipped when the wave ends well."""
    return step_params(step).get(ON_FAILURE) is True


def fallback_of(failed: Step, steps: Sequence[Step]) -> Step | None:
    """The `on_failure` step still to run (or running) for a failure of `failed`'s wave."""
    return next((s for s in steps if on_failure(s) and s.wave == failed.wave
                 and s.state in ("pending", "running")), None)


def fallback_note(failed: Step, steps: Sequence[Step]) -> str | None:
    """What the wave's `on_failure` step did after `failed` failed, for the halt's text."""
    ran = next((s for s in steps if on_failure(s) and s.wave == failed.wave and s.state in ("done", "failed")), None)
    if ran is None:
        return None
    if ran.state == "failed":
        return halt_messages.fallback_failed(ran.kind, ran.error or "failed")
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


def has_left_out(steps: Sequence[Step]) -> bool:
    """Whether one of `steps` left its node out of the run (see `Engine._leave_out`)."""
    for step in steps:
        result = (step.detail or {}).get("result") if isinstance(step.detail, dict) else None
        if step.state == "skipped" and isinstance(result, dict) and result.get(LEFT_OUT):
            return True
    return False


class Waves:
    """The wave-by-wave progress of the engine's runs; the engine decides when to ask."""

    def __init__(self, engine: EngineCore, *,
                 start_step: Callable[[Run, RunInfo, Step, Sequence[Step]], bool],
                 node_gate: Callable[[Run, RunInfo, Step, Sequence[Step]], GateVerdict] | None = None) -> None:
        self._engine = engine
        # Starts one step (workflows.engine.transitions): True if it started or halted the run.
        self._start_step = start_step
        # Asked before a node's step starts (its GPU signals before and after its change,
        # workflows.engine.signal_gate): start it, wait, or the run halted.
        self._node_gate = node_gate

    def start_next(self, run: Run, info: RunInfo, wave_steps: list[Step], steps: list[Step], *,
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
        free = self._engine.settings.max_parallel_nodes - in_progress
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
                    following.kind == "uncordon" and has_left_out(earlier)
                    and all(s.state in ("done", "skipped") for s in earlier)):
                continue  # fail closed: only after every earlier step of the node is done
            if not any(s.state != "pending" for s in node_steps):
                if frozen:
                    continue  # the node boundary: a freeze starts no new node
                if free <= 0:
                    continue
                free -= 1
            verdict = self._node_gate(run, info, following, node_steps) if self._node_gate is not None else "start"
            if verdict == "halted":
                return True
            if verdict == "wait":
                continue
            if self._start_step(run, info, following, steps):
                started = True
                if not self._engine.in_flight(following.id):
                    return True  # it halted the run
        return started

    def enter(self, run: Run, info: RunInfo, steps: Sequence[Step], old: int | None, new: int) -> None:
        nodes = sorted({s.node for s in steps if s.wave == new})
        with self._engine.commit():
            if not stored_runs.advance_wave(self._engine.db, id=run.id, expected_wave=old, wave=new):
                raise Changed()
            self.skip_fallbacks(steps, now=self._engine.clock(), before=new)
            text = run_messages.wave_started(new, nodes, **wave_progress(steps, new, started=run.started_at,
                                                                now=self._engine.clock()))
            self._engine.audit(run, info, action="run.wave", target=info.request.pool, before=old, after=new,
                               detail={"nodes": nodes, "text": text})
            self._engine.notify(run, info, event="run.wave", state=run.state, text=text, kind="post",
                                dedupe=f"{run.id}/wave/{new}")

    def skip_fallbacks(self, steps: Sequence[Step], *, now: dt.datetime, before: int | None = None) -> None:
        """Inside a transaction: the `on_failure` steps of waves that ended without a
        failure (before wave `before`; all of them when the run ends) will never run."""
        for step in steps:
            if on_failure(step) and step.state == "pending" and (before is None or step.wave < before):
                stored_steps.transition(self._engine.db, id=step.id, expected="pending", new="skipped", at=now)

    def finish_run(self, run: Run, info: RunInfo, steps: Sequence[Step]) -> None:
        now = self._engine.clock()
        still = sorted({s.node for s in steps if s.kind == "cordon" and s.state == "done" and found_cordoned(s)})
        left_out = sorted({s.node for s in steps if has_left_out([s])})
        text = run_messages.run_succeeded(run.id, dry_run=run.dry_run, left_cordoned=[] if run.dry_run else still,
                                 left_out=left_out)
        with self._engine.commit():
            if not stored_runs.transition(self._engine.db, id=run.id, expected=("running", "paused"), new="succeeded",
                                          at=now):
                raise Changed()
            self.skip_fallbacks(steps, now=now)
            stored_requests.transition(self._engine.db, id=info.request.id, expected="running", new="done", at=now)
            self._engine.audit(run, info, action="run.succeeded", target=info.request.pool, before=run.state,
                               after="succeeded", detail={"text": text})
            self._engine.notify(run, info, event="run.succeeded", state="succeeded", text=text, kind="post",
                                dedupe=f"{run.id}/succeeded")
        log.info("%s: %s", self._engine.replica, text)
