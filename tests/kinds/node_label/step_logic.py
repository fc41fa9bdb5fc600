"""`set-label`: set one label on the node (params `key`, `value`; a value of None removes
it), unless it is so already; the value found is kept in the intent (what a rollback puts
back), and the patch is on the audit log once (`node.label`).

A node annotated `tests.gpuops.dev/refuse-label: "true"` refuses the label: the step
fails, the run halts (how the tests halt a run to roll it back)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storage.step_params import StepParams
from workflows.engine.steps.contract import (Done, Failed, Outcome, StepContext, StepLogic, StepParamsError,
                                             params_of)

REFUSE = "tests.gpuops.dev/refuse-label"


@dataclass(frozen=True, kw_only=True)
class SetLabelParams(StepParams):
    """The label to set (`value` None: remove it); `takes_over`: the run a rollback undoes."""

    key: str = ""
    value: str | None = None
    takes_over: str | None = None


class SetLabel:
    params = SetLabelParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, SetLabelParams).timeout(60, kind="set-label")

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        params = params_of(ctx, SetLabelParams)
        if not params.key:
            raise StepParamsError("set-label needs a label `key` and a `value` (text, or null to remove it)")
        node = ctx.gateway.get_node(ctx.node)
        return {"key": params.key, "value": params.value, "prior": node.labels.get(params.key)}

    def advance(self, ctx: StepContext) -> Outcome:
        key, value = str(ctx.intent["key"]), ctx.intent["value"]
        node = ctx.gateway.get_node(ctx.node)
        if node.labels.get(key) == value:
            return Done(f"{ctx.node}: label {key} is {value}")
        if node.annotations.get(REFUSE) == "true":
            return Failed(f"{ctx.node} refuses label {key}")
        if not ctx.dry_run:
            ctx.record(key="label", action="node.label", target=f"node {ctx.node}",
                       detail={"key": key, "value": value, "prior": ctx.intent.get("prior")})
        ctx.act()
        ctx.gateway.label_node(ctx.node, labels={key: value}, dry_run=ctx.dry_run)
        return Done(f"{ctx.node}: label {key} set to {value}")


STEP_LOGIC: Mapping[str, StepLogic] = {"set-label": SetLabel()}
