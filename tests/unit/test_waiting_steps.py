"""The steps that decide when a node may be given back, one call at a time, from the node
as the watch cache sees it: `wait-for` and `validate` are done only when every condition
they name holds (a node missing from the fleet view holds none), and while they wait
their note says in words what is not yet so (the node's readiness, the MIG layout and
its state, the GPU Operator's driver pod and who owns the driver). One condition may be
named alone. A `hold` keeps the node until its end, says that end in the display zone
while it waits and in the notices before it, warns only when it lasts longer than the
warning's lead, is not moved by an extension that does not move its end (nor is an
open-ended drain's limit by any), ends at the earlier of its end and `drain done`, and
in a dry run says what it would have held for.

The context is tests/unit/test_gpu_check_step.py's (the step context with the node's
inventory); the sentences are the ones workflows.engine.messages writes.
tests/unit/test_engine_steps.py pins the defaults and the hold's plain course."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

import pytest

from tests.unit.test_gpu_check_step import CheckCtx
from tests.unit.test_step_outcomes import NOW
from workflows.engine.steps.contract import Done, StepParamsError, Waiting
from workflows.engine.steps.waiting import DEFAULT_VALIDATE, DEFAULT_WAIT_FOR, Hold, WaitFor

NODE = "gpu-01"
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
MIG_PENDING = {"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "pending"}


def ctx(*, inventory: Any = None, **kw: Any) -> CheckCtx:
    return CheckCtx(None, node=NODE, inventory=inventory, **kw)


def advance(step: WaitFor | Hold, context: CheckCtx) -> Any:
    return step.advance(context)  # type: ignore[arg-type]


# --- wait-for and validate: the conditions ---------------------------------------------------


def _not_ready(make):
    return make.assess(make.node(NODE, ready=False))


def _mig_pending(make):
    return make.assess(make.node(NODE, labels=MIG_PENDING))


def _driver_not_ready(make):
    return make.assess(make.node(NODE), [make.driver_pod(NODE, ready=False), make.device_plugin_pod(NODE),
                                         make.validator_pod(NODE)])


def _healthy(make):
    return make.assess(make.node(NODE))


def _operator_driver_gone(make):
    """The driver's deploy label turned off and its pod gone (a move to a host driver)."""
    return make.assess(make.node(NODE, labels={"nvidia.com/gpu.deploy.driver": "false"}),
                       [make.device_plugin_pod(NODE), make.validator_pod(NODE)])


@pytest.mark.parametrize(("condition", "node", "unmet"), [
    ("node-ready", _not_ready, "node NotReady"),
    ("mig-success", _mig_pending, "MIG all-1g.10gb (pending)"),
    # The driver pod is there and the operator owns the driver, but the pod is not Ready.
    ("operator-driver-ready", _driver_not_ready, "operator driver pod Running, not Ready (driver owner: operator)"),
    # Waiting for the operator's driver pod to leave: it still runs, Ready.
    ("no-operator-driver", _healthy, "operator driver pod Running, Ready (driver owner: operator)"),
], ids=["node-ready", "mig-success", "operator-driver-ready", "no-operator-driver"])
def test_a_condition_not_yet_so_keeps_the_step_waiting_and_says_what_the_node_shows(make, condition, node, unmet):
    step = WaitFor(DEFAULT_VALIDATE)
    context = ctx(kind="validate", params={"conditions": [condition]}, inventory=node(make))

    assert advance(step, context) == Waiting(f"waiting: {unmet}")
    context.dry_run = True
    assert advance(step, context) == Done(f"would wait, now: {unmet}")


@pytest.mark.parametrize(("condition", "node"), [
    ("node-ready", _healthy),
    ("mig-success", _healthy),
    ("operator-driver-ready", _healthy),
    ("no-operator-driver", _operator_driver_gone),
], ids=["node-ready", "mig-success", "operator-driver-ready", "no-operator-driver"])
def test_a_condition_that_holds_lets_the_step_finish_naming_it(make, condition, node):
    context = ctx(kind="validate", params={"conditions": [condition]}, inventory=node(make))

    assert advance(WaitFor(DEFAULT_VALIDATE), context) == Done(f"holds: {condition}")


def test_a_node_missing_from_the_fleet_view_holds_no_condition_and_the_note_names_it():
    step = WaitFor(DEFAULT_WAIT_FOR)
    missing = "gpu-01 is not in the fleet view (not a GPU node, or deleted)"

    assert advance(step, ctx(kind="wait-for")) == Waiting(f"waiting: {missing}")
    assert advance(step, ctx(kind="wait-for", dry_run=True)) == Done(f"would wait, now: {missing}")


@pytest.mark.parametrize("params", [{"condition": "mig-success"}, {"conditions": "mig-success"},
                                    {"conditions": ["mig-success"]}])
def test_one_condition_named_alone_is_the_only_one_waited_for_and_is_the_intent_on_record(make, params):
    step = WaitFor(DEFAULT_WAIT_FOR)
    # Everything the default conditions look at is fine; only the MIG layout is not yet applied.
    context = ctx(kind="wait-for", params=params, inventory=_mig_pending(make))

    assert step.prepare(context) == {"conditions": ["mig-success"]}  # type: ignore[arg-type]
    assert advance(step, context) == Waiting("waiting: MIG all-1g.10gb (pending)")


def test_a_wait_for_may_take_ten_minutes_unless_told_and_a_timeout_of_no_time_is_refused_naming_the_step():
    step = WaitFor(DEFAULT_WAIT_FOR)
    assert step.timeout(ctx(kind="wait-for")) == dt.timedelta(minutes=10)  # type: ignore[arg-type]
    assert step.timeout(ctx(kind="wait-for", params={"timeout_s": 30})) == dt.timedelta(seconds=30)  # type: ignore[arg-type]
    with pytest.raises(StepParamsError, match=r"^wait-for step: params\.timeout_s must be more than 0, not 0$"):
        step.timeout(ctx(kind="wait-for", params={"timeout_s": 0}))  # type: ignore[arg-type]


# --- hold ------------------------------------------------------------------------------------


def test_a_hold_says_its_end_in_the_display_zone_before_the_warning_with_it_and_in_the_warning():
    hold = Hold()
    intent = hold.prepare(ctx(window_end=NOW + dt.timedelta(hours=2)))  # type: ignore[arg-type]
    end = "2025-06-07 16:00:00 CEST"

    early = advance(hold, ctx(intent=intent, zone=BERLIN))
    assert early == Waiting(f"holding until {end}", retry_in=dt.timedelta(hours=1, minutes=45).total_seconds())

    late = advance(hold, ctx(intent=intent, zone=BERLIN, now=NOW + dt.timedelta(hours=1, minutes=50)))
    assert isinstance(late, Waiting) and late.reason == f"holding until {end}"
    assert late.retry_in == dt.timedelta(minutes=10).total_seconds()
    assert late.notice is not None and late.notice.text == (
        f"The drain window ends at {end}: the nodes are then validated and uncordoned. "
        "Need longer? `/gpu drain extend req-1 <duration>`")


def test_an_open_ended_drains_limit_is_told_in_the_display_zone():
    hold = Hold()
    params = {"until": None, "released_by": "drain done", "at_most_s": 86400}
    intent = hold.prepare(ctx(params=params))  # type: ignore[arg-type]

    warned = advance(hold, ctx(params=params, intent=intent, zone=BERLIN, now=NOW + dt.timedelta(hours=23, minutes=50)))
    assert isinstance(warned, Waiting) and warned.reason == "holding until 2025-06-08 14:00:00 CEST"
    assert warned.notice is not None and warned.notice.text == (
        "This drain has no end of its own and reaches the pool's limit for open-ended drains (open_drain_max) "
        "at 2025-06-08 14:00:00 CEST: the nodes are then validated and uncordoned.")


def test_a_hold_of_exactly_the_warnings_lead_is_not_warned_about_and_one_a_second_longer_is():
    hold = Hold()
    exact = hold.prepare(ctx(params={"seconds": 900}))  # type: ignore[arg-type]
    assert exact["warn_at"] is None
    assert advance(hold, ctx(intent=exact)) == Waiting("holding until 2025-06-07 12:15:00 UTC", retry_in=900.0)

    longer = hold.prepare(ctx(params={"seconds": 901}))  # type: ignore[arg-type]
    assert longer["warn_at"] == "2025-06-07T12:00:01.000000Z"
    assert advance(hold, ctx(intent=longer)) == Waiting("holding until 2025-06-07 12:15:01 UTC", retry_in=1.0)


def test_an_extension_to_the_end_the_hold_already_has_is_not_news_to_the_thread():
    hold = Hold()
    intent = hold.prepare(ctx(params={"seconds": 600}))  # type: ignore[arg-type]
    same_end = {"seconds": 600, "extended_until": "2025-06-07T12:10:00.000000Z"}

    outcome = advance(hold, ctx(params=same_end, intent=intent))
    assert outcome == Waiting("holding until 2025-06-07 12:10:00 UTC", retry_in=600.0)


def test_an_open_ended_drain_ends_at_the_pools_limit_whatever_extension_is_written():
    hold = Hold()
    params = {"until": None, "released_by": "drain done", "at_most_s": 3600,
              "extended_until": "2025-06-07T15:00:00.000000Z"}
    intent = hold.prepare(ctx(params=params))  # type: ignore[arg-type]

    at_limit = advance(hold, ctx(params=params, intent=intent, now=NOW + dt.timedelta(hours=1)))
    assert at_limit == Done("held until 2025-06-07 13:00:00 UTC")


def test_drain_done_said_after_the_hold_had_ended_reports_the_end_it_had():
    hold = Hold()
    intent = hold.prepare(ctx(params={"seconds": 90}))  # type: ignore[arg-type]
    late_release = {"seconds": 90, "released_at": "2025-06-07T12:05:00.000000Z"}

    outcome = advance(hold, ctx(params=late_release, intent=intent, now=NOW + dt.timedelta(minutes=10)))
    assert outcome == Done("held until 2025-06-07 12:01:30 UTC")


def test_a_dry_run_hold_is_done_at_once_saying_what_it_would_hold_for():
    hold = Hold()
    timed = hold.prepare(ctx(params={"seconds": 90}))  # type: ignore[arg-type]
    assert advance(hold, ctx(intent=timed, dry_run=True)) == Done("would hold until 2025-06-07 12:01:30 UTC")

    params = {"until": None, "released_by": "drain done"}
    open_ended = hold.prepare(ctx(params=params))  # type: ignore[arg-type]
    assert advance(hold, ctx(params=params, intent=open_ended, dry_run=True)) == Done(
        "would hold until someone says `drain done`")
