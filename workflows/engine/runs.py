"""Runs as people control them: start an approved request's run, pause, resume, abort,
and read a run back with its steps and the nodes it left cordoned.

`RunService` writes; the engine (`workflows.engine.loop`, on the replica holding the lease)
executes. Every change here is one transaction: the run's compare-and-set transition,
the request's, the steps it ends, an audit row and an outbox message for the request's
thread. The engine notices a change on its next look at the database (within its
`control_check` period), at once when it runs in this process and `wake` is given.

- `start`: an approved (or scheduled) request becomes `running` and gets a `pending` run
  whose steps are the plan's (`Plan.new_steps()`), each stored with detail
  `{"params": ...}`. Refused while a change freeze covers the pool
  (workflows.pools.freezes); the request stays approved. The engine adds `intent` when a step starts and `note`/`result` when
  it ends.
- `pause`: the engine lets steps in flight finish and starts nothing new.
- `resume`: back to running.
- `release_hold` (`/gpu drain done`): the run's hold steps get the `HoldRelease` control
  (storage.step_params) in their params and end at once (pending ones as they start); the requester, an operator of the pool
  or an admin.
- `abort`: stop now and leave every node as it is; pending steps become `skipped`,
  steps in flight `failed` ("aborted by ..."), and the reply names the nodes this run
  left cordoned. An API call already on the wire when the abort lands still completes.

Roles: starting needs the operator role for the pool, unless the scheduler (`actor`
None) starts it; pause, resume and abort need the operator role for the pool.
"""

from __future__ import annotations

import datetime as dt
import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from storage import approvals as stored_approvals
from storage import audit, outbox
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.audit import AuditEntry
from storage.database import Database
from storage.ids import RequestId, RunId
from storage.requests import Request
from storage.runs import Run, RunState
from storage.step_params import HandConfirmation, HoldExtension, HoldRelease, StepParamsError, TakesOverMark
from storage.steps import NewStep, Step
from workflows.access import AccessDenied, Actor, Role, public_name, require
from workflows.engine import halt_messages, refusal_messages, run_messages
from workflows.engine.halt_messages import HALT_CODES, HaltCode
from workflows.plans import plan_from_json
from workflows.plans import plan_hash as compute_plan_hash
from workflows.pools import freezes
from workflows.pools import messages as pool_say
from workflows.requests.policy import ApproverNow, counted_approvers
from workflows.requests.service import RequestService

# Steps that wait for a person at the node (`confirm_host_driver` ends them).
PERSON_STEPS = ("host-driver-removed", "host-driver-installed")

# The request states a run may start from.
RUNNABLE_STATES = ("approved", "scheduled")


class RunRefused(Exception):
    """The action was refused; the message is one sentence for the person who tried."""


class RunAccessDenied(RunRefused, AccessDenied):
    """Refused because of who the person is (not an operator of the run's pool): also an
    `access.AccessDenied` carrying the pool, so the refusal can say who may act there."""


@dataclass(frozen=True, slots=True)
class _NotStarted:
    """A start that changed something (the request went back to pending) and refused."""

    reason: str


class UnknownRun(RunRefused):
    def __init__(self, run_id: str, closest: Sequence[str]) -> None:
        super().__init__(refusal_messages.unknown_run(run_id, closest))
        self.run_id = run_id
        self.closest = tuple(closest)


@dataclass(frozen=True)
class RunView:
    run: Run
    request_id: RequestId
    pool: str
    kind: str
    steps: tuple[Step, ...]
    # Nodes this run cordoned (or may have: a cordon in flight) and has not uncordoned.
    left_cordoned: tuple[str, ...]

    @property
    def id(self) -> RunId:
        return self.run.id

    @property
    def state(self) -> RunState:
        return self.run.state

    @property
    def halted_on(self) -> tuple[str, ...]:
        """The nodes of the step that halted the run, whatever kind of step it was (a
        driver that did not come up, a validation or a check pod that failed after it
        did): a rollback or a continuation starts with them."""
        return tuple(dict.fromkeys(s.node for s in self.steps if s.state == "failed"))


def step_note(step: Step) -> str | None:
    """What a person reads about the step: its outcome once it ended, what it waits for
    while it runs (the engine keeps `waiting` current)."""
    detail = _detail(step)
    note = detail.get("note")
    if note is None and step.state == "running":
        note = detail.get(WAITING)
    return str(note) if note is not None else None


# The step detail key holding what a running step waits for.
WAITING = "waiting"


def _detail(step: Step) -> dict[str, Any]:
    return step.detail if isinstance(step.detail, dict) else {}


def step_intent(step: Step) -> dict[str, Any]:
    intent = _detail(step).get("intent")
    return intent if isinstance(intent, dict) else {}


# Where a failed step's detail keeps why the run halts (its `HaltCode`).
HALT_CODE = "halt_code"


def halt_code_of(step: Step) -> HaltCode:
    """Why the failed `step` halts its run; "step-failed" for a step failed before halts
    had codes, or with one no longer known."""
    code = _detail(step).get(HALT_CODE)
    return code if code in HALT_CODES else "step-failed"


def step_params(step: Step) -> dict[str, Any]:
    params = _detail(step).get("params")
    return params if isinstance(params, dict) else {}


def released_by_control(step: Step) -> bool:
    """Whether `drain done` (`HoldRelease`) is written into the step's params. A control the
    codec refuses counts as written: the engine looks at the step at once, and the step's
    own read of its params fails it with the codec's words."""
    try:
        return HoldRelease.read_from(step_params(step), kind=step.kind) is not None
    except StepParamsError:
        return True


def extended_by_control(step: Step) -> dt.datetime | str | None:
    """The end an applied extension (`HoldExtension`) wrote into the step's params, None
    without one; a control the codec refuses is its stored text (the engine looks at the
    step once, and the step's own read fails it)."""
    try:
        extension = HoldExtension.read_from(step_params(step), kind=step.kind)
    except StepParamsError:
        return str(step_params(step).get("extended_until"))
    return extension.extended_until if extension is not None else None


def taken_over_run(step: Step) -> TakesOverMark | None:
    """The earlier run whose leftovers the step takes over (`TakesOverMark`), if it does;
    None for a mark the codec refuses (fail closed: the node is not counted as this run's)."""
    try:
        return TakesOverMark.read_from(step_params(step), kind=step.kind)
    except StepParamsError:
        return None


def found_cordoned(step: Step) -> bool:
    """Whether a cordon step found its node unschedulable when it acted (its result) or,
    still in flight, when it started (its intent). Such a node (a person's cordon, or
    another run's, which the result marks held_by_run) was never this run's to give back:
    it stays cordoned after the run. Another run's stale mark on a schedulable node does
    not count: this run cordons that node, and gives it back."""
    result = _detail(step).get("result")
    seen = result if isinstance(result, dict) and "prior_unschedulable" in result else step_intent(step)
    return bool(seen.get("prior_unschedulable"))


def nodes_left_cordoned(run: Run, steps: Sequence[Step]) -> tuple[str, ...]:
    """Nodes whose cordon by this run happened (or was in flight) and that this run has
    not uncordoned. A dry run cordons nothing; a node cordoned before the run is not
    counted (it was never this run's to uncordon). A cordon that failed after it started
    counts (fail closed): an abort fails the cordon in flight, and a call that timed out
    may have landed."""
    if run.dry_run:
        return ()
    left = []
    for step in steps:
        acted = step.state in ("running", "done") or (step.state == "failed" and step.started_at is not None)
        if step.kind != "cordon" or not acted or found_cordoned(step):
            continue
        uncordoned = any(s.node == step.node and s.kind == "uncordon" and s.state == "done" for s in steps)
        if not uncordoned:
            left.append(step.node)
    return tuple(sorted(set(left)))


class RunService:
    """Runs on one database connection (one per thread, see `storage.database`)."""

    def __init__(self, db: Database, *, wake: Callable[[], None] | None = None,
                 names: Mapping[str, str] | None = None, cluster: str | None = None,
                 requests: RequestService | None = None, zone: dt.tzinfo = dt.timezone.utc) -> None:
        self._db = db
        # The display zone (`display.timezone`): the zone its refusals write times in.
        self._zone = zone
        # Where a run's start reads who holds the approver role and the pool's approval
        # rule as they are now; without it only requests that need no approval start.
        self._requests = requests
        # With several clusters, the cluster whose runs `unfinished` lists (a run is its
        # request's cluster's); None with one cluster.
        self._cluster = cluster
        self._wake = wake or (lambda: None)
        # `access.names`: how the request's thread names who paused, resumed, aborted.
        self._names: Mapping[str, str] = names or {}

    # -------------------------------------------------------------- actions

    def start(self, request_id: str, *, dry_run: bool, now: dt.datetime,
              actor: Actor | None = None, plan_hash: str | None = None) -> RunView:
        """Queue a run of an approved request's plan for the engine.

        Everything that decides is read inside the transaction that starts the run (a
        `drain extend` or a cancel committed a moment before is seen): the request must be
        approved or scheduled, its stored plan must still hash to the hash its approvals
        name, and, with `plan_hash` (what the caller decided on, e.g. the scheduler's
        read of the request), that hash must still be the request's. Approvals are counted
        as they are now: an approver who lost the role no longer counts, and a pool rule
        made stricter since applies; a request they no longer suffice for goes back to
        pending (its thread says why) and the start is refused."""
        approver_now = self._requests.approvers_looked_up(request_id) if self._requests is not None else None
        with self._db.transaction():
            started = self._start_in_transaction(request_id, dry_run=dry_run, now=now, actor=actor,
                                                 plan_hash=plan_hash, approver_now=approver_now)
        # A request reopened for approval is committed with it; only then is the start refused.
        if isinstance(started, _NotStarted):
            raise RunRefused(started.reason)
        self._wake()
        return self.get(started)

    def _start_in_transaction(self, request_id: str, *, dry_run: bool, now: dt.datetime, actor: Actor | None,
                              plan_hash: str | None, approver_now: ApproverNow | None) -> RunId | _NotStarted:
        """`start`'s reads and writes: the new run's id, or why it did not start after the
        request went back to pending (committed: the caller raises it afterwards)."""
        request = self._request(RequestId(request_id))
        if actor is not None:
            require(actor, Role.OPERATOR, action="Starting a run", pool=request.pool)
        if request.state not in RUNNABLE_STATES:
            raise RunRefused(refusal_messages.request_not_runnable(request.id, request.state))
        # No run starts while a change freeze covers the pool, whoever asks.
        freeze = freezes.holding_run(self._db, pool=request.pool, started=False, now=now, cluster=request.cluster)
        if freeze is not None:
            raise RunRefused(pool_say.frozen_refuses_run(
                request_id=request.id, pool=request.pool, target=freeze.target, by=freeze.set_by_name,
                until=freeze.until, reason=freeze.reason, zone=self._zone))
        if plan_hash is not None and plan_hash != request.plan_hash:
            raise RunRefused(refusal_messages.plan_changed_since(request.id, seen=plan_hash, now=request.plan_hash))
        plan = plan_from_json(request.plan)
        if compute_plan_hash(plan) != request.plan_hash:
            raise RunRefused(refusal_messages.plan_does_not_match_its_hash(request.id, request.plan_hash))
        # Approvals as they are now: roles read now, the pool's rule as configured now.
        if self._requests is None or approver_now is None:
            if request.approvals_required > 0:  # fail closed: nothing to re-check roles with
                raise RunRefused(refusal_messages.cannot_check_approvals(request.id))
        else:
            approvers = counted_approvers(request, stored_approvals.for_request(self._db, request_id=request.id),
                                          approver_now=approver_now)
            required = self._requests.approvals_required_now(request)
            if len(approvers) < required:
                self._requests.reopen_for_approval(request, counted=approvers, required=required, now=now)
                return _NotStarted(refusal_messages.plan_not_approved(request.id, request.plan_hash,
                                                                      counted=len(approvers), required=required))
        run = stored_runs.create(self._db, request_id=request.id, dry_run=dry_run, at=now)
        if run is None:
            raise RunRefused(refusal_messages.already_running(request.id))
        if not stored_requests.transition(self._db, id=request.id, expected=request.state,
                                          new="running", at=now):
            raise RunRefused(refusal_messages.request_not_runnable(request.id, "changing"))
        stored_steps.add(self._db, run_id=run.id, steps=[
            NewStep(wave=s.wave, node=s.node, seq=s.seq, kind=s.kind, detail={"params": s.detail})
            for s in plan.new_steps()])
        who = actor.user_id if actor else audit.GPUOPS_ACTOR
        audit.append(self._db, actor=who, k8s_identity=None, action="run.created", target=request.pool,
                     at=now, request_id=request.id, run_id=run.id, before=request.state, after="running",
                     detail={"dry_run": dry_run, "plan_hash": request.plan_hash,
                             "nodes": list(plan.nodes), "waves": len(plan.waves)})
        self._notify(request, run.id, event="run.created", state="pending", now=now,
                     dedupe=f"{run.id}/created", text=run_messages.run_created(run.id, request.id, dry_run=dry_run))
        return run.id

    def pause(self, actor: Actor, run_id: str, *, now: dt.datetime) -> RunView:
        return self._control(actor, run_id, now=now, action="paused", expected=("pending", "running"),
                             new="paused", text=lambda run: run_messages.run_paused(run.id, self._public(actor)))

    def resume(self, actor: Actor, run_id: str, *, now: dt.datetime) -> RunView:
        return self._control(actor, run_id, now=now, action="resumed", expected=("paused",),
                             new="running", text=lambda run: run_messages.run_resumed(run.id, self._public(actor)))

    def abort(self, actor: Actor, run_id: str, *, now: dt.datetime) -> RunView:
        return self._control(actor, run_id, now=now, action="aborted",
                             expected=("pending", "running", "paused"), new="aborted", text=None)

    def release_hold(self, actor: Actor, request_id: str, *, now: dt.datetime) -> RunView:
        """`drain done`: end the hold steps of the request's unfinished run now (pending
        ones end as they start). An operator of the pool (the requester is one) or an admin;
        refused, `RunAccessDenied` names the pool."""
        with self._db.transaction():
            request = self._request(RequestId(request_id))
            # The requester too: they asked as an operator of the pool, and hold that role
            # only while the configuration still gives it to them.
            if not actor.has(Role.OPERATOR, pool=request.pool):
                raise RunAccessDenied(refusal_messages.not_allowed_to_release(request.id, pool=request.pool),
                                      role=Role.OPERATOR, pool=request.pool)
            runs = [r for r in stored_runs.for_request(self._db, request_id=request.id)
                    if r.state in ("pending", "running", "paused")]
            if not runs:
                raise RunRefused(refusal_messages.no_run_yet(request.id))
            run = runs[-1]
            released: list[str] = []
            for step in stored_steps.for_run(self._db, run_id=run.id):
                if step.kind != "hold" or step.state not in ("pending", "running"):
                    continue
                # A hold `drain done` already ended is not ended again (the same words said
                # twice, or their delivery run again after its replica died before answering);
                # the control's first key says it is written (storage.step_params.StepControl).
                if step_params(step).get(HoldRelease.keys()[0]) is not None:
                    continue
                detail = dict(step.detail) if isinstance(step.detail, dict) else {}
                params = HoldRelease(released_at=now, released_by_user=actor.user_id).written_into(step_params(step))
                if stored_steps.replace_detail(self._db, id=step.id, expected=step.state,
                                               detail={**detail, "params": params}):
                    released.append(step.node)
            if not released:
                raise RunRefused(refusal_messages.nothing_to_release(run.id))
            message = run_messages.hold_released(run.id, self._public(actor), nodes=sorted(set(released)))
            entry = audit.append(self._db, actor=actor.user_id, k8s_identity=None, action="run.released",
                                 target=request.pool, at=now, request_id=request.id, run_id=run.id,
                                 before=run.state, after=run.state, detail={"text": message})
            self._notify(request, run.id, event="run.released", state=run.state, now=now,
                         dedupe=f"{run.id}/released/{entry.seq}", text=message, people=(actor.user_id,))
        self._wake()
        return self.get(run.id)

    def confirm_host_driver(self, actor: Actor, run_id: str, *, now: dt.datetime,
                            node: str | None = None) -> RunView:
        """A person says the host driver is gone from (or installed on) the node(s) the run
        waits on (its running `host-driver-removed` or `host-driver-installed` steps; with
        `node`, that node's only): recorded in the step's params with who and when,
        audited, told in the thread. An operator of the run's pool or an admin (else
        `RunAccessDenied`, naming the pool)."""
        with self._db.transaction():
            run = stored_runs.get(self._db, id=RunId(run_id))
            if run is None:
                raise UnknownRun(run_id, self._closest(run_id))
            request = self._request(run.request_id)
            if not actor.has(Role.OPERATOR, pool=request.pool):
                raise RunAccessDenied(refusal_messages.not_allowed_to_confirm(run.id, request.pool),
                                      role=Role.OPERATOR, pool=request.pool)
            if run.state not in ("pending", "running", "paused"):
                raise RunRefused(refusal_messages.run_not_waiting(run.id, run.state))
            # A step already confirmed waits for the engine, not for a person: the same word
            # said again (or its delivery run again after its replica died) records nothing.
            waiting = [s for s in stored_steps.for_run(self._db, run_id=run.id)
                       if s.kind in PERSON_STEPS and s.state == "running" and (node is None or s.node == node)
                       and step_params(s).get(HandConfirmation.keys()[0]) is None]
            if not waiting:
                raise RunRefused(refusal_messages.nothing_to_confirm(run.id, node))
            if len({s.node for s in waiting}) > 1:
                # Several nodes wait (a pool's migrate_at_once): a word for one is not a word for all.
                raise RunRefused(refusal_messages.name_the_node_to_confirm(run.id, sorted({s.node for s in waiting})))
            for step in waiting:
                detail = dict(step.detail) if isinstance(step.detail, dict) else {}
                params = HandConfirmation(confirmed_by=actor.user_id, confirmed_by_name=self._public(actor),
                                          confirmed_at=now).written_into(step_params(step))
                stored_steps.replace_detail(self._db, id=step.id, expected=step.state, detail={**detail, "params": params})
            nodes = sorted({s.node for s in waiting})
            install = any(s.kind == "host-driver-installed" for s in waiting)
            message = run_messages.host_driver_confirmed_by(run.id, self._public(actor), nodes, install=install)
            action = "run.host-driver-installed" if install else "run.host-driver-removed"
            entry = audit.append(self._db, actor=actor.user_id, k8s_identity=None, action=action,
                                 target=request.pool, at=now, request_id=request.id, run_id=run.id,
                                 before=run.state, after=run.state, detail={"nodes": nodes, "text": message})
            self._notify(request, run.id, event=action, state=run.state, now=now,
                         dedupe=f"{run.id}/host-driver/{entry.seq}", text=message, people=(actor.user_id,))
        self._wake()
        return self.get(run.id)

    # -------------------------------------------------------------- reading

    def get(self, run_id: str) -> RunView:
        run = stored_runs.get(self._db, id=RunId(run_id))
        if run is None:
            raise UnknownRun(run_id, self._closest(run_id))
        return self._view(run)

    def for_request(self, request_id: str) -> list[RunView]:
        return [self._view(r) for r in stored_runs.for_request(self._db, request_id=RequestId(request_id))]

    def unfinished(self, *, every_cluster: bool = False) -> list[RunView]:
        """This cluster's runs not finished (pending, running, paused), oldest first; with
        `every_cluster`, every cluster's (one database serves them all)."""
        return [self._view(r) for r in stored_runs.unfinished(
            self._db, cluster=None if every_cluster or self._cluster is None else (self._cluster,))]

    def recent_audit(self, n: int) -> list[AuditEntry]:
        """The newest `n` audit rows, newest first."""
        return audit.recent(self._db, n)

    def request_audit(self, request_id: str) -> list[AuditEntry]:
        """Everything recorded about one request (its runs included), oldest first."""
        return audit.for_request(self._db, RequestId(request_id))

    # -------------------------------------------------------------- privately

    def _control(self, actor: Actor, run_id: str, *, now: dt.datetime, action: str,
                 expected: tuple[RunState, ...], new: RunState,
                 text: Callable[[Run], str] | None) -> RunView:
        with self._db.transaction():
            run = stored_runs.get(self._db, id=RunId(run_id))
            if run is None:
                raise UnknownRun(run_id, self._closest(run_id))
            request = self._request(run.request_id)
            require(actor, Role.OPERATOR, action=f"A run being {action}", pool=request.pool)
            if run.state not in expected:
                raise RunRefused(refusal_messages.cannot_control(run.id, action, run.state))
            reason: str | None = None
            if new == "aborted":
                steps = stored_steps.for_run(self._db, run_id=run.id)
                left = nodes_left_cordoned(run, steps)
                reason = halt_messages.run_aborted(run.id, self._public(actor), left_cordoned=left)
                stored_steps.stop_unfinished(self._db, steps, at=now,
                                             error=halt_messages.aborted_step(self._public(actor)))
                stored_requests.transition(self._db, id=request.id, expected=("running", "scheduled", "approved"),
                                           new="failed", at=now)
            if not stored_runs.transition(self._db, id=run.id, expected=run.state, new=new, at=now,
                                          halted_reason=reason):
                raise RunRefused(refusal_messages.cannot_control(run.id, action, "changing"))
            message = reason if reason is not None else text(run)  # type: ignore[misc]  # None only with abort's reason
            entry = audit.append(self._db, actor=actor.user_id, k8s_identity=None, action=f"run.{action}",
                                 target=request.pool, at=now, request_id=request.id, run_id=run.id,
                                 before=run.state, after=new, detail={"text": message})
            self._notify(request, run.id, event=f"run.{action}", state=new, now=now,
                         dedupe=f"{run.id}/{action}/{entry.seq}", text=message, people=(actor.user_id,))
        self._wake()
        return self.get(run_id)

    def _request(self, request_id: RequestId) -> Request:
        request = stored_requests.get(self._db, id=request_id)
        if request is None:
            closest = difflib.get_close_matches(request_id, stored_requests.known_ids(self._db), n=3, cutoff=0.6)
            raise RunRefused(refusal_messages.unknown_run(request_id, closest))
        return request

    def _closest(self, run_id: str) -> list[str]:
        # NB: read-only; storage has no "recent run ids" function of its own.
        known = [row["id"] for row in self._db.query("SELECT id FROM runs ORDER BY created_at DESC LIMIT 1000")]
        return difflib.get_close_matches(run_id, known, n=3, cutoff=0.6)

    def _view(self, run: Run) -> RunView:
        request = stored_requests.get(self._db, id=run.request_id)
        steps = tuple(stored_steps.for_run(self._db, run_id=run.id))
        return RunView(run=run, request_id=run.request_id, pool=request.pool if request else "?",
                       kind=request.kind if request else "?", steps=steps,
                       left_cordoned=nodes_left_cordoned(run, steps))

    def _public(self, actor: Actor) -> str:
        return public_name(actor.user_id, names=self._names, fallback=actor.name)

    def _notify(self, request: Request, run_id: RunId, *, event: str, state: str, text: str,
                now: dt.datetime, dedupe: str, people: Sequence[str] = ()) -> None:
        if request.channel is None:
            return
        outbox.enqueue(self._db, channel=request.channel, thread_ts=request.thread_ts, kind="post", at=now,
                       dedupe_key=dedupe,
                       payload={"event": event, "request_id": request.id, "run_id": run_id,
                                "pool": request.pool, "kind": request.kind, "state": state, "text": text,
                                "people": sorted(set(people))})
