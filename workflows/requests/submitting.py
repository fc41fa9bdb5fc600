"""Asking for a change: submit a request bound to its plan (refused while a change freeze
holds the pool), cancel it, re-plan it (approvals given stop counting), extend its window
before it runs (pending again), and mark a window missed (never started late)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from storage import audit
from storage import requests as stored_requests
from storage.requests import RequestKind
from workflows.access import Actor
from workflows.plans import Plan, plan_hash, plan_to_json
from workflows.pools import freezes
from workflows.preflight.duration import refusing_note
from workflows.pools import messages as pool_say
from workflows.requests import messages as say
from workflows.requests import policy
from workflows.requests.errors import ChangedMeanwhile, RequestAccessDenied, RequestRefused, refusal_error
from workflows.requests.policy import RefusalCode
from workflows.requests.records import RequestRecords, check_plan_fits, time_text, wakes_when_approved
from workflows.requests.views import RequestView


class Submitting(RequestRecords):
    """Submit, cancel, re-plan, extend before the run, mark missed."""

    @wakes_when_approved
    def submit(
        self,
        actor: Actor,
        *,
        kind: RequestKind,
        pool: str,
        targets: Sequence[str],
        plan: Plan,
        window_start: dt.datetime | None,
        window_end: dt.datetime | None,
        reason: str,
        channel: str | None = None,
        now: dt.datetime,
    ) -> RequestView:
        """Store a request bound to `plan`. It waits for the pool's approvals until
        `now + request_ttl`, or is approved at once if the pool needs none.

        Asked again by the same Slack delivery (its replica died after filing and before
        answering; a survivor runs it again), it files nothing and answers with the
        request that delivery filed: the delivery's key is stored with the request."""
        if self._delivery is not None:
            filed = stored_requests.filed_by(self._db, delivery=self._delivery)
            if filed is not None:
                return self._view(filed)
        verdict = policy.check_submit(actor=actor, kind=kind, pool=pool, reason=reason,
                                      pools=self._config.pools)
        if verdict.refusal is not None:
            raise refusal_error(verdict.refusal)
        check_plan_fits(plan, kind=kind, pool=pool, created_for=actor.user_id,
                         window_start=window_start, window_end=window_end)
        refusing = refusing_note(plan)
        if refusing is not None:
            raise RequestRefused(refusing.sentence, code=RefusalCode.DIAG_OUTGROWS_WINDOW)
        pool_policy = self._config.pools[pool]
        required = pool_policy.approvals_required(kind)
        digest = plan_hash(plan)
        expires_at = now + pool_policy.request_ttl
        with self._db.transaction():
            # A change freeze refuses new requests; read under the write lock, so a freeze
            # committed a moment before is seen (workflows.pools.freezes).
            freeze = freezes.holding_requests(self._db, pool=pool, now=now, cluster=self._config.cluster_name)
            if freeze is not None:
                raise RequestRefused(pool_say.frozen_refuses_request(
                    kind=kind, pool=pool, target=freeze.target, by=freeze.set_by_name, until=freeze.until,
                    reason=freeze.reason, cluster=freeze.cluster, zone=self._zone), code=RefusalCode.FROZEN)
            row = stored_requests.create(
                self._db,
                kind=kind,
                pool=pool,
                targets=list(targets),
                window_start=window_start,
                window_end=window_end,
                reason=reason.strip(),
                requester=actor.user_id,
                requester_name=self._public(actor),
                plan=plan_to_json(plan),
                plan_hash=digest,
                approvals_required=required,
                expires_at=expires_at,
                at=now,
                channel=channel,
                cluster=self._config.cluster_name,
                delivery=self._delivery,
            )
            self._audit(row, actor=actor.user_id, action="request.created", before=None,
                        after="pending", now=now,
                        detail={"kind": kind, "plan_hash": digest, "approvals_required": required,
                                **({"cluster": row.cluster} if row.cluster else {}),
                                "targets": list(targets), "reason": row.reason,
                                "window_start": time_text(window_start),
                                "window_end": time_text(window_end), "expires_at": time_text(expires_at)})
            self._notify(row, event="request.created", state=policy.state_at_creation(required),
                         now=now, dedupe="created",
                         text=say.thread_created(
                             request_id=row.id, requester_name=self._public(actor), kind=kind, pool=pool,
                             nodes=len(plan.nodes), waves=len(plan.waves), reason=row.reason,
                             plan_hash=digest, approvals_required=required, expires_at=expires_at,
                             zone=self._zone))
            if policy.state_at_creation(required) == "approved":
                self._transition(row, expected="pending", new="approved", now=now)
                self._audit(row, actor=audit.GPUOPS_ACTOR, action="request.approved",
                            before="pending", after="approved", now=now,
                            detail={"plan_hash": digest, "approvals_required": 0,
                                    "why": "pool policy needs no approval"})
            return self._view(self._load(row.id))

    def cancel(self, actor: Actor, request_id: str, *, now: dt.datetime) -> RequestView:
        """Withdraw a request before it runs (the requester or an admin)."""
        with self._db.transaction():
            request = self._touch(request_id, now=now)
            verdict = policy.check_cancel(request=request, actor=actor, now=now,
                                          approvals_so_far=self._decisions(request),
                                          names=self._names)
            if verdict.refusal is None:
                self._transition(request, expected=policy.CANCELLABLE_STATES, new="cancelled",
                                 now=now)
                self._audit(request, actor=actor.user_id, action="request.cancelled",
                            before=request.state, after="cancelled", now=now,
                            detail={"plan_hash": request.plan_hash})
                self._notify(request, event="request.cancelled", state="cancelled", now=now,
                             dedupe="cancelled", people=(actor.user_id,),
                             text=say.thread_cancelled(request_id=request.id, actor=self._public(actor)))
                return self._view(self._load(request.id))
        assert verdict.refusal is not None
        raise refusal_error(verdict.refusal)

    def replan(
        self, request_id: str, new_plan: Plan, *, now: dt.datetime, actor: Actor
    ) -> RequestView:
        """Bind a pending request to a new plan. Approvals given so far were for the old
        plan's hash, so they stop counting; approvers must review the new plan. A plan
        equal to the current one changes nothing."""
        with self._db.transaction():
            request = self._touch(request_id, now=now)
            decisions = self._decisions(request)
            verdict = policy.check_replan(request=request, actor=actor, now=now,
                                          approvals_so_far=decisions, names=self._names,
                                          zone=self._zone)
            if verdict.refusal is None:
                check_plan_fits(new_plan, kind=request.kind, pool=request.pool,
                                 created_for=request.requester,
                                 window_start=request.window_start, window_end=request.window_end)
                digest = plan_hash(new_plan)
                if digest == request.plan_hash:
                    return self._view(request)
                replaced = stored_requests.replace_plan(
                    self._db, id=request.id, expected_plan_hash=request.plan_hash,
                    plan=plan_to_json(new_plan), plan_hash=digest, at=now)
                if not replaced:
                    raise ChangedMeanwhile(request.id)
                voided = len(policy.counted_approvers(request, decisions,
                                                      approver_now=self._approver_now(request)))
                self._audit(request, actor=actor.user_id, action="request.replanned",
                            before="pending", after="pending", now=now,
                            detail={"old_plan_hash": request.plan_hash, "new_plan_hash": digest,
                                    "approvals_voided": voided})
                self._notify(request, event="request.replanned", state="pending", now=now,
                             dedupe=f"replanned/{digest}", people=(actor.user_id,),
                             text=say.thread_replanned(request_id=request.id, actor=self._public(actor),
                                                       plan_hash=digest, voided=voided))
                return self._view(self._load(request.id))
        assert verdict.refusal is not None
        raise refusal_error(verdict.refusal)

    @wakes_when_approved
    def extend_window(
        self, actor: Actor, request_id: str, new_plan: Plan, *, window_end: dt.datetime | None,
        now: dt.datetime,
    ) -> RequestView:
        """A re-plan of the window end: the request is bound to `new_plan` (built for the
        longer window) and is pending again, so the pool's approvals apply anew. Only
        before it runs, by the requester or an admin. Asked again by the Slack delivery
        that extended it (its replica died before answering), it extends nothing more and
        answers with the request as extended."""
        with self._db.transaction():
            already = self._already_by_this_delivery(request_id, "request.replanned")
            if already is not None:
                return already
            request = self._touch(request_id, now=now)
            if request.state not in ("pending", "approved", "scheduled"):
                raise RequestRefused(say.not_extendable(request.id, state=request.state))
            if not policy.may_act_for_requester(request, actor):
                raise RequestAccessDenied(
                    say.not_requester_or_admin(request.id, requester_name=self._requester(request),
                                               verb="extend"),
                    code=RefusalCode.NOT_REQUESTER_OR_ADMIN)
            check_plan_fits(new_plan, kind=request.kind, pool=request.pool,
                             created_for=request.requester,
                             window_start=request.window_start, window_end=window_end)
            digest = plan_hash(new_plan)
            decisions = self._decisions(request)
            voided = len(policy.counted_approvers(request, decisions,
                                                  approver_now=self._approver_now(request)))
            pool_policy = self._config.pools[request.pool]
            if not stored_requests.replace_window_end(
                    self._db, id=request.id, expected_plan_hash=request.plan_hash,
                    plan=plan_to_json(new_plan), plan_hash=digest, window_end=window_end,
                    expires_at=now + pool_policy.request_ttl, at=now):
                raise ChangedMeanwhile(request.id)
            self._audit(request, actor=actor.user_id, action="request.replanned",
                        before=request.state, after="pending", now=now,
                        detail={"old_plan_hash": request.plan_hash, "new_plan_hash": digest,
                                "approvals_voided": voided,
                                "old_window_end": time_text(request.window_end),
                                "window_end": time_text(window_end), **self._delivery_detail()})
            required = policy.approvals_required(request, pool_policy)
            self._notify(request, event="request.replanned", state=policy.state_at_creation(required), now=now,
                         dedupe=f"extended/{digest}", people=(actor.user_id,),
                         text=say.thread_extended(request_id=request.id, actor=self._public(actor),
                                                  window_end=window_end, plan_hash=digest,
                                                  voided=voided, zone=self._zone))
            if policy.state_at_creation(required) == "approved":
                # A pool that needs no approval for this kind approves the new plan at
                # once, as it did the first one: nobody is asked to approve "0 of 0".
                extended = self._load(request.id)
                self._transition(extended, expected="pending", new="approved", now=now)
                self._audit(extended, actor=audit.GPUOPS_ACTOR, action="request.approved",
                            before="pending", after="approved", now=now,
                            detail={"plan_hash": digest, "approvals_required": 0,
                                    "why": "pool policy needs no approval"})
            return self._view(self._load(request.id))

    def mark_missed(self, request_id: str, *, now: dt.datetime) -> RequestView:
        """An approved request whose window passed before gpuops could start it: it is
        `missed`, never started late, and the requester is told in its thread."""
        with self._db.transaction():
            request = self._load(request_id)
            self._transition(request, expected=frozenset({"approved", "scheduled"}), new="missed",
                             now=now)
            self._audit(request, actor=audit.GPUOPS_ACTOR, action="request.missed",
                        before=request.state, after="missed", now=now,
                        detail={"window_start": time_text(request.window_start),
                                "window_end": time_text(request.window_end),
                                "plan_hash": request.plan_hash})
            self._notify(request, event="request.missed", state="missed", now=now, dedupe="missed",
                         text=say.thread_missed(request_id=request.id,
                                                requester_name=self._requester(request),
                                                window_start=request.window_start,
                                                window_end=request.window_end, now=now, zone=self._zone))
            return self._view(self._load(request.id))
