"""The gate of each node's GPU signals, before and after its change, for every kind:

- Before a node's first step starts (before it is cordoned), its DCGM signals (XID,
  double-bit ECC, row-remap failures, throttling; workflows.signals.before_after) are read
  and audited (`node.signals.before`): the audit is what an engine that restarts compares
  against.
- Before its `uncordon` starts (after its check), they are read again and compared: a new
  XID 48/63/64/79/94/95, a new double-bit ECC error or a row-remap failure keeps the node
  cordoned and halts the run, the readings before and after in the thread. Whether the
  driver reloaded (a driver, operator-upgrade, MIG or host-driver step ran on the node)
  decides what "new" means for the counters that reset with it.
- A reading after that cannot be had (the exporter restarting with the driver) is looked
  for again every few seconds, up to `SIGNALS_AFTER_WAIT` after the node's last step
  ended (stored, so a restart keeps the count); then the run halts: an unread node is not
  given back as healthy.
- A continuation of a halted run (`/gpu continue`) compares a node against the reading
  taken before the HALTED run changed it (`ContinuesMark` on the node's first step, back
  along the chain), never a new one: a fault that halted the run is still new to the
  node, so continuing without `--skip` does not give back a node with a new fault.
- Without `signals` configured there is no gate (the plan says so); a dry run reads
  nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Literal, Protocol

from storage import audit
from storage import steps as stored_steps
from storage.ids import RunId
from storage.runs import Run
from storage.step_params import ContinuesMark
from storage.steps import Step
from workflows.engine import halt_messages
from workflows.engine.context import EngineCore, RunInfo
from workflows.engine.halt_messages import HaltCode
from workflows.engine.runs import step_params
from workflows.signals.before_after import NodeMarks, marks_of, new_faults, readings_line
from workflows.signals.reading import Reading

log = logging.getLogger("gpuops.engine")

BEFORE = "node.signals.before"
AFTER = "node.signals.after"
# Steps after which the node's driver has reloaded (volatile counters and the XID series restart).
RELOADING_STEPS = frozenset({"driver", "operator-upgrade", "mig", "host-driver-removed", "host-driver-installed"})
# How long after a node's last step its signals may stay unread before the run halts.
SIGNALS_AFTER_WAIT = dt.timedelta(minutes=10)
# How often an unread node's signals are read again.
READ_AGAIN = dt.timedelta(seconds=15)
# How far back a chain of continuations is followed for a node's reading before.
_CONTINUED_AT_MOST = 20

GateVerdict = Literal["start", "wait", "halted"]


class NodeSignals(Protocol):
    """What the gate reads a node's DCGM signals through (`workflows.signals.service.SignalsService`)."""

    def read(self, node: str | None = None) -> Reading: ...


class SignalGate:
    """The signals before and after each node's change; see the module doc."""

    def __init__(self, engine: EngineCore, signals: NodeSignals | None) -> None:
        self._engine = engine
        self._signals = signals
        # (run, node) -> when its signals after are read again.
        self._again: dict[tuple[RunId, str], dt.datetime] = {}

    def forget(self) -> None:
        self._again.clear()

    def may_start(self, run: Run, info: RunInfo, step: Step, node_steps: Sequence[Step]) -> GateVerdict:
        """Whether `step` may start now, waits for the node's signals after, or halted the run."""
        if self._signals is None or run.dry_run:
            return "start"
        if all(s.state == "pending" for s in node_steps):
            self._read_before(run, info, step.node, node_steps)
            return "start"
        if step.kind != "uncordon" or any(s.state == "skipped" for s in node_steps if s.seq < step.seq):
            return "start"  # a node left out was never changed as planned: nothing to compare
        return self._compare_after(run, info, step, node_steps)

    def _read_before(self, run: Run, info: RunInfo, node: str, node_steps: Sequence[Step]) -> None:
        carried = self._continued_before(node, node_steps)
        if carried is not None:
            marks, source = carried
            detail = {"node": node, "marks": marks.to_json(), "carried_from": source}
        else:
            marks = marks_of(self._signals.read(node), node) if self._signals is not None else NodeMarks()
            detail = {"node": node, "marks": marks.to_json()}
        with self._engine.commit():
            self._engine.audit(run, info, action=BEFORE, target=node, before=None, after=None, detail=detail)

    def _continued_before(self, node: str, node_steps: Sequence[Step]) -> tuple[NodeMarks, str] | None:
        """The reading before of the halted run this node's steps continue (and of the
        one that continued, back along the chain), with that run's id; None when the
        node's steps continue no run, or none of those runs read the node before."""
        steps = node_steps
        for _ in range(_CONTINUED_AT_MOST):
            first = min(steps, key=lambda s: s.seq, default=None)
            mark = ContinuesMark.read_from(step_params(first), kind=first.kind) if first is not None else None
            if mark is None:
                return None
            earlier = RunId(mark.continues)
            marks = self._before_of(earlier, node)
            if marks is not None:
                return marks, earlier
            steps = [s for s in stored_steps.for_run(self._engine.db, run_id=earlier) if s.node == node]
        return None

    def _before_of(self, run_id: RunId, node: str) -> NodeMarks | None:
        entry = next((e for e in reversed(audit.for_run(self._engine.db, run_id, actions=(BEFORE,)))
                      if isinstance(e.detail, dict) and e.detail.get("node") == node), None)
        marks = entry.detail.get("marks") if entry is not None and isinstance(entry.detail, dict) else None
        return NodeMarks.from_json(marks) if isinstance(marks, dict) else None

    def _compare_after(self, run: Run, info: RunInfo, step: Step, node_steps: Sequence[Step]) -> GateVerdict:
        now = self._engine.clock()
        key = (run.id, step.node)
        if now < self._again.get(key, now):
            return "wait"
        assert self._signals is not None
        after = marks_of(self._signals.read(step.node), step.node)
        before = self._before_of(run.id, step.node)
        earlier = [s for s in node_steps if s.seq < step.seq]
        if after.unknown is not None:
            ended = max((s.ended_at for s in earlier if s.ended_at is not None), default=now)
            if now - ended < SIGNALS_AFTER_WAIT:
                self._again[key] = now + READ_AGAIN
                return "wait"
            reason = halt_messages.signals_unread(step.node, after.unknown, waited=SIGNALS_AFTER_WAIT)
            self._halt(run, info, step.node, reason, code="gpu-signals-unread", before=before, after=after)
            return "halted"
        self._again.pop(key, None)
        reloaded = any(s.kind in RELOADING_STEPS and s.state == "done" for s in earlier)
        faults = new_faults(before, after, reloaded=reloaded)
        if faults:
            reason = halt_messages.new_gpu_faults(step.node, [f.sentence for f in faults],
                                                  before=readings_line(before) if before is not None else (),
                                                  after=readings_line(after))
            self._halt(run, info, step.node, reason, code="new-gpu-fault", before=before, after=after)
            return "halted"
        with self._engine.commit():
            self._engine.audit(run, info, action=AFTER, target=step.node, before=None, after=None,
                               detail={"node": step.node, "marks": after.to_json(), "reloaded": reloaded})
        return "start"

    def _halt(self, run: Run, info: RunInfo, node: str, reason: str, *, code: HaltCode, before: NodeMarks | None,
              after: NodeMarks) -> None:
        self._again.pop((run.id, node), None)
        with self._engine.commit():
            self._engine.audit(run, info, action=AFTER, target=node, before=None, after=None,
                               detail={"node": node, "marks": after.to_json(), "code": code})
            self._engine.fail_run(run, info, self._engine.clock(), stopped=reason,
                                  text=lambda left: halt_messages.halted_at_node(reason, left_cordoned=left),
                                  detail={"node": node, "reason": reason, "code": code,
                                          "before": before.to_json() if before is not None else None,
                                          "after": after.to_json()})
