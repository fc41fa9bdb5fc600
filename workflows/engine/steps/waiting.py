"""Steps that wait and change nothing: for conditions on the node read from the watch
cache (`wait-for`, `validate` and the checks they name), for jobs to finish
(`wait-for-jobs`), and for the hold's end (`hold`: a drain's window, `drain done`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from storage import codec
from storage.step_params import HoldParams, WaitForJobsParams, WaitForParams
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

Check = Callable[[NodeInventory], tuple[bool, str]]


def _ready(inv: NodeInventory) -> tuple[bool, str]:
    return inv.ready is True, say.node_ready_text(inv.ready)


def _advertised(inv: NodeInventory) -> tuple[bool, str]:
    expected = inv.expected_advertised
    ok = expected is not None and inv.advertised_gpus == expected and inv.allocatable_gpus == expected
    return ok, say.advertised_text(inv.advertised_gpus, inv.allocatable_gpus, expected)


@dataclass(frozen=True)
class _PodCheck:
    """An operand pod on the node is healthy. A value called when a step looks (not a
    closure made at import to fill CONDITIONS), so that changing what it checks changes
    what the steps see: mutation testing tells the two apart (tests/mutation)."""

    attribute: str
    label: str

    def __call__(self, inv: NodeInventory) -> tuple[bool, str]:
        state = getattr(inv, self.attribute)
        return state.condition == "healthy", f"{self.label} {state.text}"


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
    "device-plugin-ready": _PodCheck("device_plugin_pod", "device plugin"),
    "validator-ready": _PodCheck("validator_pod", "validator"),
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

    params = WaitForParams

    def __init__(self, defaults: Sequence[str]) -> None:
        self._defaults = tuple(defaults)

    def conditions(self, ctx: StepContext) -> tuple[str, ...]:
        params = params_of(ctx, WaitForParams)
        wanted = params.conditions if params.conditions is not None else params.condition
        names = self._defaults if wanted is None else (wanted,) if isinstance(wanted, str) else wanted
        unknown = [n for n in names if n not in CONDITIONS]
        if unknown or not names:
            raise StepParamsError(say.unknown_conditions(unknown, sorted(CONDITIONS)))
        return names

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, WaitForParams).timeout(600, kind=ctx.kind)

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
        return Waiting(say.waiting_on_conditions(unmet))


class WaitForJobs:
    """Wait until no pod matching `selector` (a label selector) still runs on the node;
    at `timeout_s` (default 3600) fail, or carry on if `on_timeout` is `continue`."""

    params = WaitForJobsParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        return params_of(ctx, WaitForJobsParams).timeout(3600, kind=ctx.kind)

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        params = params_of(ctx, WaitForJobsParams)
        if not params.selector:
            raise StepParamsError("wait-for-jobs needs a label selector in params.selector")
        return {"selector": params.selector, "on_timeout": params.on_timeout or "fail"}

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


class Hold:
    """Keep the node as it is (drained, cordoned) until `until` (a UTC time), for
    `seconds`, or else until the request's window ends; no limit of its own. A
    `released_at` param (written by `RunService.release_hold`, i.e. `drain done`) ends
    it at that time, whichever comes first. An `extended_until` param (written when a
    running drain's extension is applied, `workflows.requests.extension`) moves a timed
    end later, never earlier. `WINDOW_ENDING_NOTICE` before the end, the request's thread
    is told (once per run) so someone can ask for more time; an extended end is told
    again, once per new end (at once when less than the lead is left)."""

    params = HoldParams

    def timeout(self, ctx: StepContext) -> dt.timedelta | None:
        params_of(ctx, HoldParams)  # refuse unusable params before the hold starts
        return None

    def prepare(self, ctx: StepContext) -> dict[str, Any]:
        params = params_of(ctx, HoldParams)
        until: dt.datetime | None
        open_ended = False
        if params.released_at is not None:
            # NB: `drain done` before the hold began: it ends as soon as it starts.
            until = params.released_at
        elif params.until is not None:
            until = params.until
        elif params.open_ended:
            # An open-ended drain (`until: None`): held until `drain done`, or for at
            # most the pool's `open_drain_max` when it sets one.
            open_ended = True
            until = ctx.now + dt.timedelta(seconds=params.at_most_s) if params.at_most_s else None
        elif params.seconds is not None:
            until = ctx.now + dt.timedelta(seconds=params.seconds)
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
        params = params_of(ctx, HoldParams)
        extended = params.extended_until
        if extended is not None and until is not None and extended > until and not ctx.intent.get("open_ended"):
            # A later end, applied while it held: told again before it, once per new end.
            until, warn_at = extended, max(extended - WINDOW_ENDING_NOTICE, ctx.now)
            again_for = codec.time_to_text(extended)
        released = params.released_at
        if released is not None:
            until = released if until is None else min(until, released)
        if until is None and ctx.intent.get("open_ended") and not ctx.dry_run:
            # Only `drain done` (a control the engine looks at as it lands) ends it.
            return Waiting(say.holding_until_released())
        if until is None or ctx.now >= until or ctx.dry_run:
            return Done(say.held_until(until, dry_run=ctx.dry_run, zone=ctx.zone, open_ended=bool(ctx.intent.get("open_ended"))))
        if warn_at is None or released is not None:
            return Waiting(say.holding_until(until, zone=ctx.zone), retry_in=(until - ctx.now).total_seconds())
        if ctx.now >= warn_at:
            # Every node of the run is held to the same window end: one notice for all.
            text = (say.open_drain_limit_ending(until, zone=ctx.zone) if ctx.intent.get("open_ended")
                    else say.window_ending(until, request_id=ctx.request_id, zone=ctx.zone))
            notice = StepNotice("window-ending", text, per_run=True, again_for=again_for)
            return Waiting(say.holding_until(until, zone=ctx.zone), retry_in=(until - ctx.now).total_seconds(), notice=notice)
        return Waiting(say.holding_until(until, zone=ctx.zone), retry_in=(warn_at - ctx.now).total_seconds())


# How long before a hold ends the thread hears that the window is ending.
WINDOW_ENDING_NOTICE = dt.timedelta(minutes=15)

