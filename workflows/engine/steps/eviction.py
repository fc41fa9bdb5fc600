"""Which pods leave a node and how: the gate list for one pod (`decide`), the evict
step (PodDisruptionBudgets, pods that come back, `on_timeout`), and the gate that keeps
a driver or MIG change off a node GPU pods still run on (`gpu_pods_left`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from storage.step_params import EvictParams, GpuGateParams
from workflows.engine import messages as say
from workflows.engine.steps.contract import (
    Done,
    Failed,
    LeftOut,
    Outcome,
    StepContext,
    StepNotice,
    StepParamsError,
    Waiting,
    pod_ref,
    params_of,
)
from workflows.kube.errors import Conflict, NotFound, TooManyRequests

from workflows.kube.labels import ANNOTATION_MIRROR, LABEL_GPU_USER
from workflows.kube.objects import PodOnNode, Toleration

# NVIDIA_VISIBLE_DEVICES values that hand a container no GPU.
_NO_DEVICES = frozenset({"", "void", "none"})

EvictScope = Literal["gpu", "all"]
# The evict scope drain plans write (workflows.drain.plan): `all` here.
DRAIN_PLAN_SCOPE = "all-non-daemonset"


# A pool's pdb_timeout_action (config) as the evict step's on_timeout.
# Plans made before `halt` was named so carry `wait`.
_ON_TIMEOUT = {"halt": "fail", "wait": "fail", "skip": "skip", "delete": "delete"}


@dataclass(frozen=True)
class PodDecision:
    """What the evict step does with one pod on the node, and the sentence that says why."""

    action: Literal["evict", "skip", "wait"]
    why: str


def gpu_use(pod: PodOnNode) -> str | None:
    """Why the pod counts as a GPU pod, or None: a request or limit of a GPU resource, an
    NVIDIA_VISIBLE_DEVICES env that hands it devices without one, or our label."""
    if pod.pod.gpu_requests:
        return say.requests_gpus(dict(pod.pod.gpu_requests))
    if pod.visible_devices is not None and pod.visible_devices.strip().lower() not in _NO_DEVICES:
        return say.visible_devices(pod.visible_devices)
    if pod.pod.labels.get(LABEL_GPU_USER) == "true":
        return say.gpu_user_label(LABEL_GPU_USER)
    return None


def decide(pod: PodOnNode, *, scope: EvictScope) -> PodDecision:
    """The evict step's gate list for one pod, first match wins."""
    p = pod.pod
    gpu = gpu_use(pod)
    if p.deleting:
        return PodDecision("wait", say.already_terminating())
    if p.phase in ("Succeeded", "Failed"):
        return PodDecision("skip", say.finished_pod(p.phase))
    if ANNOTATION_MIRROR in p.annotations:
        return PodDecision("skip", say.mirror_pod())
    controller = p.controller
    if controller is not None and controller.kind == "DaemonSet":
        return PodDecision("skip", say.daemonset_pod(controller.name, gpu))
    if gpu is not None:
        return PodDecision("evict", gpu)
    if scope == "all":
        return PodDecision("evict", say.drain_scope())
    return PodDecision("skip", say.not_a_gpu_pod())


def gpu_pods_left(ctx: StepContext) -> list[str]:
    """GPU pods (not DaemonSet, not finished, not terminating) still on the node: a driver
    cannot unload and a MIG layout cannot change under them. Pods that tolerate the
    cordon come back after an eviction; this gate keeps the change from starting on top
    of them (fail closed), unless params say `allow_gpu_pods: true`."""
    if params_of(ctx, GpuGateParams).allow_gpu_pods is True:
        return []
    in_the_way = []
    for pod in ctx.gateway.list_pods_on_node(ctx.node):
        decision = decide(pod, scope="gpu")
        if decision.action == "evict":
            in_the_way.append(f"{pod.pod.namespace}/{pod.pod.name}")
    return sorted(in_the_way)


class Evict:
    """Evict pods from the node through the Eviction API, so PodDisruptionBudgets apply.

    Which pods (`scope` param): `gpu` evicts GPU pods only (requests or limits of
    nvidia.com/gpu*, nvidia.com/mig-*, or GPU users without a request: env
    NVIDIA_VISIBLE_DEVICES, label gpuops.io/gpu-user=true); other pods keep running, which
    is what a driver or MIG change needs. `all` (a drain) evicts every pod. Either way
    DaemonSet pods are skipped (their controller would put them straight back), mirror
    (static) pods are skipped (the kubelet owns them), finished pods are skipped (they
    hold nothing), and pods already terminating are waited for. The default is `all` for
    drain plans and `drain` steps, `gpu` otherwise. Every decision is in the step detail.

    The pods to evict are chosen once, when the step starts, and stored with its intent.
    The step is done when each chosen pod is gone (or replaced: a new uid). With scope
    `gpu`, pods that arrive later (a replica that tolerates node.kubernetes.io/unschedulable
    lands on the cordoned node again) would hold up the driver or MIG change that follows:
    the thread hears it once, they are evicted again up to `evict_retries` rounds (the
    pool's, default 3), and a round more fails the step naming the pods and their owners.
    A drain (scope `all`) does as kubectl drain does and does not chase them.

    A 429 from a PodDisruptionBudget is retried on a timer (PDB status is not watched)
    and on watch events about the node, until `timeout_s` (default 600); the first one
    is told in the request's thread. A 429 that is not a budget's (the API server asking
    to slow down: API Priority and Fairness, a webhook) is only retried, after its
    Retry-After: no notice, no `on_timeout` (it never deletes a pod), and the step fails
    at its timeout if the API never lets it through. Then `on_timeout` says what happens: `fail`
    (default; the run halts with the node cordoned, for a person to decide), `skip`
    (the node is left out: the pods still on it keep running, it is uncordoned and the
    run goes on) or `delete` (delete the blocked pods, bypassing the budget, on record).
    A delete on record is sent again only while its pod is neither terminating nor gone:
    after a restart between the record and the call; never a second time after one
    that landed.
    """

    def __init__(self, *, default_scope: EvictScope | None = None) -> None:
        self._default_scope = default_scope

    params = EvictParams

    def scope(self, ctx: StepContext) -> EvictScope:
        value = params_of(ctx, EvictParams).scope
        if value == DRAIN_PLAN_SCOPE:
            value = "all"  # what drain plans write: DaemonSet pods are skipped either way
        if value is None:
            value = self._default_scope or ("all" if ctx.plan_kind == "drain" else "gpu")
        if value == "gpu":
            return "gpu"
        if value == "all":
            return "all"
        raise StepParamsError(f"evict scope must be 'gpu' or 'all', not {value!r}")

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        params = params_of(ctx, EvictParams)
        if params.timeout_s is None and params.pdb_timeout_s is not None:
            # A drain plan: the pool's drain_timeout.
            params = EvictParams(timeout_s=params.pdb_timeout_s)
        return params.timeout(600, kind=ctx.kind)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        scope = self.scope(ctx)
        # A drain plan says the pool's pdb_timeout_action: `halt` halts the run with the
        # node cordoned, for a person to decide; `skip` leaves the node out; `delete` deletes.
        params = params_of(ctx, EvictParams)
        default = _ON_TIMEOUT.get(str(params.pdb_timeout_action), "fail")
        on_timeout = params.on_timeout if params.on_timeout is not None else default
        if on_timeout not in ("fail", "skip", "delete"):
            raise StepParamsError(f"on_timeout must be 'fail', 'skip' or 'delete', not {on_timeout!r}")
        targets: list[dict[str, Any]] = []
        skipped: list[dict[str, Any]] = []
        waited: list[dict[str, Any]] = []
        for pod in sorted(ctx.gateway.list_pods_on_node(ctx.node), key=lambda p: (p.pod.namespace, p.pod.name)):
            decision = decide(pod, scope=scope)
            entry: dict[str, Any] = {"pod": f"{pod.pod.namespace}/{pod.pod.name}", "uid": pod.uid,
                                     "why": decision.why}
            if decision.action == "evict" and _tolerates_cordon(pod.pod.placement.tolerations):
                entry["tolerates_cordon"] = True
            {"evict": targets, "skip": skipped, "wait": waited}[decision.action].append(entry)
        return {"scope": scope, "on_timeout": on_timeout, "evict": targets, "skipped": skipped,
                "terminating": waited}

    def advance(self, ctx: StepContext) -> Outcome:
        chosen = list(ctx.intent.get("evict", ())) + list(ctx.intent.get("terminating", ()))
        on_node = ctx.gateway.list_pods_on_node(ctx.node)
        present = {p.uid: p for p in on_node}
        remaining = [t for t in chosen if t["uid"] in present
                     and present[t["uid"]].pod.phase not in ("Succeeded", "Failed")]
        summary = {"evicted": [t["pod"] for t in ctx.intent.get("evict", ())],
                   "skipped": ctx.intent.get("skipped", [])}
        notice: StepNotice | None = None
        if ctx.intent.get("scope") == "gpu" and not ctx.dry_run:
            # NB: only where the change that follows cannot start under GPU pods (a driver,
            # a MIG layout): a drain keeps kubectl's way and does not chase them.
            returned = self._returned(ctx, on_node)
            if returned:
                again = self._evict_again(ctx, returned)
                if isinstance(again, Failed):
                    return again
                notice = again
                remaining += [t for t in returned if t["uid"] in present]
        if not remaining and notice is None and ctx.intent.get("scope") == "gpu" and not ctx.dry_run:
            settling = self._settling(ctx)
            if settling is not None:
                return settling
        if not remaining:
            return Done(say.evicted(len(ctx.intent.get("evict", ())), [str(t["pod"]) for t in ctx.intent.get("skipped", ())],
                                    dry_run=ctx.dry_run), summary)
        outcome = self._evict(ctx, remaining, present, summary)
        if notice is not None and isinstance(outcome, Waiting) and outcome.notice is None:
            return Waiting(outcome.reason, retry_in=outcome.retry_in, overdue_ok=outcome.overdue_ok, notice=notice)
        return outcome

    def _settling(self, ctx: StepContext) -> Waiting | None:
        """The evicted pods are gone; those that tolerate the cordon may be replaced on
        this node only now (their GPUs were still taken while they terminated): look again
        for `RETURN_SETTLE` from the first time all were gone (on record, so a restart
        does not start the wait again)."""
        evicted = list(ctx.intent.get("evict", ()))
        if not any(t.get("tolerates_cordon") for t in evicted):
            return None
        key = f"gone/{_rounds(ctx)}"
        if not ctx.recorded(key):
            ctx.record(key=key, action="pods.gone", target=f"node {ctx.node}",
                       detail={"pods": [t["pod"] for t in evicted]})
        since = ctx.recorded_at(key) or ctx.now
        left = (since + RETURN_SETTLE - ctx.now).total_seconds()
        if left <= 0:
            return None
        return Waiting(say.watching_for_return(), retry_in=left)

    def _returned(self, ctx: StepContext, on_node: Sequence[PodOnNode]) -> list[dict[str, Any]]:
        """Pods to evict that arrived on the node since the step chose its pods: a pod
        that tolerates node.kubernetes.io/unschedulable is placed on the cordoned node
        again (its owner replaces the evicted one there)."""
        known = {t["uid"] for key in ("evict", "terminating", "skipped") for t in ctx.intent.get(key, ())}
        found = []
        for pod in sorted(on_node, key=lambda p: (p.pod.namespace, p.pod.name)):
            if pod.uid in known or pod.pod.phase in ("Succeeded", "Failed"):
                continue
            decision = decide(pod, scope="gpu")
            if decision.action == "skip":
                continue
            owner = pod.pod.controller
            found.append({"pod": f"{pod.pod.namespace}/{pod.pod.name}", "uid": pod.uid, "why": decision.why,
                          "owner": f"{owner.kind} {owner.name}" if owner is not None else None,
                          "deleting": pod.pod.deleting})
        return found

    def _evict_again(self, ctx: StepContext, returned: Sequence[Mapping[str, Any]]) -> StepNotice | Failed:
        """Pods came back: each is evicted again, up to `evict_retries` rounds (the pool's
        setting, 3 by default); a round more fails the step naming them and their owners.
        The thread hears it once. Each pod's eviction is on record (with its round) before
        the round's own record, so a restart between them counts no round twice."""
        retries = _evict_retries(ctx)
        rounds = _rounds(ctx)
        fresh = [t for t in returned if not t["deleting"] and not ctx.recorded(f"evict/{t['uid']}")]
        shown = [say.pod_and_owner(t["pod"], t.get("owner")) for t in returned]
        if fresh:
            if rounds >= retries:
                return Failed(say.pods_keep_returning(ctx.node, shown, retries),
                              {"returned": [dict(t) for t in returned], "rounds": rounds}, code="pods-keep-returning")
            rounds += 1
            for target in fresh:
                ctx.record(key=f"evict/{target['uid']}", action="pod.evict", target=target["pod"],
                           detail={"node": ctx.node, "uid": target["uid"], "why": target["why"],
                                   "returned": True, "round": rounds, "owner": target.get("owner")})
            ctx.record(key=f"returned/{rounds}", action="pods.returned", target=f"node {ctx.node}",
                       detail={"round": rounds, "of": retries, "pods": shown})
        return StepNotice("pods-returned", say.pods_returned(ctx.node, shown, retries))

    def _evict(self, ctx: StepContext, remaining: list[Mapping[str, Any]], present: Mapping[str, PodOnNode],
               summary: Mapping[str, Any]) -> Outcome:
        blocked: dict[str, str] = {}
        throttled: dict[str, str] = {}  # 429s that were not a budget: the API asks to slow down
        retry_after = 2.0
        for target in remaining:
            pod = present[target["uid"]]
            if pod.pod.deleting:
                continue
            if ctx.recorded(f"delete/{target['uid']}"):
                # Escalated, yet neither terminating nor gone: the delete on record never
                # reached the API (the process stopped between the two). Send it now.
                self._delete(ctx, target)
                continue
            namespace, name = pod_ref(target["pod"])
            ctx.record(key=f"evict/{target['uid']}", action="pod.evict", target=target["pod"],
                       detail={"node": ctx.node, "uid": target["uid"], "why": target["why"]})
            ctx.act()
            try:
                ctx.gateway.evict_pod(namespace, name, uid=target["uid"], dry_run=ctx.dry_run)
            except TooManyRequests as err:
                if err.disruption_budget is False:
                    throttled[target["pod"]] = err.api_message
                    retry_after = max(retry_after, min(err.retry_after or 0.0, 30.0))
                else:
                    blocked[target["pod"]] = err.api_message
            except (NotFound, Conflict):
                continue  # gone, or replaced by a pod with another uid
        if ctx.dry_run:
            return Done(say.would_evict(len(remaining), blocked, [str(t["pod"]) for t in ctx.intent.get("skipped", ())]),
                        {**summary, "blocked": blocked})
        if blocked and ctx.expired:
            on_timeout = ctx.intent.get("on_timeout")
            if on_timeout == "delete":
                return self._escalate(ctx, remaining, blocked)
            if on_timeout == "skip":
                return LeftOut(say.left_out_blocked(ctx.node, blocked, ctx.timeout), {**summary, "blocked": blocked})
            return Failed(say.eviction_blocked_timeout(ctx.node, blocked, ctx.timeout),
                          {**summary, "blocked": blocked}, code="eviction-blocked")
        if throttled and not blocked:
            # Not a budget: no notice, no escalation; the step's own timeout still applies.
            return Waiting(say.eviction_throttled(throttled), retry_in=retry_after)
        if blocked:
            notice = StepNotice("pdb-blocked", say.pdb_blocking(ctx.node, blocked, deadline=ctx.deadline,
                                                            then=ctx.intent.get("on_timeout"), zone=ctx.zone))
            return Waiting(say.eviction_blocked(blocked), retry_in=2.0, notice=notice)
        terminating = [t["pod"] for t in remaining]
        if ctx.expired and any(ctx.recorded(f"delete/{t['uid']}") for t in remaining):
            if ctx.now >= (ctx.deadline or ctx.now) + dt.timedelta(seconds=120):
                return Failed(say.pods_would_not_go(terminating), code="pods-would-not-go")
            return Waiting(say.waiting_for_pods_to_go(terminating), retry_in=1.0, overdue_ok=True)
        return Waiting(say.waiting_for_pods_to_go(terminating), retry_in=1.0)

    def _escalate(self, ctx: StepContext, remaining: Sequence[Mapping[str, Any]],
                  blocked: Mapping[str, str]) -> Outcome:
        for target in remaining:
            if target["pod"] not in blocked:
                continue
            ctx.record(key=f"delete/{target['uid']}", action="pod.delete", target=target["pod"],
                       detail={"node": ctx.node, "uid": target["uid"], "why": say.escalated(blocked[target["pod"]])})
            self._delete(ctx, target)
        return Waiting(say.deleted_blocked_pods(sorted(blocked)), retry_in=1.0, overdue_ok=True)

    def _delete(self, ctx: StepContext, target: Mapping[str, Any]) -> None:
        """Delete the chosen pod (only while it is still the pod with the recorded uid)."""
        namespace, name = pod_ref(target["pod"])
        ctx.act()
        try:
            ctx.gateway.delete_pod(namespace, name, uid=target["uid"], dry_run=False)
        except (NotFound, Conflict):
            pass  # gone, or replaced by a pod with another uid


def _tolerates_cordon(tolerations: Sequence[Toleration]) -> bool:
    """Whether a pod with these tolerations may be placed on a cordoned node."""
    return any((t.key in ("", CORDON_TAINT) and t.operator == "Exists"
                or t.key == CORDON_TAINT and t.operator == "Equal")
               and t.effect in ("", "NoSchedule") for t in tolerations)


# The taint the node controller puts on a cordoned node.
CORDON_TAINT = "node.kubernetes.io/unschedulable"
# How long the evict step looks for replacements of pods that tolerate the cordon once
# the evicted ones are gone.
RETURN_SETTLE = dt.timedelta(seconds=5)


def _rounds(ctx: StepContext) -> int:
    """How many times pods that came back were evicted again (their rounds on record)."""
    return next((k for k in range(_evict_retries(ctx), 0, -1) if ctx.recorded(f"returned/{k}")), 0)


def _evict_retries(ctx: StepContext) -> int:
    found = params_of(ctx, EvictParams).evict_retries
    value = DEFAULT_EVICT_RETRIES if found is None else found
    if value < 0:
        raise StepParamsError(f"evict_retries must be a whole number, 0 or more, not {value!r}")
    return value


# How often pods that come straight back to the cordoned node are evicted again (a pool's
# `evict_retries` overrides it).
DEFAULT_EVICT_RETRIES = 3

