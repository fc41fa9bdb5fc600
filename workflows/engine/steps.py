"""What each kind of step does to one node, as gates and actions that are safe to repeat.

The engine (`workflows.engine.loop`) runs a step in two calls, with a durable transition
before each side effect:

1. `prepare(ctx)` reads the cluster and returns the step's *intent* (what it found and
   what it is about to do: the node's prior schedulability, the pods it will evict, the
   driver pod it will delete). No side effects. The engine stores the intent with the
   step's move to `running`, in the same transaction as its audit row and outbox message.
2. `advance(ctx)` is called after that commit, again on every watch event about the node,
   on the step's timer, and after a restart. It observes the cluster first and acts only
   when the effect is not there yet (idempotency by observation: a node that already
   carries this run's cordon mark is cordoned; a driver pod whose recorded uid is gone was
   deleted), then answers `Done`, `Waiting` or `Failed`.

Side effects go through `ctx.act()` first, which refuses (raises `LeaseLost`) when this
replica does not hold the engine lease, and an action that must be on record before it
happens for each of several objects (one eviction per pod) goes through `ctx.record()`,
which commits an audit row once per intent key.

Reads that decide an action come fresh from the API (`ctx.gateway`), never from the
watch cache, which may lag behind the engine's own last write. Waiting for a condition
reads the watch cache (`ctx.node_inventory()`), and the engine calls `advance` again on
every change the cache reports.

Gates fail closed: an API error is never read as "nothing to do"; a step the API refuses
for lack of permission or a bad request fails at once, with the API's words.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from storage import codec
from storage.steps import StepKind
from workflows.engine import check_pod
from workflows.engine import messages as say
from workflows.fleet.assessment import UPGRADE_DONE, UPGRADE_FAILED, NodeInventory, image_tag, pod_state, version_of_tag
from workflows.kube.errors import Conflict, NotFound, TooManyRequests
from workflows.kube.gateway import KubeGateway
from workflows.kube.gateway.paths import CLUSTER_POLICIES, NVIDIA_DRIVERS
from workflows.kube.labels import (
    ANNOTATION_CORDONED_BY,
    ANNOTATION_MIRROR,
    ANNOTATION_UPGRADE_HELD_BY,
    ANNOTATION_UPGRADE_INITIAL_UNSCHEDULABLE,
    LABEL_DEPLOY_PREFIX,
    LABEL_GPU_USER,
    LABEL_MIG_CONFIG,
    LABEL_MIG_CONFIG_STATE,
    LABEL_UPGRADE_SKIP,
    LABEL_UPGRADE_STATE,
    PAUSED_FOR_MIG_CHANGE,
    POD_SELECTOR_DRIVER,
)
from workflows.kube.objects import CustomObject, NodeObject, PodOnNode, Taint, Toleration, is_gpu_resource

# NVIDIA_VISIBLE_DEVICES values that hand a container no GPU.
_NO_DEVICES = frozenset({"", "void", "none"})

EvictScope = Literal["gpu", "all"]
# The evict scope drain plans write (workflows.drain.plan): `all` here.
DRAIN_PLAN_SCOPE = "all-non-daemonset"


class LeaseLost(Exception):
    """This replica does not hold the engine lease (any more): it must not act."""


# --- outcomes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    note: str
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Notice:
    """Something people should hear about while a step waits (a PodDisruptionBudget
    holding up an eviction, a window about to end): posted once per step and `key` in
    the request's thread."""

    key: str
    text: str
    # One notice for the whole run rather than one per node's step.
    per_run: bool = False
    # What makes it news again under the same key (a drain's extended end), if anything.
    again_for: str | None = None


@dataclass(frozen=True)
class Waiting:
    reason: str
    # Look again after this many seconds even without a watch event (None: only on
    # events, plus the engine's slow safety resync).
    retry_in: float | None = None
    # The step handles its own deadline (it escalated and is finishing that off).
    overdue_ok: bool = False
    notice: Notice | None = None


@dataclass(frozen=True)
class LeftOut:
    """The node is left out of the run: its remaining steps are skipped, except that a
    node this run cordoned is given back (its `uncordon` step still runs); the run goes
    on with the other nodes."""

    reason: str
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    reason: str
    detail: Mapping[str, Any] = field(default_factory=dict)


Outcome = Done | Waiting | Failed | LeftOut


class StepContext(Protocol):
    """What a step may see and do; the engine provides it."""

    run_id: str
    request_id: str
    node: str
    kind: StepKind
    params: Mapping[str, Any]
    # The intent `prepare` returned (stored with the move to running).
    intent: Mapping[str, Any]
    plan_kind: str
    dry_run: bool
    now: dt.datetime
    # How long the step may take, and when that is up (None: no limit).
    timeout: dt.timedelta | None
    deadline: dt.datetime | None
    # Who the cordon mark says asked for the change ("gpuops for alice").
    cordoned_by: str
    window_end: dt.datetime | None
    gateway: KubeGateway

    @property
    def expired(self) -> bool: ...

    def act(self) -> None:
        """Call before every side effect: raises LeaseLost unless this replica holds the lease."""

    def record(self, *, key: str, action: str, target: str, detail: Mapping[str, Any]) -> None:
        """Commit an audit row for this step's intent `key`, unless one was recorded
        already (by this process or before a restart)."""

    def recorded(self, key: str) -> bool: ...

    def recorded_at(self, key: str) -> dt.datetime | None:
        """When the audit row for intent `key` was committed; None if it was not."""

    def node_inventory(self) -> NodeInventory | None:
        """The node as the watch cache sees it now."""

    def step_intent(self, kind: StepKind) -> Mapping[str, Any] | None:
        """The intent of this node's earlier step of `kind` in this run, if any."""

    def run_unfinished(self, run_id: str) -> bool:
        """Whether another run is still pending, running or paused."""


# --- the step kinds ----------------------------------------------------------------------


class StepLogic(Protocol):
    def timeout(self, ctx: StepContext) -> dt.timedelta | None: ...

    def prepare(self, ctx: StepContext) -> dict[str, Any]: ...

    def advance(self, ctx: StepContext) -> Outcome: ...


# A pool's pdb_timeout_action (config) as the evict step's on_timeout.
_ON_TIMEOUT = {"wait": "fail", "skip": "skip", "delete": "delete"}


def _seconds(params: Mapping[str, Any], default: float) -> dt.timedelta:
    value = params.get("timeout_s", params.get("timeout_seconds", default))
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise StepParamsError(f"timeout_s must be a number of seconds, not {value!r}") from None
    if seconds <= 0:
        raise StepParamsError(f"timeout_s must be more than 0, not {value!r}")
    return dt.timedelta(seconds=seconds)


class StepParamsError(ValueError):
    """A step's params cannot be used; the step fails with this message."""


# ---- cordon and uncordon


@dataclass(frozen=True)
class CordonMark:
    """The annotation `gpuops.io/cordoned-by` gpuops writes when it cordons a node."""

    run: str
    by: str
    prior_unschedulable: bool
    at: str

    def to_text(self) -> str:
        return codec.json_to_text({"run": self.run, "by": self.by,
                                   "prior_unschedulable": self.prior_unschedulable, "at": self.at})

    @staticmethod
    def of(node: NodeObject) -> CordonMark | None:
        raw = node.annotations.get(ANNOTATION_CORDONED_BY)
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("run"), str):
            return None
        return CordonMark(run=value["run"], by=str(value.get("by") or ""),
                          prior_unschedulable=bool(value.get("prior_unschedulable")),
                          at=str(value.get("at") or ""))


class Cordon:
    """Make the node unschedulable and mark it as this run's, with its prior state.

    A node someone else cordoned gets the mark too (prior_unschedulable true), so the
    uncordon step knows to leave it cordoned. A node another gpuops run still holds
    (cordoned, with that run's mark) is left alone: that run's mark stays, and this run
    will not uncordon it; unless `takes_over` names that (finished) run, as a rollback's
    does: then the mark becomes this run's, with that run's record of the node before it."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 120)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        node = ctx.gateway.get_node(ctx.node)
        mark = CordonMark.of(node)
        intent: dict[str, Any] = {"prior_unschedulable": node.unschedulable}
        if mark is not None and mark.run != ctx.run_id:
            intent["other_mark"] = {"run": mark.run, "by": mark.by}
        return intent

    def advance(self, ctx: StepContext) -> Outcome:
        node = ctx.gateway.get_node(ctx.node)
        mark = CordonMark.of(node)
        if mark is not None and mark.run == ctx.run_id and node.unschedulable:
            return Done(say.cordon_in_place(mark.prior_unschedulable),
                        {"prior_unschedulable": mark.prior_unschedulable})
        prior = node.unschedulable
        if node.unschedulable and mark is not None and mark.run != ctx.run_id:
            if ctx.run_unfinished(mark.run):
                # Two runs must never change one node at once: fail closed.
                return Failed(say.node_in_other_run(ctx.node, mark.run, mark.by))
            if mark.run != ctx.params.get("takes_over"):
                return Done(say.cordoned_by_other_run(mark.run, mark.by),
                            {"prior_unschedulable": True, "held_by_run": mark.run})
            # A rollback takes over the cordon the run it undoes left, with that run's
            # record of the node before it, so it gives the node back as it was then.
            prior = mark.prior_unschedulable
        new_mark = CordonMark(run=ctx.run_id, by=ctx.cordoned_by, prior_unschedulable=prior,
                              at=codec.time_to_text(ctx.now))
        annotations = {ANNOTATION_CORDONED_BY: new_mark.to_text()}
        ctx.act()
        try:
            if node.unschedulable:
                ctx.gateway.annotate_node(ctx.node, annotations=annotations,
                                          resource_version=node.resource_version, dry_run=ctx.dry_run)
            else:
                ctx.gateway.cordon_node(ctx.node, annotations=annotations,
                                        resource_version=node.resource_version, dry_run=ctx.dry_run)
        except Conflict:
            return Waiting(say.node_changed_meanwhile(ctx.node), retry_in=0.2)
        if mark is not None and node.unschedulable and mark.run == ctx.params.get("takes_over"):
            return Done(say.cordon_taken_over(mark.run, prior_unschedulable=prior), {"prior_unschedulable": prior})
        note = say.cordoned(prior_unschedulable=node.unschedulable, dry_run=ctx.dry_run)
        return Done(note, {"prior_unschedulable": node.unschedulable})


class Uncordon:
    """Make the node schedulable again, only if this run cordoned it and it was
    schedulable before; always remove this run's mark. The engine starts this step only
    when every earlier step of the node is done (so after validation), or when the node
    was left out of the run (then it is given back as it was)."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 120)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        node = ctx.gateway.get_node(ctx.node)
        mark = CordonMark.of(node)
        ours = mark is not None and mark.run == ctx.run_id
        return {"unschedulable": node.unschedulable, "ours": ours,
                "prior_unschedulable": mark.prior_unschedulable if ours and mark else None}

    def advance(self, ctx: StepContext) -> Outcome:
        node = ctx.gateway.get_node(ctx.node)
        if ctx.dry_run:
            return self._dry_run(ctx, node)
        mark = CordonMark.of(node)
        if mark is None or mark.run != ctx.run_id:
            return Done(say.not_ours_to_uncordon(node.unschedulable), {"unschedulable": node.unschedulable})
        remove = {ANNOTATION_CORDONED_BY: None}
        ctx.act()
        try:
            if mark.prior_unschedulable:
                ctx.gateway.annotate_node(ctx.node, annotations=remove,
                                          resource_version=node.resource_version, dry_run=False)
            else:
                ctx.gateway.uncordon_node(ctx.node, annotations=remove,
                                          resource_version=node.resource_version, dry_run=False)
        except Conflict:
            return Waiting(say.node_changed_meanwhile(ctx.node), retry_in=0.2)
        if mark.prior_unschedulable:
            return Done(say.stays_cordoned(), {"unschedulable": True})
        return Done(say.uncordoned(), {"unschedulable": False})

    def _dry_run(self, ctx: StepContext, node: NodeObject) -> Outcome:
        # Nothing was cordoned for real; answer from what the cordon step found.
        cordon = ctx.step_intent("cordon") or {}
        if cordon.get("prior_unschedulable", node.unschedulable) or "other_mark" in cordon:
            return Done(say.stays_cordoned(), {"unschedulable": True})
        ctx.act()
        ctx.gateway.uncordon_node(ctx.node, annotations={ANNOTATION_CORDONED_BY: None},
                                  resource_version=None, dry_run=True)
        return Done(say.would_uncordon(), {"unschedulable": False})


# ---- evict


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


def gpu_pods_in_the_way(ctx: StepContext) -> list[str]:
    """GPU pods (not DaemonSet, not finished, not terminating) still on the node: a driver
    cannot unload and a MIG layout cannot change under them. Pods that tolerate the
    cordon come back after an eviction; this gate keeps the change from starting on top
    of them (fail closed), unless params say `allow_gpu_pods: true`."""
    if ctx.params.get("allow_gpu_pods") is True:
        return []
    in_the_way = []
    for pod in ctx.gateway.list_pods_on_node(ctx.node):
        decision = decide(pod, scope="gpu")
        if decision.action == "evict":
            in_the_way.append(f"{pod.pod.namespace}/{pod.pod.name}")
    return sorted(in_the_way)


def _namespace_and_name(pod: str) -> tuple[str, str]:
    """A pod as the intent names it, "namespace/name" (neither part holds a slash)."""
    namespace, _, name = pod.partition("/")
    return namespace, name


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

    def scope(self, ctx: StepContext) -> EvictScope:
        value = ctx.params.get("scope")
        if value == DRAIN_PLAN_SCOPE:
            value = "all"  # what drain plans write: DaemonSet pods are skipped either way
        if value is None:
            value = self._default_scope or ("all" if ctx.plan_kind == "drain" else "gpu")
        if value not in ("gpu", "all"):
            raise StepParamsError(f"evict scope must be 'gpu' or 'all', not {value!r}")
        return value

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        params = ctx.params
        if "timeout_s" not in params and "pdb_timeout_s" in params:
            params = {"timeout_s": params["pdb_timeout_s"]}  # a drain plan: the pool's drain_timeout
        return _seconds(params, 600)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        scope = self.scope(ctx)
        # A drain plan says the pool's pdb_timeout_action: `wait` halts the run with the
        # node cordoned, for a person to decide; `skip` leaves the node out; `delete` deletes.
        default = _ON_TIMEOUT.get(str(ctx.params.get("pdb_timeout_action")), "fail")
        on_timeout = ctx.params.get("on_timeout", default)
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
        notice: Notice | None = None
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
            return Done(say.evicted(len(ctx.intent.get("evict", ())), len(ctx.intent.get("skipped", ())),
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

    def _evict_again(self, ctx: StepContext, returned: Sequence[Mapping[str, Any]]) -> Notice | Failed:
        """Pods came back: each is evicted again, up to `evict_retries` rounds (the pool's
        setting, 3 by default); a round more fails the step naming them and their owners.
        The thread hears it once. Each pod's eviction is on record (with its round) before
        the round's own record, so a restart between them counts no round twice."""
        retries = _evict_retries(ctx.params)
        rounds = _rounds(ctx)
        fresh = [t for t in returned if not t["deleting"] and not ctx.recorded(f"evict/{t['uid']}")]
        shown = [say.pod_and_owner(t["pod"], t.get("owner")) for t in returned]
        if fresh:
            if rounds >= retries:
                return Failed(say.pods_keep_returning(ctx.node, shown, retries),
                              {"returned": [dict(t) for t in returned], "rounds": rounds})
            rounds += 1
            for target in fresh:
                ctx.record(key=f"evict/{target['uid']}", action="pod.evict", target=target["pod"],
                           detail={"node": ctx.node, "uid": target["uid"], "why": target["why"],
                                   "returned": True, "round": rounds, "owner": target.get("owner")})
            ctx.record(key=f"returned/{rounds}", action="pods.returned", target=f"node {ctx.node}",
                       detail={"round": rounds, "of": retries, "pods": shown})
        return Notice("pods-returned", say.pods_returned(ctx.node, shown, retries))

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
            namespace, name = _namespace_and_name(target["pod"])
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
            return Done(say.would_evict(len(remaining), blocked, len(ctx.intent.get("skipped", ()))),
                        {**summary, "blocked": blocked})
        if blocked and ctx.expired:
            on_timeout = ctx.intent.get("on_timeout")
            if on_timeout == "delete":
                return self._escalate(ctx, remaining, blocked)
            if on_timeout == "skip":
                return LeftOut(say.left_out_blocked(ctx.node, blocked, ctx.timeout), {**summary, "blocked": blocked})
            return Failed(say.eviction_blocked_timeout(ctx.node, blocked, ctx.timeout),
                          {**summary, "blocked": blocked})
        if throttled and not blocked:
            # Not a budget: no notice, no escalation; the step's own timeout still applies.
            return Waiting(say.eviction_throttled(throttled), retry_in=retry_after)
        if blocked:
            notice = Notice("pdb-blocked", say.pdb_blocking(ctx.node, blocked, deadline=ctx.deadline,
                                                            then=ctx.intent.get("on_timeout")))
            return Waiting(say.eviction_blocked(blocked), retry_in=2.0, notice=notice)
        terminating = [t["pod"] for t in remaining]
        if ctx.expired and any(ctx.recorded(f"delete/{t['uid']}") for t in remaining):
            if ctx.now >= (ctx.deadline or ctx.now) + dt.timedelta(seconds=120):
                return Failed(say.pods_would_not_go(terminating))
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
        namespace, name = _namespace_and_name(target["pod"])
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
    return next((k for k in range(_evict_retries(ctx.params), 0, -1) if ctx.recorded(f"returned/{k}")), 0)


def _evict_retries(params: Mapping[str, Any]) -> int:
    value = params.get("evict_retries", DEFAULT_EVICT_RETRIES)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StepParamsError(f"evict_retries must be a whole number, 0 or more, not {value!r}")
    return value


# How often pods that come straight back to the cordoned node are evicted again (a pool's
# `evict_retries` overrides it).
DEFAULT_EVICT_RETRIES = 3


# ---- wait-for and validate


Check = Callable[[NodeInventory], tuple[bool, str]]


def _ready(inv: NodeInventory) -> tuple[bool, str]:
    return inv.ready is True, say.node_ready_text(inv.ready)


def _advertised(inv: NodeInventory) -> tuple[bool, str]:
    expected = inv.expected_advertised
    ok = expected is not None and inv.advertised_gpus == expected and inv.allocatable_gpus == expected
    return ok, say.advertised_text(inv.advertised_gpus, inv.allocatable_gpus, expected)


def _pod_check(attribute: str, label: str) -> Check:
    def check(inv: NodeInventory) -> tuple[bool, str]:
        state = getattr(inv, attribute)
        return state.condition == "healthy", f"{label} {state.text}"
    return check


def _driver(inv: NodeInventory) -> tuple[bool, str]:
    if inv.driver.owner == "host":
        return True, say.host_driver()
    return inv.driver_pod.condition == "healthy", f"driver pod {inv.driver_pod.text}"


def _operator_driver(inv: NodeInventory) -> tuple[bool, str]:
    """The GPU Operator's driver pod (not a host driver) is Ready on the node."""
    pod = inv.driver_pod
    ok = pod.present and pod.condition == "healthy" and inv.driver.owner == "operator"
    return ok, say.operator_driver_state(pod.present, pod.text, inv.driver.owner)


def _no_operator_driver(inv: NodeInventory) -> tuple[bool, str]:
    """The GPU Operator's driver pod is gone from the node (its deploy label turned off)."""
    return not inv.driver_pod.present, say.operator_driver_state(inv.driver_pod.present, inv.driver_pod.text,
                                                                 inv.driver.owner)


def _mig(inv: NodeInventory) -> tuple[bool, str]:
    return inv.mig.config_state == "success", say.mig_state_text(inv.mig.config, inv.mig.config_state)


CONDITIONS: dict[str, Check] = {
    "node-ready": _ready,
    "gpus-advertised": _advertised,
    "device-plugin-ready": _pod_check("device_plugin_pod", "device plugin"),
    "validator-ready": _pod_check("validator_pod", "validator"),
    "driver-ready": _driver,
    "operator-driver-ready": _operator_driver,
    "no-operator-driver": _no_operator_driver,
    "mig-success": _mig,
}
DEFAULT_WAIT_FOR = ("node-ready", "gpus-advertised", "device-plugin-ready", "validator-ready")
DEFAULT_VALIDATE = ("node-ready", "driver-ready", "device-plugin-ready", "validator-ready", "gpus-advertised")


class WaitFor:
    """Wait until conditions hold on the node, read from the watch cache's inventory.

    `conditions` (or one `condition`) from: node-ready, gpus-advertised (capacity and
    allocatable equal what GFD's labels say the node should advertise),
    device-plugin-ready, validator-ready, driver-ready (or a host driver), mig-success.
    Default for wait-for: node Ready, GPUs advertised, device plugin and validator Ready;
    `validate` adds the driver. `timeout_s` defaults to 600."""

    def __init__(self, defaults: Sequence[str]) -> None:
        self._defaults = tuple(defaults)

    def conditions(self, ctx: StepContext) -> tuple[str, ...]:
        wanted = ctx.params.get("conditions", ctx.params.get("condition", self._defaults))
        names = (wanted,) if isinstance(wanted, str) else tuple(wanted)
        unknown = [n for n in names if n not in CONDITIONS]
        if unknown or not names:
            raise StepParamsError(say.unknown_conditions(unknown, sorted(CONDITIONS)))
        return names

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 600)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        return {"conditions": list(self.conditions(ctx))}

    def advance(self, ctx: StepContext) -> Outcome:
        inv = ctx.node_inventory()
        names = self.conditions(ctx)
        if inv is None:
            unmet = [say.node_not_in_cache(ctx.node)]
        else:
            results = [CONDITIONS[name](inv) for name in names]
            unmet = [text for ok, text in results if not ok]
        if not unmet:
            return Done(say.conditions_hold(names))
        if ctx.dry_run:
            return Done(say.would_wait_for(unmet))
        return Waiting(say.waiting_for(unmet))


class WaitForJobs:
    """Wait until no pod matching `selector` (a label selector) still runs on the node;
    at `timeout_s` (default 3600) fail, or carry on if `on_timeout` is `continue`."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 3600)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        selector = ctx.params.get("selector")
        if not isinstance(selector, str) or not selector:
            raise StepParamsError("wait-for-jobs needs a label selector in params.selector")
        return {"selector": selector, "on_timeout": ctx.params.get("on_timeout", "fail")}

    def advance(self, ctx: StepContext) -> Outcome:
        pods = ctx.gateway.list_pods_on_node(ctx.node, label_selector=ctx.intent["selector"])
        running = sorted(f"{p.pod.namespace}/{p.pod.name}" for p in pods
                         if p.pod.phase in ("Pending", "Running") and not p.pod.deleting)
        if not running:
            return Done(say.jobs_finished(ctx.intent["selector"]))
        if ctx.dry_run:
            return Done(say.would_wait_for_jobs(running))
        if ctx.expired and ctx.intent.get("on_timeout") == "continue":
            return Done(say.jobs_still_running_continue(running))
        return Waiting(say.waiting_for_jobs(running), retry_in=5.0)


# ---- driver and MIG


def _driver_pods(ctx: StepContext) -> list[PodOnNode]:
    key, value = POD_SELECTOR_DRIVER
    return ctx.gateway.list_pods_on_node(ctx.node, label_selector=f"{key}={value}")


def _newest_driver_pod(ctx: StepContext) -> PodOnNode | None:
    live = [p for p in _driver_pods(ctx) if not p.pod.deleting]
    return max(live, key=lambda p: p.pod.created_at) if live else None


def _driver_pod_intent(pod: PodOnNode | None) -> dict[str, Any] | None:
    if pod is None:
        return None
    state = pod_state(pod.pod)
    return {"pod": f"{pod.pod.namespace}/{pod.pod.name}", "uid": pod.uid, "version": state.version,
            "ready": state.condition == "healthy"}


def _driver_templates_not_at(ctx: StepContext, namespace: str, wanted: str) -> list[str]:
    """The driver DaemonSets that would make this node's next driver pod at another
    version than `wanted` ("name (version)"); none at all counts as one not there."""
    labels = ctx.gateway.get_node(ctx.node).labels
    selecting = [t for t in ctx.gateway.list_driver_templates(namespace) if not t.deleting and t.selects(labels)]
    if not selecting:
        return [say.no_driver_daemonset()]
    behind = []
    for template in selecting:
        version = version_of_tag(image_tag(template.driver_image)) if template.driver_image else None
        if version != wanted:
            behind.append(f"{template.name} ({version or 'no driver image'})")
    return behind


class Driver:
    """Restart the node's GPU Operator driver pod so its OnDelete DaemonSet recreates it
    from the current template, then wait until the new pod is Running and Ready.

    The pod to delete (namespace, name, uid) is chosen when the step starts; after a
    restart, a recorded uid that is gone or terminating means the delete happened. With
    `version`, a node whose driver pod already runs it (and is Ready) is left alone, and a
    new pod that runs another version fails the step (update the ClusterPolicy or
    NVIDIADriver first). A node without an operator driver pod (a host driver) fails the
    step: gpuops does not change host drivers. GPU pods still on the node (a replica that
    tolerates the cordon came back) hold the restart until they are gone or time is up
    (`allow_gpu_pods: true` skips that gate). `timeout_s` defaults to 900."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 900)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        return {"driver_pod": _driver_pod_intent(_newest_driver_pod(ctx)), "version": ctx.params.get("version")}

    def advance(self, ctx: StepContext) -> Outcome:
        old = ctx.intent.get("driver_pod")
        wanted = ctx.intent.get("version")
        if old is None:
            return Failed(say.no_driver_pod(ctx.node))
        pods = _driver_pods(ctx)
        current = next((p for p in pods if p.uid == old["uid"]), None)
        if current is not None and not current.pod.deleting:
            state = pod_state(current.pod)
            if wanted and state.version == wanted and state.condition == "healthy":
                return Done(say.driver_already_at(wanted))
            if wanted and not ctx.dry_run:
                behind = _driver_templates_not_at(ctx, current.pod.namespace, wanted)
                if behind:
                    # A pod deleted now would come back at the old version: the operator
                    # has not put the new one into (or replaced) its DaemonSet yet.
                    return Waiting(say.driver_template_not_yet(wanted, behind), retry_in=2.0)
            in_the_way = gpu_pods_in_the_way(ctx)
            if in_the_way and not ctx.dry_run:
                return Waiting(say.gpu_pods_in_the_way(in_the_way, "restarting the driver"), retry_in=5.0)
            namespace, name = _namespace_and_name(old["pod"])
            ctx.act()
            try:
                ctx.gateway.delete_pod(namespace, name, uid=old["uid"], dry_run=ctx.dry_run)
            except (NotFound, Conflict):
                pass
            if ctx.dry_run:
                return Done(say.would_restart_driver(old["pod"]))
            return Waiting(say.driver_deleted(old["pod"]), retry_in=2.0)
        if ctx.dry_run:
            return Done(say.would_restart_driver(old["pod"]))
        fresh = [p for p in pods if p.uid != old["uid"] and not p.pod.deleting]
        if not fresh:
            return Waiting(say.waiting_for_new_driver_pod(), retry_in=5.0)
        state = pod_state(max(fresh, key=lambda p: p.pod.created_at).pod)
        if state.crash_looping or state.condition == "failing":
            return Failed(say.new_driver_failing(state.name or "?", state.text))
        if state.condition != "healthy":
            return Waiting(say.new_driver_not_ready(state.name or "?", state.text), retry_in=5.0)
        if wanted and state.version != wanted:
            return Failed(say.new_driver_wrong_version(state.name or "?", state.version, wanted))
        return Done(say.driver_restarted(state.name or "?", state.version))


class Mig:
    """Ask the MIG manager for a layout: set label nvidia.com/mig.config to params.config
    and wait until nvidia.com/mig.config.state says success (failed fails the step) and,
    with `expect` ({resource: count}), until the node advertises exactly those GPU
    resources. While it waits, the reason names the operands still paused-for-mig-change
    and what the node advertises, so a step that times out says where it stuck.

    The same patch clears nvidia.com/mig.config.state, so a `success` read afterwards is
    the MIG manager's answer to this change, not the previous layout's. A node already at
    the layout with state success is left alone. GPU pods still on the node hold the change
    as for the driver step. `timeout_s` defaults to 1800."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 1800)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        config = ctx.params.get("config")
        if not isinstance(config, str) or not config:
            raise StepParamsError("a mig step needs the MIG layout in params.config (e.g. all-1g.10gb)")
        node = ctx.gateway.get_node(ctx.node)
        return {"config": config, "prior_config": node.labels.get(LABEL_MIG_CONFIG),
                "prior_state": node.labels.get(LABEL_MIG_CONFIG_STATE)}

    def advance(self, ctx: StepContext) -> Outcome:
        config = ctx.intent["config"]
        node = ctx.gateway.get_node(ctx.node)
        state = node.labels.get(LABEL_MIG_CONFIG_STATE)
        if node.labels.get(LABEL_MIG_CONFIG) != config:
            in_the_way = gpu_pods_in_the_way(ctx)
            if in_the_way and not ctx.dry_run:
                return Waiting(say.gpu_pods_in_the_way(in_the_way, "changing the MIG layout"), retry_in=5.0)
            ctx.act()
            ctx.gateway.label_node(ctx.node, labels={LABEL_MIG_CONFIG: config, LABEL_MIG_CONFIG_STATE: None},
                                   dry_run=ctx.dry_run)
            if ctx.dry_run:
                return Done(say.would_set_mig(config, node.labels.get(LABEL_MIG_CONFIG)))
            return Waiting(say.mig_requested(config), retry_in=5.0)
        advertised = {k: int(v) for k, v in node.capacity.items() if is_gpu_resource(k) and v.isdigit() and int(v)}
        if ctx.dry_run:
            return Done(say.mig_applied(config))
        if state == "success":
            expect = {str(k): int(v) for k, v in (ctx.params.get("expect") or {}).items() if int(v)}
            if expect and advertised != expect:
                return Waiting(say.mig_not_advertised(config, _counted(advertised), _counted(expect)), retry_in=5.0)
            return Done(say.mig_applied(config))
        if state == "failed":
            return Failed(say.mig_failed(ctx.node, config))
        paused = sorted(key.removeprefix(LABEL_DEPLOY_PREFIX) for key, value in node.labels.items()
                        if key.startswith(LABEL_DEPLOY_PREFIX) and value == PAUSED_FOR_MIG_CHANGE)
        return Waiting(say.mig_waiting(config, state, paused, _counted(advertised)), retry_in=5.0)


def _counted(resources: Mapping[str, int]) -> str:
    return ", ".join(f"{n}x {r}" for r, n in sorted(resources.items())) or "no GPUs"


class DriverVersion:
    """Set the driver version on the one object that sets it for the run's pool: a
    ClusterPolicy (`spec.driver.version`) or an NVIDIADriver (`spec.version`), by merge
    patch, once. Params: `object` (ClusterPolicy | NVIDIADriver), `name`, `version`.

    The version it found is kept in the step's intent (what a rollback restores) and on the
    audit row written before the patch. A patch that landed before a restart is not sent
    again (the object already names the version); an object someone else changed since the
    step began fails the step instead of being overwritten. The patch names the
    resourceVersion it decided on, so it cannot land on a later change (409: read again).
    The node it is planned on is the canary's; the object is cluster-wide. `timeout_s`
    defaults to 120."""

    _PATHS = {"ClusterPolicy": (CLUSTER_POLICIES, ("driver", "version")),
              "NVIDIADriver": (NVIDIA_DRIVERS, ("version",))}

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 120)

    def _where(self, params: Mapping[str, Any]) -> tuple[str, tuple[str, ...], str, str]:
        kind, name, version = params.get("object"), params.get("name"), params.get("version")
        if kind not in self._PATHS or not isinstance(name, str) or not name or not isinstance(version, str):
            raise StepParamsError(say.driver_version_params())
        path, field = self._PATHS[kind]
        return path, field, name, f"{kind} {name}"

    @staticmethod
    def _version(spec: Mapping[str, Any], field: tuple[str, ...]) -> str | None:
        value: Any = spec
        for key in field:
            value = value.get(key) if isinstance(value, Mapping) else None
        return str(value) if value is not None else None

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        path, field, name, ref = self._where(ctx.params)
        found = ctx.gateway.get_custom_object(path, name)
        if ctx.params.get("set_back") is True:
            return self._prepare_back(ctx, found, field, ref)
        return {"object": ref, "version": ctx.params["version"], "prior_version": self._version(found.spec, field)}

    def advance(self, ctx: StepContext) -> Outcome:
        if ctx.params.get("set_back") is True:
            return self._set_back(ctx)
        path, field, name, ref = self._where(ctx.params)
        version, prior = ctx.intent["version"], ctx.intent.get("prior_version")
        found = ctx.gateway.get_custom_object(path, name)
        current = self._version(found.spec, field)
        if current == version:
            return Done(say.driver_version_already(ref, version) if prior == version
                        else say.driver_version_set(ref, prior, version))
        if current != prior:
            return Failed(say.driver_version_changed_meanwhile(ref, prior, current, version))
        if not ctx.dry_run:
            ctx.record(key=f"patch/{ref}", action="driver-version.set", target=ref,
                       detail={"from": prior, "to": version, "node": ctx.node})
        patch = _merge_patch(field, version)
        ctx.act()
        try:
            ctx.gateway.patch_custom_object(path, name, spec=patch, resource_version=found.resource_version,
                                            dry_run=ctx.dry_run)
        except Conflict:
            return Waiting(say.driver_version_set(ref, prior, version) + " (changed meanwhile; reading again)",
                           retry_in=1.0)
        if ctx.dry_run:
            return Done(say.would_set_driver_version(ref, prior, version))
        return Done(say.driver_version_set(ref, prior, version))


    # -- set back (`set_back: true`): a failed canary's object disarmed

    def _prepare_back(self, ctx: StepContext, found: CustomObject, field: tuple[str, ...],
                      ref: str) -> dict[str, Any]:
        # What this run's own driver-version step found and set (it is the canary node's too).
        forward = ctx.step_intent("driver-version") or {}
        return {"object": ref, "set_back": True, "version": forward.get("prior_version"),
                "run_set": forward.get("version"), "found": self._version(found.spec, field),
                "git": git_owner(found.labels, found.annotations)}

    def _set_back(self, ctx: StepContext) -> Outcome:
        """Put back the version this run's driver-version step replaced, only while the
        object still names the version the run set (never over a later change), by one
        merge patch naming the resourceVersion it decided on; audited before it is sent.
        An object Git keeps (Argo CD, Flux) is not patched: the note says what to set back
        in Git, since a sync would put the run's version back."""
        path, field, name, ref = self._where(ctx.params)
        back, run_set = ctx.intent.get("version"), ctx.intent.get("run_set")
        if not run_set or not back or back == run_set:
            return Done(say.set_back_nothing(ref))
        found = ctx.gateway.get_custom_object(path, name)
        current = self._version(found.spec, field)
        at_risk = say.set_back_nodes_wait(ctx.node, ctx.run_id)
        if current == back and ctx.recorded(f"set-back/{ref}"):
            return Done(say.driver_version_set_back(ref, run_set, back, at_risk), {"from": run_set, "to": back})
        if current != run_set:
            text = (say.set_back_already(ref, back) if current == back
                    else say.set_back_left_alone(ref, current, run_set))
            return Done(text, {"found": current})
        git = ctx.intent.get("git")
        if git:
            where = ".".join(("spec", *field))
            return Done(say.set_back_in_git(ref, str(git), where, run_set, back, at_risk),
                        {"git": git, "from": run_set, "to": back})
        if ctx.dry_run:
            return Done(say.would_set_back(ref, run_set, back))
        ctx.record(key=f"set-back/{ref}", action="driver-version.set-back", target=ref,
                   detail={"from": run_set, "to": back, "node": ctx.node})
        patch = _merge_patch(field, back)
        ctx.act()
        try:
            ctx.gateway.patch_custom_object(path, name, spec=patch, resource_version=found.resource_version,
                                            dry_run=False)
        except Conflict:
            return Waiting(say.set_back_reading_again(ref), retry_in=1.0)
        return Done(say.driver_version_set_back(ref, run_set, back, at_risk), {"from": run_set, "to": back})


def _merge_patch(field: tuple[str, ...], value: object) -> dict[str, Any]:
    """The merge patch of `spec` that sets `field` (a path of keys under spec) to `value`."""
    patch: dict[str, Any] = {field[-1]: value}
    for key in reversed(field[:-1]):
        patch = {key: patch}
    return patch


# The marks a GitOps tool leaves on what it applies (Argo CD's tracking annotation or
# label; Flux's kustomize and helm controllers' labels). NB: Helm puts
# app.kubernetes.io/instance on its releases' objects too: that label counts only on an
# object Helm did not install (no meta.helm.sh/release-name annotation).
_ARGO_TRACKING = "argocd.argoproj.io/tracking-id"
_ARGO_INSTANCE = "app.kubernetes.io/instance"
_FLUX_LABELS = ("kustomize.toolkit.fluxcd.io/name", "helm.toolkit.fluxcd.io/name")
_HELM_RELEASE = "meta.helm.sh/release-name"


def git_owner(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str | None:
    """Which GitOps tool keeps an object, in words ("Argo CD (tracking id gpu:...)"), from
    the obvious marks only; None when none is there. Minimal on purpose: a tool that
    leaves no such mark is not seen."""
    tracking = annotations.get(_ARGO_TRACKING)
    if tracking:
        return say.git_owner_argo(tracking)
    for key in _FLUX_LABELS:
        if labels.get(key):
            namespace = labels.get(key.replace("/name", "/namespace"))
            return say.git_owner_flux(key.split(".", 1)[0], labels[key], namespace)
    instance = labels.get(_ARGO_INSTANCE) or annotations.get(_ARGO_INSTANCE)
    if instance and _HELM_RELEASE not in annotations:
        return say.git_owner_argo(instance)
    return None


# ---- gating the GPU Operator's own upgrade (autoUpgrade on)


def _node_names(params: Mapping[str, Any]) -> list[str]:
    nodes = params.get("nodes")
    if not isinstance(nodes, (list, tuple)) or not all(isinstance(n, str) and n for n in nodes):
        raise StepParamsError(say.operator_hold_params())
    return list(nodes)


class OperatorHold:
    """Hold nodes back from the GPU Operator's own driver upgrade (autoUpgrade on): label
    each of `nodes` `nvidia.com/gpu-driver-upgrade.skip=true` with gpuops's hold mark (the
    run's id, `gpuops.io/driver-upgrade-held-by`), so the operator's upgrade controller
    leaves it in upgrade-required until its `operator-upgrade` step lets go. With
    `release: true` the opposite: the label and mark come off those of `nodes` a gpuops
    run holds. A skip label without the mark is a person's and is never touched; a node
    already held (by an earlier run too) stays as it is; a node that is gone is passed
    over. One audit row names every node it changes. `timeout_s` defaults to 120."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 120)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        release = bool(ctx.params.get("release"))
        targets, persons = [], []
        for name in _node_names(ctx.params):
            try:
                node = ctx.gateway.get_node(name)
            except NotFound:
                continue
            held = bool(node.annotations.get(ANNOTATION_UPGRADE_HELD_BY))
            skipped = node.labels.get(LABEL_UPGRADE_SKIP) == "true"
            if skipped and not held:
                persons.append(name)
            elif held if release else not skipped:
                targets.append(name)
        return {"release": release, "targets": targets, "left_alone": persons}

    def advance(self, ctx: StepContext) -> Outcome:
        release, targets = bool(ctx.intent["release"]), list(ctx.intent["targets"])
        if targets and not ctx.dry_run:
            action = "driver-upgrade.release" if release else "driver-upgrade.hold"
            ctx.record(key=action, action=action, target=f"{len(targets)} node(s)", detail={"nodes": targets})
        for name in targets:
            try:
                node = ctx.gateway.get_node(name)
            except NotFound:
                continue
            held = bool(node.annotations.get(ANNOTATION_UPGRADE_HELD_BY))
            if (not held) if release else node.labels.get(LABEL_UPGRADE_SKIP) == "true":
                continue  # done before a restart (or by someone else): as wanted
            ctx.act()
            ctx.gateway.label_node(name, labels={LABEL_UPGRADE_SKIP: None if release else "true"},
                                   annotations={ANNOTATION_UPGRADE_HELD_BY: None if release else ctx.run_id},
                                   dry_run=ctx.dry_run)
        note = say.operator_released if release else say.operator_held
        return Done(note(targets, dry_run=ctx.dry_run), {"left_alone": ctx.intent.get("left_alone") or []})


class OperatorUpgrade:
    """Let the GPU Operator's own upgrade controller (autoUpgrade on) upgrade this node to
    `version`, and follow it through `nvidia.com/gpu-driver-upgrade-state`.

    Once the driver DaemonSet names `version`, the step takes gpuops's hold off the node
    (skip label and mark) and, the node being cordoned by the run, sets the operator's
    `node-initial-state.unschedulable` note in the same patch, so the operator leaves the
    uncordon to gpuops (after its own validation). Done when the operator says upgrade-done
    and the node's driver pod runs `version` and is Ready. upgrade-failed fails the step
    (and halts the run) even if the operator later flips the node back. A node that began
    the step upgrade-failed (a rollback of the node it failed on) keeps its failed driver
    pod, which the operator never replaces: the step deletes it once, and then fails only
    if the new one fails too. A person's skip label holds the step until it is removed or
    time is up. `timeout_s` defaults to 1800."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 1800)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        version = ctx.params.get("version")
        if not isinstance(version, str) or not version:
            raise StepParamsError(say.operator_upgrade_params())
        node = ctx.gateway.get_node(ctx.node)
        return {"version": version, "state_before": node.labels.get(LABEL_UPGRADE_STATE),
                "driver_pod": _driver_pod_intent(_newest_driver_pod(ctx))}

    def advance(self, ctx: StepContext) -> Outcome:
        wanted, old = ctx.intent["version"], ctx.intent.get("driver_pod")
        if old is None:
            return Failed(say.no_driver_pod(ctx.node))
        if ctx.dry_run:
            return Done(say.would_follow_operator(ctx.node, wanted))
        behind = _driver_templates_not_at(ctx, _namespace_and_name(old["pod"])[0], wanted)
        if behind:
            return Waiting(say.driver_template_not_yet(wanted, behind), retry_in=2.0)
        node = ctx.gateway.get_node(ctx.node)
        if node.annotations.get(ANNOTATION_UPGRADE_HELD_BY):
            ctx.record(key="let-go", action="driver-upgrade.let-go", target=f"node {ctx.node}",
                       detail={"version": wanted, "held_by": node.annotations[ANNOTATION_UPGRADE_HELD_BY]})
            annotations: dict[str, str | None] = {ANNOTATION_UPGRADE_HELD_BY: None}
            if node.unschedulable:
                annotations[ANNOTATION_UPGRADE_INITIAL_UNSCHEDULABLE] = "true"
            ctx.act()
            ctx.gateway.label_node(ctx.node, labels={LABEL_UPGRADE_SKIP: None}, annotations=annotations,
                                   dry_run=False)
            return Waiting(say.operator_let_go(ctx.node), retry_in=5.0)
        if node.labels.get(LABEL_UPGRADE_SKIP) == "true":
            return Waiting(say.operator_skip_by_person(ctx.node), retry_in=30.0)
        newest = _newest_driver_pod(ctx)
        pod = pod_state(newest.pod) if newest is not None else None
        state = node.labels.get(LABEL_UPGRADE_STATE)
        if ctx.intent.get("state_before") == UPGRADE_FAILED:
            if newest is not None and newest.uid == old["uid"] and pod is not None and pod.version != wanted:
                ctx.act()
                with contextlib.suppress(NotFound, Conflict):
                    ctx.gateway.delete_pod(*_namespace_and_name(old["pod"]), uid=old["uid"], dry_run=False)
                return Waiting(say.operator_restarting_failed_pod(old["pod"]), retry_in=2.0)
            if pod is not None and newest is not None and newest.uid != old["uid"] and (
                    pod.crash_looping or pod.condition == "failing"):
                return Failed(say.new_driver_failing(pod.name or "?", pod.text))
        elif state == UPGRADE_FAILED:
            return Failed(say.operator_upgrade_failed(ctx.node, pod.text if pod is not None else None))
        if state is None:
            return Waiting(say.operator_not_following(ctx.node), retry_in=30.0)
        if state == UPGRADE_DONE and pod is not None and pod.version == wanted and pod.condition == "healthy":
            return Done(say.operator_upgraded(pod.name or "?", wanted))
        return Waiting(say.operator_upgrading(state), retry_in=5.0)


class GpuCheck:
    """Run the upgrade's canary pod on the node and let its exit code decide: a pod in
    `namespace` bound to the node, asking for one `resource` and running `command` in
    `image` (`check_pod` builds it). Exit 0: the pod is deleted and the step is done. Any
    other end (non-zero exit, the kubelet refusing it, its `timeout_s` deadline) fails the
    step with the pod's own words, and the pod is kept for its logs.

    The pod's name is fixed by run and node: after a restart the step finds its pod (or
    the record that it passed) instead of starting a second one. A namespace that does not
    exist fails the step. The step allows `timeout_s` plus a minute; the pod's own
    deadline normally ends it first."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 300) + dt.timedelta(seconds=check_pod.STEP_GRACE_SECONDS)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        spec = check_pod.CheckSpec.from_params(ctx.params)
        if spec is None:
            raise StepParamsError(say.gpu_check_params())
        return {"pod": f"{spec.namespace}/{check_pod.pod_name(ctx.run_id, ctx.node)}"}

    def advance(self, ctx: StepContext) -> Outcome:
        spec = check_pod.CheckSpec.from_params(ctx.params)
        assert spec is not None  # prepare refused anything else
        namespace, name = _namespace_and_name(ctx.intent["pod"])
        shown = check_pod.shown_command(spec.command)
        try:
            found = ctx.gateway.get_pod(namespace, name)
        except NotFound:
            found = None
        if ctx.recorded("gpu-check.passed"):
            # It passed before a restart: the pod goes (if the restart came before its
            # delete), and is never run again.
            if found is not None and not found.pod.deleting:
                ctx.act()
                with contextlib.suppress(NotFound, Conflict):
                    ctx.gateway.delete_pod(namespace, name, uid=found.uid, dry_run=False)
            return Done(say.gpu_check_passed(ctx.intent["pod"], shown))
        if found is None:
            manifest = check_pod.manifest(spec, name=name, node=ctx.node, run_id=ctx.run_id)
            if not ctx.dry_run:
                ctx.record(key="gpu-check.start", action="gpu-check.start", target=f"pod {ctx.intent['pod']}",
                           detail={"node": ctx.node, "image": spec.image, "command": list(spec.command),
                                   "resource": spec.resource})
            ctx.act()
            try:
                ctx.gateway.create_pod(namespace, manifest, dry_run=ctx.dry_run)
            except Conflict:
                pass  # created before a restart; read it next time
            except NotFound:
                return Failed(say.gpu_check_no_namespace(namespace))
            if ctx.dry_run:
                return Done(say.would_run_gpu_check(ctx.intent["pod"], shown))
            return Waiting(say.gpu_check_started(ctx.intent["pod"], shown), retry_in=2.0)
        pod = found.pod
        if pod.deleting:
            # Deleted by someone before it answered: start it again once it is gone.
            return Waiting(say.gpu_check_deleted_meanwhile(ctx.intent["pod"]), retry_in=2.0)
        result = check_pod.result_of(pod)
        if result is None:
            return Waiting(say.gpu_check_running(ctx.intent["pod"], shown, check_pod.waiting_for(pod)),
                           retry_in=2.0)
        if not result.passed:
            return Failed(say.gpu_check_failed(ctx.node, ctx.intent["pod"], shown, exit_code=result.exit_code,
                                               reason=result.reason, message=result.message),
                          {"exit_code": result.exit_code, "reason": result.reason, "message": result.message})
        ctx.record(key="gpu-check.passed", action="gpu-check.passed", target=f"pod {ctx.intent['pod']}",
                   detail={"node": ctx.node, "exit_code": result.exit_code})
        ctx.act()
        with contextlib.suppress(NotFound, Conflict):
            ctx.gateway.delete_pod(namespace, name, uid=found.uid, dry_run=False)
        return Done(say.gpu_check_passed(ctx.intent["pod"], shown))


# ---- moving a node from a host driver to the operator (and back)


class Snapshot:
    """Record the node's labels, annotations and taints (the step's intent), before the
    run changes anything: what a rollback restores in one step. No side effect."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 60)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        node = ctx.gateway.get_node(ctx.node)
        return {"labels": dict(node.labels), "annotations": dict(node.annotations),
                "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints],
                "unschedulable": node.unschedulable}

    def advance(self, ctx: StepContext) -> Outcome:
        return Done(say.snapshot_taken(ctx.node, len(ctx.intent.get("labels") or {}),
                                       len(ctx.intent.get("taints") or [])))


class HostDriverByHand:
    """Wait for a person to remove (`host-driver-removed`) or install
    (`host-driver-installed`) the node's host driver: gpuops cannot and must not log into
    nodes. `RunService.confirm_host_driver` (the button on the request's card, `/gpu
    migrate confirm <run>`) writes who and when into the params, audited. Until then the
    step waits, and the request's thread is told once what to do. `timeout_s` (default 8
    hours) or the window's end, whichever is first, fails the step and halts the run with
    the node cordoned.

    The node's evidence: with no operator driver pod, a working driver shows as a Ready
    validator; a removed one as a validator waiting for a driver and no GPU advertised.
    The step notes at its start whether the driver worked; a change from that is the
    evidence. With `evidence: true` (the pool's `host_driver_evidence`) the change
    completes the step, audited as the evidence; otherwise it is shown in the waiting text
    and a person still confirms."""

    def __init__(self, *, install: bool) -> None:
        self.install = install

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        limit = _seconds(ctx.params, 8 * 3600)
        if ctx.window_end is not None:
            limit = min(limit, max(dt.timedelta(0), ctx.window_end - ctx.now))
        return limit

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        inv = ctx.node_inventory()
        return {"driver_worked": inv is not None and _driver_works(inv)}

    def advance(self, ctx: StepContext) -> Outcome:
        confirmed = ctx.params.get("confirmed_by_name") or ctx.params.get("confirmed_by")
        if confirmed:
            return Done(say.host_driver_confirmed(ctx.node, str(confirmed), install=self.install),
                        {"confirmed_by": ctx.params.get("confirmed_by")})
        if ctx.dry_run:
            return Done(say.would_wait_for_host_driver(ctx.node, install=self.install))
        waiting = say.waiting_for_host_driver(ctx.node, install=self.install)
        evidence = self._evidence(ctx)
        if evidence is not None and ctx.params.get("evidence") is True:
            action = "run.host-driver-installed" if self.install else "run.host-driver-removed"
            ctx.record(key="evidence", action=action, target=f"node {ctx.node}",
                       detail={"by": "evidence", "evidence": evidence})
            return Done(say.host_driver_detected(evidence, install=self.install), {"evidence": evidence})
        if evidence is not None:
            waiting = say.host_driver_evidence_seen(evidence, install=self.install)
        elif ctx.intent.get("driver_worked") is self.install:
            waiting = say.host_driver_no_before(ctx.node, install=self.install)
        notice = Notice(f"host-driver/{ctx.node}", say.host_driver_by_hand(
            ctx.node, run=ctx.run_id, request=ctx.request_id, install=self.install))
        # Looks again now and then: the confirmation may come from another process.
        return Waiting(waiting, retry_in=5.0, notice=notice)

    def _evidence(self, ctx: StepContext) -> str | None:
        """The change the node shows since the step began, in words; None if none."""
        inv = ctx.node_inventory()
        if inv is None or ctx.intent.get("driver_worked") is self.install:
            return None
        changed = _driver_works(inv) if self.install else _driver_gone(inv)
        if not changed:
            return None
        return say.host_driver_evidence(ctx.node, install=self.install, validator=inv.validator_pod.text,
                                        advertised=inv.advertised_gpus)


def _driver_works(inv: NodeInventory) -> bool:
    """A driver works on the node without the operator's: its validator is Ready and every
    GPU is advertised, with no operator driver pod."""
    return (not inv.driver_pod.present and inv.validator_pod.condition == "healthy"
            and inv.expected_advertised is not None and inv.advertised_gpus == inv.expected_advertised)


def _driver_gone(inv: NodeInventory) -> bool:
    """No driver works on the node: no operator driver pod, the validator waits for a
    driver (not Ready, not failing), and no GPU is advertised."""
    validator = inv.validator_pod
    return (not inv.driver_pod.present and validator.present and validator.condition in ("starting", "pending")
            and inv.advertised_gpus == 0)


class NodeLabels:
    """Set `labels` on the node (a value of None removes the label), by one merge patch,
    unless they are already so. The values found are kept in the intent."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 120)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        wanted = ctx.params.get("labels")
        if not isinstance(wanted, Mapping) or not wanted:
            raise StepParamsError(say.node_labels_params())
        node = ctx.gateway.get_node(ctx.node)
        return {"labels": dict(wanted), "prior": {k: node.labels.get(k) for k in wanted}}

    def advance(self, ctx: StepContext) -> Outcome:
        wanted = {str(k): (None if v is None else str(v)) for k, v in ctx.intent["labels"].items()}
        node = ctx.gateway.get_node(ctx.node)
        if all(node.labels.get(k) == v for k, v in wanted.items()):
            return Done(say.labels_set(ctx.node, wanted, dry_run=False))
        ctx.act()
        ctx.gateway.label_node(ctx.node, labels=wanted, dry_run=ctx.dry_run)
        return Done(say.labels_set(ctx.node, wanted, dry_run=ctx.dry_run))


class Restore:
    """Put back what a snapshot recorded (params `labels`, `taints`: the snapshot of the
    run rolled back): every label the snapshot had among `keys` (the ones that run set,
    and the operator's deploy labels) to its old value, removed where it had none, and
    the taints exactly as they were; one patch, audited. The node stays cordoned: what is
    left (reinstalling a host driver) is a person's."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return _seconds(ctx.params, 120)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        labels, keys, taints = ctx.params.get("labels"), ctx.params.get("keys"), ctx.params.get("taints")
        if not isinstance(labels, Mapping) or not isinstance(keys, (list, tuple)) or not isinstance(taints, list):
            raise StepParamsError(say.restore_params())
        node = ctx.gateway.get_node(ctx.node)
        restore = {str(k): (str(labels[k]) if k in labels else None) for k in keys}
        return {"labels": restore, "taints": taints,
                "found": {k: node.labels.get(k) for k in restore}}

    def advance(self, ctx: StepContext) -> Outcome:
        wanted: dict[str, str | None] = dict(ctx.intent["labels"])
        taints = tuple(Taint(key=str(t["key"]), value=str(t.get("value") or ""), effect=str(t["effect"]))
                       for t in ctx.intent["taints"])
        node = ctx.gateway.get_node(ctx.node)
        if all(node.labels.get(k) == v for k, v in wanted.items()) and set(node.taints) == set(taints):
            return Done(say.restored(ctx.node, wanted, len(taints)))
        if not ctx.dry_run:
            ctx.record(key="restore", action="node.restore", target=f"node {ctx.node}",
                       detail={"labels": wanted, "taints": list(ctx.intent["taints"]),
                               "found": ctx.intent.get("found")})
        ctx.act()
        try:
            ctx.gateway.restore_node(ctx.node, labels=wanted, taints=taints, resource_version=node.resource_version,
                                     dry_run=ctx.dry_run)
        except Conflict:
            return Waiting(say.restore_conflict(ctx.node), retry_in=1.0)
        return Done(say.restored(ctx.node, wanted, len(taints)))


class Hold:
    """Keep the node as it is (drained, cordoned) until `until` (a UTC time), for
    `seconds`, or else until the request's window ends; no limit of its own. A
    `released_at` param (written by `RunService.release_hold`, i.e. `drain done`) ends
    it at that time, whichever comes first. An `extended_until` param (written when a
    running drain's extension is applied, `workflows.requests.extension`) moves a timed
    end later, never earlier. `WINDOW_ENDING_NOTICE` before the end, the request's thread
    is told (once per run) so someone can ask for more time; an extended end is told
    again, once per new end (at once when less than the lead is left)."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return None

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        until: dt.datetime | None
        open_ended = False
        if ctx.params.get("released_at"):
            # NB: `drain done` before the hold began: it ends as soon as it starts.
            until = codec.optional_time_from_text(str(ctx.params["released_at"]))
        elif ctx.params.get("until"):
            until = dt.datetime.fromisoformat(str(ctx.params["until"]).replace("Z", "+00:00"))
        elif "until" in ctx.params:
            # An open-ended drain (`until: None`): held until `drain done`, or for at
            # most the pool's `open_drain_max` when it sets one.
            open_ended = True
            at_most = ctx.params.get("at_most_s")
            until = ctx.now + dt.timedelta(seconds=float(at_most)) if at_most else None
        elif "seconds" in ctx.params:
            until = ctx.now + dt.timedelta(seconds=float(ctx.params["seconds"]))
        else:
            until = ctx.window_end
        # Warn before the end only when the hold outlasts the warning's lead.
        warn_at = until - WINDOW_ENDING_NOTICE if until is not None else None
        return {"until": codec.optional_time_to_text(until), "open_ended": open_ended,
                "warn_at": codec.optional_time_to_text(warn_at if warn_at and warn_at > ctx.now else None)}

    def advance(self, ctx: StepContext) -> Outcome:
        until = codec.optional_time_from_text(ctx.intent.get("until"))
        warn_at = codec.optional_time_from_text(ctx.intent.get("warn_at"))
        again_for = None
        extended = codec.optional_time_from_text(ctx.params.get("extended_until"))
        if extended is not None and until is not None and extended > until and not ctx.intent.get("open_ended"):
            # A later end, applied while it held: told again before it, once per new end.
            until, warn_at = extended, max(extended - WINDOW_ENDING_NOTICE, ctx.now)
            again_for = str(ctx.params["extended_until"])
        released = codec.optional_time_from_text(ctx.params.get("released_at"))
        if released is not None:
            until = released if until is None else min(until, released)
        if until is None and ctx.intent.get("open_ended") and not ctx.dry_run:
            # Only `drain done` (a control the engine looks at as it lands) ends it.
            return Waiting(say.holding_until_released())
        if until is None or ctx.now >= until or ctx.dry_run:
            return Done(say.held_until(until, dry_run=ctx.dry_run, open_ended=bool(ctx.intent.get("open_ended"))))
        if warn_at is None or released is not None:
            return Waiting(say.holding_until(until), retry_in=(until - ctx.now).total_seconds())
        if ctx.now >= warn_at:
            # Every node of the run is held to the same window end: one notice for all.
            text = (say.open_drain_limit_ending(until) if ctx.intent.get("open_ended")
                    else say.window_ending(until, request_id=ctx.request_id))
            notice = Notice("window-ending", text, per_run=True, again_for=again_for)
            return Waiting(say.holding_until(until), retry_in=(until - ctx.now).total_seconds(), notice=notice)
        return Waiting(say.holding_until(until), retry_in=(warn_at - ctx.now).total_seconds())


# How long before a hold ends the thread hears that the window is ending.
WINDOW_ENDING_NOTICE = dt.timedelta(minutes=15)


LOGIC: dict[str, StepLogic] = {
    "cordon": Cordon(),
    "evict": Evict(),
    "drain": Evict(default_scope="all"),
    "wait-for": WaitFor(DEFAULT_WAIT_FOR),
    "validate": WaitFor(DEFAULT_VALIDATE),
    "wait-for-jobs": WaitForJobs(),
    "driver": Driver(),
    "driver-version": DriverVersion(),
    "operator-hold": OperatorHold(),
    "operator-upgrade": OperatorUpgrade(),
    "gpu-check": GpuCheck(),
    "snapshot": Snapshot(),
    "host-driver-removed": HostDriverByHand(install=False),
    "host-driver-installed": HostDriverByHand(install=True),
    "node-labels": NodeLabels(),
    "restore": Restore(),
    "mig": Mig(),
    "hold": Hold(),
    "uncordon": Uncordon(),
}


def logic_for(kind: str) -> StepLogic:
    return LOGIC[kind]


__all__ = [
    "CONDITIONS", "CordonMark", "Done", "Failed", "LOGIC", "LeaseLost", "LeftOut", "Notice", "Outcome", "PodDecision",
    "StepContext", "StepLogic", "StepParamsError", "Waiting", "decide", "gpu_use", "logic_for",
]
