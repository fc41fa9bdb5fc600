"""A running drain's later window end (`extend_running`): asked by the requester or an
admin, pending on its own plan hash, approved by the same rules (`policy.as_extension`),
applied to the run's holds when the count is reached (`workflows.requests.extension`),
and lapsing at its deadline."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from storage import approvals as stored_approvals
from storage import audit
from storage import requests as stored_requests
from storage.requests import Request
from workflows.access import Actor, public_name
from workflows.plans import Plan, plan_hash, plan_to_json
from workflows.requests import messages as say
from workflows.requests import policy
from workflows.requests.errors import ChangedMeanwhile, RequestAccessDenied, RequestRefused
from workflows.requests.extension import RunningHold, extend_holds, running_hold
from workflows.requests.policy import ApproverNow, RefusalCode
from workflows.requests.records import RequestRecords, check_plan_fits, time_text
from workflows.requests.views import RequestView


class DrainExtensions(RequestRecords):
    """A running drain's extension: asked, approved, applied or lapsed."""

    def extend_running(
        self, actor: Actor, request_id: str, new_plan: Plan, *, window_end: dt.datetime, now: dt.datetime,
    ) -> RequestView:
        """A later window end for a running drain whose run still holds its nodes, bound
        to `new_plan` (the same waves, the later end: `DrainService.extend` checked the
        pool's windows and capacity). The requester or an admin asks; it is stored as
        pending on the request with its plan hash (a new ask replaces one before), and
        approved like a request: the pool's number of distinct approvers holding the role,
        never the requester, on that hash, before it lapses at the current window end (or
        the pool's request_ttl, if sooner). Meanwhile the run keeps holding to the current
        end. A pool that needs no approval for drains gets it at once. Applied, the
        request's window end and plan are replaced (it stays running) and the run's hold
        steps get the control (`workflows.requests.extension`). Asked again by the Slack
        delivery that asked it (its replica died before answering), it asks nothing more and
        answers with the request as it is."""
        with self._db.transaction():
            already = self._already_by_this_delivery(request_id, "request.extension_asked")
            if already is not None:
                return already
            request = self._touch(request_id, now=now)
            if request.state != "running":
                raise RequestRefused(say.not_extendable(request.id, state=request.state))
            if not policy.may_act_for_requester(request, actor):
                raise RequestAccessDenied(
                    say.not_requester_or_admin(request.id, requester_name=request.requester_name, verb="extend"),
                    code=RefusalCode.NOT_REQUESTER_OR_ADMIN)
            if request.window_end is None:
                raise RequestRefused(say.extend_open_ended(request.id), code=RefusalCode.NOT_HOLDING)
            if window_end <= request.window_end:
                raise RequestRefused(say.extend_not_later(request.id, window_end=request.window_end,
                                                             zone=self._zone))
            hold = running_hold(self._db, request)
            if hold.refusal is not None:
                raise RequestRefused(hold.refusal, code=RefusalCode.NOT_HOLDING)
            check_plan_fits(new_plan, kind=request.kind, pool=request.pool, created_for=request.requester,
                             window_start=request.window_start, window_end=window_end)
            digest = plan_hash(new_plan)
            pool_policy = self._config.pools[request.pool]
            required = policy.approvals_required(request, pool_policy)
            expires_at = min(now + pool_policy.request_ttl, request.window_end)
            if not stored_requests.ask_extension(
                    self._db, id=request.id, expected_plan_hash=request.plan_hash, window_end=window_end,
                    plan=plan_to_json(new_plan), plan_hash=digest, asked_by=actor.user_id,
                    expires_at=expires_at, at=now):
                raise ChangedMeanwhile(request.id)
            self._audit(request, actor=actor.user_id, action="request.extension_asked", before="running",
                        after="running", now=now,
                        detail={"old_window_end": time_text(request.window_end), "window_end": time_text(window_end),
                                "plan_hash": digest, "approvals_required": required,
                                "expires_at": time_text(expires_at), **self._delivery_detail()})
            asked = self._load(request.id)
            if required == 0:
                self._apply_extension(asked, hold, actor=actor.user_id, approvers=(), now=now)
            else:
                self._notify(request, event="request.extension_asked", state="running", now=now,
                             dedupe=f"extension/{digest}", people=(actor.user_id,),
                             text=say.thread_extension_asked(request_id=request.id, actor=self._public(actor),
                                                             window_end=request.window_end, extended_to=window_end,
                                                             plan_hash=digest, required=required, zone=self._zone))
            return self._view(self._load(request.id))

    def running_hold(self, request_id: str) -> RunningHold:
        """What the request's run holds now (a read; `extend_running` reads it again under
        the write lock)."""
        return running_hold(self._db, self._load(request_id))

    def _approve_extension(self, actor: Actor, request: Request, decision: policy.ApprovalDecision, *,
                           approver_now: ApproverNow, now: dt.datetime) -> RequestView:
        """Record `actor`'s counted approval of the pending extension; apply it when the
        count is reached (refused, changing nothing, if the run no longer holds then)."""
        extension = request.extension
        assert extension is not None
        if stored_approvals.record(self._db, request_id=request.id, approver=actor.user_id, decision="approve",
                                   plan_hash=extension.plan_hash, at=now) is None:
            raise ChangedMeanwhile(request.id)
        if decision.fully_approved:
            approvers = policy.counted_approvers(policy.as_extension(request), self._decisions(request),
                                                 approver_now=approver_now)
            self._apply_extension(request, running_hold(self._db, request), actor=actor.user_id,
                                  approvers=approvers, now=now)
        else:
            self._audit(request, actor=actor.user_id, action="request.extension_approval", before="running",
                        after="running", now=now,
                        detail={"plan_hash": extension.plan_hash, "window_end": time_text(extension.window_end),
                                "approvals_counted": decision.approvals_counted,
                                "approvals_required": decision.approvals_required})
            self._notify(request, event="request.extension_approval", state="running", now=now,
                         dedupe=f"approval/{actor.user_id}/{extension.plan_hash}", people=(actor.user_id,),
                         text=say.thread_extension_approval(
                             request_id=request.id, approver=self._public(actor), extended_to=extension.window_end,
                             counted=decision.approvals_counted, required=decision.approvals_required,
                             zone=self._zone))
        return self._view(self._load(request.id))

    def _apply_extension(self, request: Request, hold: RunningHold, *, actor: str, approvers: Sequence[str],
                         now: dt.datetime) -> None:
        """The pending extension becomes the request's window end and plan, the run's hold
        steps take the later end, audited (`request.extended`) and told in the thread."""
        extension = request.extension
        assert extension is not None and request.window_end is not None
        if hold.refusal is not None:
            raise RequestRefused(hold.refusal, code=RefusalCode.NOT_HOLDING)
        if not stored_requests.apply_extension(self._db, id=request.id, expected_extension_hash=extension.plan_hash,
                                               at=now):
            raise ChangedMeanwhile(request.id)
        nodes = extend_holds(self._db, hold, until=extension.window_end, by=actor, at=now)
        self._audit(request, actor=actor, action="request.extended", before="running", after="running", now=now,
                    detail={"old_window_end": time_text(request.window_end), "window_end": time_text(extension.window_end),
                            "old_plan_hash": request.plan_hash, "plan_hash": extension.plan_hash,
                            "asked_by": extension.asked_by, "approvers": list(approvers),
                            "run_id": hold.run_id, "nodes": nodes})
        self._notify(request, event="request.extended", state="running", now=now,
                     dedupe=f"extended-running/{extension.plan_hash}", people=(extension.asked_by, *approvers),
                     text=say.thread_extended_running(
                         request_id=request.id, window_end=request.window_end, extended_to=extension.window_end,
                         approvers=[public_name(a, names=self._names, fallback=a) for a in approvers], zone=self._zone))

    def _lapse_extension(self, request: Request, *, now: dt.datetime) -> Request:
        """The pending extension's deadline came before enough approvals: it is dropped,
        audited and told; the drain's window end stays as it was."""
        extension = request.extension
        assert extension is not None
        counted = len(policy.counted_approvers(policy.as_extension(request), self._decisions(request),
                                               approver_now=self._approver_now(request)))
        if not stored_requests.drop_extension(self._db, id=request.id, expected_extension_hash=extension.plan_hash,
                                              at=now):
            raise ChangedMeanwhile(request.id)
        window_end = request.window_end or extension.expires_at
        self._audit(request, actor=audit.GPUOPS_ACTOR, action="request.extension_lapsed", before=request.state,
                    after=request.state, now=now,
                    detail={"window_end": time_text(request.window_end), "extended_to": time_text(extension.window_end),
                            "plan_hash": extension.plan_hash, "approvals_counted": counted,
                            "approvals_required": policy.approvals_required(request, self._pool(request))})
        self._notify(request, event="request.extension_lapsed", state=request.state, now=now,
                     dedupe=f"extension-lapsed/{extension.plan_hash}",
                     text=say.extension_lapsed(request.id, window_end=window_end, extended_to=extension.window_end,
                                               zone=self._zone))
        return self._load(request.id)
