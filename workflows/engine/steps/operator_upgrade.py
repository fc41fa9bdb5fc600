"""The GPU Operator's own driver upgrade (autoUpgrade on), gated by gpuops: holding
nodes back from it (`operator-hold`) and letting one node go and following it through
(`operator-upgrade`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass
from typing import Any

from storage.step_params import StepParams
from workflows.engine import messages as say
from workflows.engine.steps.contract import (
    Done,
    Failed,
    Outcome,
    StepContext,
    StepParamsError,
    Waiting,
    pod_ref,
    params_of,
)
from workflows.engine.steps.driver import driver_pod_intent, driver_templates_not_at, newest_driver_pod
from workflows.fleet.node_changes import UPGRADE_DONE, UPGRADE_FAILED
from workflows.fleet.pods import pod_state
from workflows.kube.errors import Conflict, NotFound
from workflows.kube.labels import (
    ANNOTATION_UPGRADE_HELD_BY,
    ANNOTATION_UPGRADE_INITIAL_UNSCHEDULABLE,
    LABEL_UPGRADE_SKIP,
    LABEL_UPGRADE_STATE,
)


@dataclass(frozen=True, kw_only=True)
class OperatorHoldParams(StepParams):
    """The `nodes` to hold back (or, with `release`, to let go)."""

    nodes: tuple[str, ...] | None = None
    release: bool | None = None


@dataclass(frozen=True, kw_only=True)
class OperatorUpgradeParams(StepParams):
    """The driver `version` the operator's upgrade brings the node to."""

    version: str | None = None


def _node_names(params: OperatorHoldParams) -> list[str]:
    nodes = params.nodes
    if nodes is None or not all(nodes):
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

    params = OperatorHoldParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, OperatorHoldParams).timeout(120, kind=ctx.kind)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        params = params_of(ctx, OperatorHoldParams)
        release = bool(params.release)
        targets, persons = [], []
        for name in _node_names(params):
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

    params = OperatorUpgradeParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, OperatorUpgradeParams).timeout(1800, kind=ctx.kind)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        version = params_of(ctx, OperatorUpgradeParams).version
        if not version:
            raise StepParamsError(say.operator_upgrade_params())
        node = ctx.gateway.get_node(ctx.node)
        return {"version": version, "state_before": node.labels.get(LABEL_UPGRADE_STATE),
                "driver_pod": driver_pod_intent(newest_driver_pod(ctx))}

    def advance(self, ctx: StepContext) -> Outcome:
        wanted, old = ctx.intent["version"], ctx.intent.get("driver_pod")
        if old is None:
            return Failed(say.no_driver_pod(ctx.node), code="no-driver-pod")
        if ctx.dry_run:
            return Done(say.would_follow_operator(ctx.node, wanted))
        behind = driver_templates_not_at(ctx, pod_ref(old["pod"])[0], wanted)
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
        newest = newest_driver_pod(ctx)
        pod = pod_state(newest.pod) if newest is not None else None
        state = node.labels.get(LABEL_UPGRADE_STATE)
        if ctx.intent.get("state_before") == UPGRADE_FAILED:
            if newest is not None and newest.uid == old["uid"] and pod is not None and pod.version != wanted:
                ctx.act()
                with contextlib.suppress(NotFound, Conflict):
                    ctx.gateway.delete_pod(*pod_ref(old["pod"]), uid=old["uid"], dry_run=False)
                return Waiting(say.operator_restarting_failed_pod(old["pod"]), retry_in=2.0)
            if pod is not None and newest is not None and newest.uid != old["uid"] and (
                    pod.crash_looping or pod.condition == "failing"):
                return Failed(say.new_driver_failing(pod.name or "?", pod.text), code="new-driver-failing")
        elif state == UPGRADE_FAILED:
            return Failed(say.operator_upgrade_failed(ctx.node, pod.text if pod is not None else None),
                          code="operator-upgrade-failed")
        if state is None:
            return Waiting(say.operator_not_following(ctx.node), retry_in=30.0)
        if state == UPGRADE_DONE and pod is not None and pod.version == wanted and pod.condition == "healthy":
            return Done(say.operator_upgraded(pod.name or "?", wanted))
        return Waiting(say.operator_upgrading(state), retry_in=5.0)


