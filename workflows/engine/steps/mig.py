"""A MIG layout on the node, asked of the MIG manager by label and waited for (`mig`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storage.step_params import GpuGateParams
from workflows.engine import messages as say
from workflows.engine.steps.contract import Done, Failed, Outcome, StepContext, StepParamsError, Waiting, params_of
from workflows.engine.steps.eviction import gpu_pods_left
from workflows.kube.labels import LABEL_DEPLOY_PREFIX, LABEL_MIG_CONFIG, LABEL_MIG_CONFIG_STATE, PAUSED_FOR_MIG_CHANGE
from workflows.kube.objects import is_gpu_resource


@dataclass(frozen=True, kw_only=True)
class MigParams(GpuGateParams):
    """The MIG layout to ask for (`config`) and the GPU resources the node should then
    advertise (`expect`, {resource: count})."""

    config: str | None = None
    expect: Mapping[str, int] | None = None


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

    params = MigParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, MigParams).timeout(1800, kind=ctx.kind)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        config = params_of(ctx, MigParams).config
        if not config:
            raise StepParamsError("a mig step needs the MIG layout in params.config (e.g. all-1g.10gb)")
        node = ctx.gateway.get_node(ctx.node)
        return {"config": config, "prior_config": node.labels.get(LABEL_MIG_CONFIG),
                "prior_state": node.labels.get(LABEL_MIG_CONFIG_STATE)}

    def advance(self, ctx: StepContext) -> Outcome:
        config = ctx.intent["config"]
        node = ctx.gateway.get_node(ctx.node)
        state = node.labels.get(LABEL_MIG_CONFIG_STATE)
        if node.labels.get(LABEL_MIG_CONFIG) != config:
            in_the_way = gpu_pods_left(ctx)
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
            # Nothing to set: say what the MIG manager reports, not that it succeeded.
            return Done(say.would_leave_mig(config, state, _counted(advertised)))
        if state == "success":
            expect = {str(k): int(v) for k, v in (params_of(ctx, MigParams).expect or {}).items() if v}
            if expect and advertised != expect:
                return Waiting(say.mig_not_advertised(config, _counted(advertised), _counted(expect)), retry_in=5.0)
            return Done(say.mig_applied(config))
        if state == "failed":
            return Failed(say.mig_failed(ctx.node, config), code="mig-failed")
        paused = sorted(key.removeprefix(LABEL_DEPLOY_PREFIX) for key, value in node.labels.items()
                        if key.startswith(LABEL_DEPLOY_PREFIX) and value == PAUSED_FOR_MIG_CHANGE)
        return Waiting(say.mig_waiting(config, state, paused, _counted(advertised)), retry_in=5.0)


def _counted(resources: Mapping[str, int]) -> str:
    return ", ".join(f"{n}x {r}" for r, n in sorted(resources.items())) or "no GPUs"

