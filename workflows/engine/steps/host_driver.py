"""Moving a node from a host driver to the operator (and back): recording the node
first (`snapshot`), waiting for a person at the host driver (`host-driver-removed`,
`host-driver-installed`), setting labels (`node-labels`) and putting the snapshot back
(`restore`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storage.step_params import StepParams
from workflows.engine import messages as say
from workflows.engine.steps.contract import (
    Done,
    Outcome,
    StepContext,
    StepNotice,
    StepParamsError,
    Waiting,
    params_of,
)
from workflows.fleet.assessment import NodeInventory
from workflows.kube.errors import Conflict
from workflows.kube.objects import Taint


@dataclass(frozen=True, kw_only=True)
class HostDriverParams(StepParams):
    """Whether the node's own evidence completes the step (`evidence`, the pool's
    `host_driver_evidence`), and who confirmed the change by hand, and when (the
    `HandConfirmation` control `RunService.confirm_host_driver` writes while the step waits)."""

    evidence: bool | None = None
    confirmed_by: str | None = None
    confirmed_by_name: str | None = None
    confirmed_at: dt.datetime | None = None


@dataclass(frozen=True, kw_only=True)
class NodeLabelsParams(StepParams):
    """The `labels` to set on the node (None removes one)."""

    labels: Mapping[str, str | None] | None = None


@dataclass(frozen=True, kw_only=True)
class RestoreParams(StepParams):
    """What a snapshot recorded (`labels`, `taints`) and which labels to put back (`keys`)."""

    labels: Mapping[str, str] | None = None
    keys: tuple[str, ...] | None = None
    taints: tuple[Mapping[str, Any], ...] | None = None


class Snapshot:
    """Record the node's labels, annotations and taints (the step's intent), before the
    run changes anything: what a rollback restores in one step. No side effect."""

    params = StepParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, StepParams).timeout(60, kind=ctx.kind)

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

    params = HostDriverParams

    def __init__(self, *, install: bool) -> None:
        self.install = install

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        limit = params_of(ctx, HostDriverParams).timeout(8 * 3600, kind=ctx.kind)
        if ctx.window_end is not None:
            limit = min(limit, max(dt.timedelta(0), ctx.window_end - ctx.now))
        return limit

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        inv = ctx.node_inventory()
        return {"driver_worked": inv is not None and _driver_works(inv)}

    def advance(self, ctx: StepContext) -> Outcome:
        params = params_of(ctx, HostDriverParams)
        confirmed = params.confirmed_by_name or params.confirmed_by
        if confirmed:
            return Done(say.host_driver_confirmed(ctx.node, confirmed, install=self.install),
                        {"confirmed_by": params.confirmed_by})
        if ctx.dry_run:
            return Done(say.would_wait_for_host_driver(ctx.node, install=self.install))
        waiting = say.waiting_for_host_driver(ctx.node, install=self.install)
        evidence = self._evidence(ctx)
        if evidence is not None and params.evidence is True:
            action = "run.host-driver-installed" if self.install else "run.host-driver-removed"
            ctx.record(key="evidence", action=action, target=f"node {ctx.node}",
                       detail={"by": "evidence", "evidence": evidence})
            return Done(say.host_driver_detected(evidence, install=self.install), {"evidence": evidence})
        if evidence is not None:
            waiting = say.host_driver_evidence_seen(evidence, install=self.install)
        elif ctx.intent.get("driver_worked") is self.install:
            waiting = say.host_driver_no_before(ctx.node, install=self.install)
        notice = StepNotice(f"host-driver/{ctx.node}", say.host_driver_by_hand(
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


class SetNodeLabels:
    """Set `labels` on the node (a value of None removes the label), by one merge patch,
    unless they are already so. The values found are kept in the intent."""

    params = NodeLabelsParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, NodeLabelsParams).timeout(120, kind=ctx.kind)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        wanted = params_of(ctx, NodeLabelsParams).labels
        if not wanted:
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

    params = RestoreParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, RestoreParams).timeout(120, kind=ctx.kind)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        params = params_of(ctx, RestoreParams)
        labels, keys, taints = params.labels, params.keys, params.taints
        if labels is None or keys is None or taints is None:
            raise StepParamsError(say.restore_params())
        node = ctx.gateway.get_node(ctx.node)
        restore = {k: (labels[k] if k in labels else None) for k in keys}
        return {"labels": restore, "taints": [dict(t) for t in taints],
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
