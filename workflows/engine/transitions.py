"""A step's moves, one transaction each, on the replica holding the lease (the engine,
workflows.engine.loop, decides when):

- started: its intent (what `prepare` found and is about to change) stored with the move
  to `running`, BEFORE the first side effect; params that cannot be used, or an API that
  refuses, halt the run; an API that does not answer leaves it pending (logged once);
- resumed: a step found `running` that this process did not start (after a restart or a
  lease change) gets its per-object intents back from the audit log, and `advance`
  looks at the cluster before acting, so no side effect is repeated;
- evaluated: `advance` under the step's timeout; an API outage waits with a backoff, a
  wait past the deadline fails the step; the next look is scheduled on the engine's timers;
- done, or left out (its node's remaining steps skipped except the `uncordon` that gives
  back what the run cordoned), or failed: the run halts, every node left as it is, unless
  the wave's `on_failure` step still runs first (workflows.engine.waves);
- while waiting: what it waits for kept in its detail, and its notice posted once.

A control written into a step's params meanwhile (`drain done`, a drain's extension, maybe
by another process) is looked at again before the step starts or ends, never written over.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from storage import audit
from storage import steps as stored_steps
from storage.codec import JsonInput
from storage.ids import StepId
from storage.runs import Run
from storage.steps import Step
from workflows import logfields
from workflows.engine import halt_messages, run_messages
from workflows.engine.context import Changed, EngineCore, EngineStepContext, LiveStep, RunInfo
from workflows.engine.halt_messages import HaltCode
from workflows.engine.runs import HALT_CODE, WAITING, extended_by_control, halt_code_of, step_intent, step_params
from workflows.engine.steps.contract import (
    Done,
    Failed,
    LeaseLost,
    LeftOut,
    Outcome,
    StepNotice,
    StepParamsError,
    Waiting,
)
from workflows.engine.steps.table import logic_for
from workflows.engine.waves import LEFT_OUT, fallback_note, fallback_of, on_failure
from workflows.kube.errors import Forbidden, Invalid, KubeError, NotFound

log = logging.getLogger("gpuops.engine")


class StepTransitions:
    """The moves of the engine's steps; what it remembers is this process's."""

    def __init__(self, engine: EngineCore) -> None:
        self._engine = engine
        # Steps whose start the API did not answer (logged once, not per try).
        self._cannot_start: set[StepId] = set()

    def forget(self) -> None:
        """This replica lost the lease: the next holder starts afresh."""
        self._cannot_start.clear()

    def start(self, run: Run, info: RunInfo, step: Step, steps: Sequence[Step]) -> bool:
        live = LiveStep(step_id=step.id)
        ctx = EngineStepContext(self._engine, run, info, step, live, steps, intent={})
        logic = logic_for(step.kind)
        try:
            intent = logic.prepare(ctx)
            logic.timeout(ctx)  # refuse unusable params before anything starts
        except StepParamsError as err:
            self.halt(run, info, step, run_messages.bad_params(str(err)), code="bad-params")
            return True
        except (Forbidden, Invalid, NotFound) as err:
            self.halt(run, info, step, run_messages.api_refused(str(err)), code="api-refused")
            return True
        except KubeError as err:
            if step.id not in self._cannot_start:  # one line when it starts failing, not one per try
                log.warning("%s: cannot start %s on %s yet: %s", self._engine.replica, step.kind, step.node, err)
            self._cannot_start.add(step.id)
            return False
        if step.id in self._cannot_start:
            self._cannot_start.discard(step.id)
            log.info("%s: the API answers again; starting %s on %s", self._engine.replica, step.kind, step.node)
        now = self._engine.clock()
        detail = {"params": step_params(step), "intent": intent}
        with self._engine.commit():
            self._check_controls(step, live)
            if not stored_steps.transition(self._engine.db, id=step.id, expected="pending", new="running", at=now,
                                           detail=detail):
                raise Changed()
            text = run_messages.step_started(step.kind, step.node, dry_run=run.dry_run)
            self._engine.audit(run, info, action="step.running", target=step.node, before="pending", after="running",
                               detail={"step": step.id, "kind": step.kind, "intent": intent})
            self._engine.notify(run, info, event="step.running", state="running", text=text, kind="update",
                                dedupe=f"{run.id}/step/{step.id}/running", node=step.node)
        self._engine.live[step.id] = live
        log.info("%s: %s", self._engine.replica, text)
        return True

    def adopt(self, run: Run, info: RunInfo, step: Step) -> LiveStep:
        """A step found running that this process did not start: after a restart or a
        lease change. Its earlier per-object intents come back from the audit log."""
        live = LiveStep(step_id=step.id)
        for entry in audit.for_run(self._engine.db, run.id):
            detail = entry.detail if isinstance(entry.detail, dict) else {}
            if detail.get("step") == step.id and isinstance(key := detail.get("intent_key"), str):
                live.intents.setdefault(key, entry.at)
        with self._engine.commit():
            self._engine.audit(run, info, action="step.resumed", target=step.node, before="running", after="running",
                               detail={"step": step.id, "kind": step.kind, "attempt": step.attempt,
                                       "text": run_messages.step_resumed(step.kind, step.node, self._engine.replica)})
        self._engine.live[step.id] = live
        log.info("%s: resuming %s on %s (step %s)", self._engine.replica, step.kind, step.node, step.id)
        return live

    def evaluate(self, run: Run, info: RunInfo, step: Step, live: LiveStep, steps: Sequence[Step]) -> Outcome:
        ctx = EngineStepContext(self._engine, run, info, step, live, steps, intent=step_intent(step))
        logic = logic_for(step.kind)
        live.evaluate_now = False
        live.extended_until = extended_by_control(step)
        outcome: Outcome
        try:
            ctx.timeout = logic.timeout(ctx)
            ctx.deadline = (step.started_at or ctx.now) + ctx.timeout if ctx.timeout is not None else None
            outcome = logic.advance(ctx)
            live.failures = 0
        except LeaseLost:
            raise
        except StepParamsError as err:
            outcome = Failed(run_messages.bad_params(str(err)), code="bad-params")
        except (Forbidden, Invalid, NotFound) as err:
            outcome = Failed(run_messages.api_refused(str(err)), code="api-refused")
        except KubeError as err:
            live.failures += 1
            retry = min(self._engine.settings.api_retry_max.total_seconds(), 0.5 * 2 ** live.failures)
            outcome = Waiting(run_messages.api_unreachable(str(err)), retry_in=retry)
        if isinstance(outcome, Waiting):
            if ctx.expired and not outcome.overdue_ok:
                return Failed(run_messages.step_timed_out(ctx.timeout, outcome.reason), code="step-timed-out")
            delay = outcome.retry_in if outcome.retry_in is not None else self._engine.settings.resync.total_seconds()
            if ctx.deadline is not None and not outcome.overdue_ok:
                delay = min(delay, max(0.0, (ctx.deadline - ctx.now).total_seconds()) + 0.05)
            live.due = self._engine.monotonic() + delay
            self._engine.look_again(step.id, at=live.due)
        return outcome

    def finish(self, run: Run, info: RunInfo, step: Step, outcome: Done) -> None:
        now = self._engine.clock()
        detail: dict[str, JsonInput] = {"params": step_params(step), "intent": step_intent(step),
                                        "note": outcome.note, "result": dict(outcome.detail)}
        with self._engine.commit():
            self._check_controls(step, self._engine.live.get(step.id))
            if not stored_steps.transition(self._engine.db, id=step.id, expected="running", new="done", at=now,
                                           detail=detail):
                raise Changed()
            text = run_messages.step_done(step.kind, step.node, outcome.note)
            self._engine.audit(run, info, action="step.done", target=step.node, before="running", after="done",
                               detail={"step": step.id, "kind": step.kind, "note": outcome.note,
                                       "result": dict(outcome.detail)})
            self._engine.notify(run, info, event="step.done", state="done", text=text, kind="update",
                                dedupe=f"{run.id}/step/{step.id}/done", node=step.node)
        self._engine.live.pop(step.id, None)
        log.info("%s: %s", self._engine.replica, text)

    def _check_controls(self, step: Step, live: LiveStep | None) -> None:
        """Inside the transaction that moves `step`: a control written into its params
        since it was read (`drain done`, a drain's extension, maybe by another process)
        is looked at again before the step starts or ends, and is never written over."""
        current = stored_steps.get(self._engine.db, id=step.id)
        if current is not None and step_params(current) != step_params(step):
            if live is not None:
                live.evaluate_now = True
            raise Changed()

    def leave_out(self, run: Run, info: RunInfo, step: Step, outcome: LeftOut) -> None:
        """Skip what is left of the step's node, except the uncordon that gives it back."""
        now = self._engine.clock()
        node_steps = [s for s in stored_steps.for_run(self._engine.db, run_id=run.id) if s.node == step.node]
        uncordon_next = any(s.kind == "uncordon" and s.state == "pending" for s in node_steps)
        text = run_messages.node_left_out(outcome.reason, uncordon_next=uncordon_next)
        detail: dict[str, JsonInput] = {"params": step_params(step), "intent": step_intent(step), "note": text,
                                        "result": {**outcome.detail, LEFT_OUT: True}}
        with self._engine.commit():
            if not stored_steps.transition(self._engine.db, id=step.id, expected="running", new="skipped", at=now,
                                           detail=detail, error=outcome.reason):
                raise Changed()
            for other in node_steps:
                if other.state == "pending" and other.kind != "uncordon":
                    stored_steps.transition(self._engine.db, id=other.id, expected="pending", new="skipped", at=now)
            self._engine.audit(run, info, action="node.left_out", target=step.node, before="running", after="skipped",
                               detail={"step": step.id, "kind": step.kind, "reason": outcome.reason, "text": text})
            self._engine.notify(run, info, event="node.left_out", state=run.state, text=text, kind="post",
                                dedupe=f"{run.id}/step/{step.id}/left-out", node=step.node)
        # NB: no _live.pop here: the step is no longer running, and run_pass forgets what it no longer sees.
        log.warning("%s: %s", self._engine.replica, text)

    def show_waiting(self, run: Run, info: RunInfo, step: Step, live: LiveStep, reason: str) -> None:
        """Keep what a running step waits for in its detail (`/gpu request` and the
        request's card show it), written when it changes, not at every look."""
        if live.reason == reason:
            return
        with self._engine.commit():
            current = stored_steps.get(self._engine.db, id=step.id)  # NB: `drain done` may have written it
            if current is None or current.state != "running":
                return
            detail = dict(current.detail) if isinstance(current.detail, dict) else {}
            if detail.get(WAITING) != reason:
                detail[WAITING] = reason
                stored_steps.replace_detail(self._engine.db, id=step.id, expected="running", detail=detail)
                self._engine.notify(run, info, event="step.waiting", state="running", text=reason, kind="update",
                                    dedupe=None, node=step.node)
        live.reason = reason

    def tell(self, run: Run, info: RunInfo, step: Step, live: LiveStep, notice: StepNotice) -> None:
        """Post a waiting step's notice to the thread, once (the outbox dedupes by key,
        across restarts too; `live.noticed` spares the transaction)."""
        key = f"{run.id}/notice/{notice.key}" if notice.per_run else f"{run.id}/step/{step.id}/{notice.key}"
        if notice.again_for is not None:
            key += f"/{notice.again_for}"
        if key in live.noticed:
            return
        with self._engine.commit():
            # Audited too (once per notice, as it is posted): a PodDisruptionBudget blocking
            # an eviction is something gpuops met on the node, and its Event comes from here.
            self._engine.audit(run, info, action=f"step.{notice.key}", target=step.node, before=None, after=None,
                               detail={"step": step.id, "kind": step.kind, "notice": notice.key,
                                       "text": notice.text})
            self._engine.notify(run, info, event=f"step.{notice.key}", state=run.state, text=notice.text, kind="post",
                                dedupe=key, node=None if notice.per_run else step.node)
        live.noticed.add(key)

    def halt(self, run: Run, info: RunInfo, step: Step, reason: str,
             detail: Mapping[str, Any] | None = None, *, code: HaltCode = "step-failed") -> bool:
        """The step failed: the run stops here, every node left as it is; unless its wave
        has a step that runs on a failure (`on_failure`) still to run: then only the step
        fails now, and the run halts once that one has ended. True in that case. `code` is
        why (`HaltCode`), kept with the failed step so the halt after its fallback still
        names it."""
        now = self._engine.clock()
        with self._engine.commit():
            if step.state in ("pending", "running"):
                step_detail: dict[str, JsonInput] = {"params": step_params(step), "intent": step_intent(step),
                                                     "note": reason, "result": dict(detail or {}), HALT_CODE: code}
                if not stored_steps.transition(self._engine.db, id=step.id, expected=step.state, new="failed", at=now,
                                               detail=step_detail, error=reason):
                    raise Changed()
                self._engine.audit(run, info, action="step.failed", target=step.node, before=step.state, after="failed",
                                   detail={"step": step.id, "kind": step.kind, "reason": reason})
            steps = stored_steps.for_run(self._engine.db, run_id=run.id)
            if not on_failure(step) and fallback_of(step, steps) is not None:
                return True
            failed = step if not on_failure(step) else next(
                (s for s in steps if s.state == "failed" and not on_failure(s)), step)
            why = reason if failed is step else (failed.error or "failed")
            why_code = code if failed is step else halt_code_of(failed)
            after = fallback_note(failed, steps)
            self._engine.fail_run(run, info, now, stopped=halt_messages.halted_elsewhere(failed.node),
                                  text=lambda left: halt_messages.halted(failed.node, failed.kind, why,
                                                                         left_cordoned=left, after=after),
                                  detail={"node": failed.node, "kind": failed.kind, "reason": why, "code": why_code,
                                          **({"after": after} if after else {})})
        return False

    def run_fallback(self, run: Run, info: RunInfo, step: Step, steps: Sequence[Step], due: set[StepId],
                     seen: set[StepId], evaluated: set[StepId]) -> bool:
        """A step of the wave failed: run the wave's `on_failure` step (a failed canary's
        driver version set back) to its end before the run halts. Like any step, its start
        and end are commits of their own, so a restart in between resumes it."""
        if step.state == "pending":
            return self.start(run, info, step, steps)
        seen.add(step.id)
        live = self._engine.live.get(step.id)
        if live is None:
            live = self.adopt(run, info, step)
        elif not live.evaluate_now and (step.id in evaluated or not (
                step.id in due or (live.due is not None and live.due <= self._engine.monotonic()))):
            return False
        evaluated.add(step.id)
        with logfields.bound(step_id=step.id, step=step.kind, node=step.node):
            outcome = self.evaluate(run, info, step, live, steps)
            if isinstance(outcome, Done):
                self.finish(run, info, step, outcome)
                return True
            if isinstance(outcome, (Failed, LeftOut)):
                self.halt(run, info, step, outcome.reason, detail=outcome.detail,
                          code=outcome.code if isinstance(outcome, Failed) else "step-failed")
                return False
            self.show_waiting(run, info, step, live, outcome.reason)
            if outcome.notice is not None:
                self.tell(run, info, step, live, outcome.notice)
        return False
