"""Cordoning a node for a run and giving it back: the mark a cordon leaves
(`gpuops.io/cordoned-by`, with the node's prior state) and the two steps that read it.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from storage import codec
from storage.step_params import CordonParams, UncordonParams
from workflows.engine import messages as say
from workflows.engine.steps.contract import Done, Failed, Outcome, StepContext, Waiting, params_of
from workflows.kube.errors import Conflict
from workflows.kube.labels import ANNOTATION_CORDONED_BY
from workflows.kube.objects import NodeObject


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

    params = CordonParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, CordonParams).timeout(120, kind=ctx.kind)

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
                return Failed(say.node_in_other_run(ctx.node, mark.run, mark.by), code="node-in-another-run")
            if mark.run != params_of(ctx, CordonParams).takes_over:
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
        if mark is not None and node.unschedulable and mark.run == params_of(ctx, CordonParams).takes_over:
            return Done(say.cordon_taken_over(mark.run, prior_unschedulable=prior), {"prior_unschedulable": prior})
        note = say.cordoned(prior_unschedulable=node.unschedulable, dry_run=ctx.dry_run)
        return Done(note, {"prior_unschedulable": node.unschedulable})


class Uncordon:
    """Make the node schedulable again, only if this run cordoned it and it was
    schedulable before; always remove this run's mark. The engine starts this step only
    when every earlier step of the node is done (so after validation), or when the node
    was left out of the run (then it is given back as it was)."""

    params = UncordonParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, UncordonParams).timeout(120, kind=ctx.kind)

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
        # Nothing was cordoned for real; answer from what the cordon step found. Another
        # run's mark keeps the node cordoned only on a cordoned node (then prior_unschedulable
        # says so): the real run cordons a schedulable node that carries a finished run's
        # stale mark, and gives it back.
        cordon = ctx.step_intent("cordon") or {}
        if cordon.get("prior_unschedulable", node.unschedulable):
            return Done(say.stays_cordoned(), {"unschedulable": True})
        ctx.act()
        ctx.gateway.uncordon_node(ctx.node, annotations={ANNOTATION_CORDONED_BY: None},
                                  resource_version=None, dry_run=True)
        return Done(say.would_uncordon(), {"unschedulable": False})

