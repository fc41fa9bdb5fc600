"""Plan records as an approver and an operator meet them: the exact refusal for each malformed
plan, pre-flight note or stored plan JSON, and that nothing reachable after a plan is built
can change what was approved.

The behaviours pinned here:
- a pre-flight note with an unknown severity, or without its check, its code or its sentence,
  is refused with a sentence naming what is wrong;
- a plan of an unknown kind or without a pool is refused with a sentence saying so;
- stored plan JSON whose plan, summary, wave or pre-flight note is not a JSON object is
  refused with a `PlanFormatError` naming which part and what it was instead, and JSON
  describing an impossible plan is refused with the reason;
- step params that are not JSON (not a map, a map with a non-text key, bytes, a set, NaN or
  infinity at any depth) are refused naming "step params" and the offending value;
- a step of an unknown kind or without a node, a wave with a negative index, a node listed
  twice or steps for nodes it does not hold, and a summary whose window is not
  timezone-aware (naive, or in a zone that gives no UTC offset), does not end after it
  starts, or whose counts are negative, are refused with a sentence naming what is wrong;
- the lists a plan and its parts are built from (waves, a wave's nodes and steps, a
  summary's notes and pre-flight, a note's nodes and details) are copied: changing them
  afterwards changes neither the plan nor its hash;
- Python's `hash()` of plan values follows their canonical JSON, so distinct plans, waves,
  steps, summaries and notes do not all collide in sets and dicts.
"""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest

from workflows.kinds import kinds_in_force
from workflows.kube.objects import NodeName
from workflows.plans import (
    NodeStep,
    Plan,
    PlanFormatError,
    PlanSummary,
    PreflightNote,
    Wave,
    plan_from_json,
    plan_hash,
    plan_to_json,
)
from tests.unit.test_plans import one_node_drain, two_wave_upgrade

GPU_01 = NodeName("gpu-01")
GPU_02 = NodeName("gpu-02")
UTC = dt.timezone.utc


def note(**fields: object) -> PreflightNote:
    given = {"check": "nodes", "code": "left-out", "severity": "critical", "sentence": "gpu-02 is left out",
             **fields}
    return PreflightNote(**given)  # type: ignore[arg-type]


def stored_drain(**changes: object) -> dict[str, object]:
    """`one_node_drain()` as stored, with top-level fields replaced."""
    return {**plan_to_json(one_node_drain()), **changes}


def stored_drain_with_summary(**changes: object) -> dict[str, object]:
    data = plan_to_json(one_node_drain())
    return {**data, "summary": {**data["summary"], **changes}}


def stored_drain_with_params(params: object) -> dict[str, object]:
    data = plan_to_json(one_node_drain())
    data["waves"][0]["steps"][1]["params"] = params
    return data


# ------------------------------------------------------------------ pre-flight notes


def test_a_pre_flight_note_of_an_unknown_severity_is_refused_naming_the_severities():
    with pytest.raises(ValueError) as caught:
        note(severity="urgent")
    assert str(caught.value) == "pre-flight severity 'urgent' is not one of ['critical', 'warning', 'info']"


@pytest.mark.parametrize("missing", ["check", "code", "sentence"])
def test_a_pre_flight_note_without_its_check_code_or_sentence_is_refused(missing):
    with pytest.raises(ValueError) as caught:
        note(**{missing: ""})
    assert str(caught.value) == "a pre-flight note needs its check, its code and its sentence"


def test_a_pre_flight_notes_nodes_and_details_cannot_be_changed_after_it_is_built():
    nodes, details = [NodeName("gpu-02")], ["advertised-mismatch: 7 of 8"]
    built = note(nodes=nodes, details=details)
    plan = Plan(kind="drain", pool="serving-a", waves=(), summary=PlanSummary(preflight=(built,)),
                created_for="U0ADA")
    approved = plan_hash(plan)
    nodes.append(NodeName("gpu-03"))
    details.append("one more")
    assert built.nodes == ("gpu-02",)
    assert built.details == ("advertised-mismatch: 7 of 8",)
    assert plan_hash(plan) == approved


def test_a_stored_pre_flight_note_that_is_not_an_object_is_refused_by_name():
    with pytest.raises(PlanFormatError) as caught:
        plan_from_json(stored_drain_with_summary(preflight=[["nodes", "left-out"]]))
    assert str(caught.value) == "pre-flight note must be a JSON object, not list"


# ------------------------------------------------------------------ plans


def test_a_plan_of_an_unknown_kind_is_refused_naming_the_kinds_in_force():
    with pytest.raises(ValueError) as caught:
        Plan(kind="reboot", pool="serving-a", waves=(), summary=PlanSummary(), created_for="U0ADA")
    assert str(caught.value) == f"unknown plan kind 'reboot'; use one of {sorted(kinds_in_force().names)}"
    assert "'drain'" in str(caught.value)


def test_a_plan_without_a_pool_is_refused():
    with pytest.raises(ValueError) as caught:
        Plan(kind="drain", pool="", waves=(), summary=PlanSummary(), created_for="U0ADA")
    assert str(caught.value) == "a plan needs a pool"


def test_the_waves_a_plan_is_built_from_cannot_be_changed_after_it_is_built():
    first = one_node_drain().waves[0]
    waves = [first]
    plan = Plan(kind="drain", pool="serving-a", waves=waves, summary=PlanSummary(),  # type: ignore[arg-type]
                created_for="U0ADA")
    approved = plan_hash(plan)
    waves.append(Wave(1, (NodeName("gpu-02"),), ()))
    assert plan.waves == (first,)
    assert plan.nodes == ("gpu-01",)
    assert plan_hash(plan) == approved


def test_distinct_plan_values_do_not_all_share_one_python_hash():
    plans = [one_node_drain(), two_wave_upgrade(), two_wave_upgrade(notes=("canary first",)),
             Plan(kind="mig", pool="p", waves=(), summary=PlanSummary(), created_for="U0X")]
    assert len({hash(p) for p in plans}) == len(plans)
    steps = [NodeStep("cordon", GPU_01), NodeStep("uncordon", GPU_01), NodeStep("drain", GPU_01, {"force": True})]
    assert len({hash(s) for s in steps}) == len(steps)
    notes = [note(), note(severity="info"), note(sentence="gpu-03 is left out")]
    assert len({hash(n) for n in notes}) == len(notes)
    assert hash(PlanSummary()) != hash(PlanSummary(evictions_expected=1))
    assert hash(Wave(0, (), ())) != hash(Wave(1, (), ()))


# ------------------------------------------------------------------ stored plan JSON


@pytest.mark.parametrize("stored, message", [
    (["drain", "serving-a"], "plan must be a JSON object, not list"),
    ('"drain"', "plan must be a JSON object, not str"),
    (stored_drain(summary=None), "plan summary must be a JSON object, not NoneType"),
    (stored_drain(summary=[]), "plan summary must be a JSON object, not list"),
    (stored_drain(waves=["gpu-01"]), "wave must be a JSON object, not str"),
])
def test_stored_plan_json_whose_parts_are_not_objects_is_refused_naming_the_part(stored, message):
    with pytest.raises(PlanFormatError) as caught:
        plan_from_json(stored)
    assert str(caught.value) == message


def test_stored_plan_json_describing_an_impossible_plan_is_refused_with_the_reason():
    data = plan_to_json(one_node_drain())
    data["waves"][0]["index"] = -1
    with pytest.raises(PlanFormatError) as caught:
        plan_from_json(data)
    assert str(caught.value) == "plan JSON does not describe a valid plan: wave index must be 0 or more, not -1"


def test_stored_step_params_that_are_not_a_map_are_refused_naming_the_step_params():
    with pytest.raises(PlanFormatError) as caught:
        plan_from_json(json.dumps(stored_drain_with_params(["scope", "all-non-daemonset"])))
    assert str(caught.value) == "plan JSON does not describe a valid plan: step params must be a mapping, not list"


# ------------------------------------------------------------------ step params


@pytest.mark.parametrize("params, message", [
    (None, "step params must be a mapping, not NoneType"),
    ({1: "x"}, "step params keys must be text, not 1"),
    ({"nested": {2: "x"}}, "step params keys must be text, not 2"),
    ({"payload": b"\x00\x01"}, "step params hold JSON values only, not bytes"),
    ({"payload": bytearray(b"\x00")}, "step params hold JSON values only, not bytearray"),
    ({"nodes": {"gpu-01", "gpu-02"}}, "step params hold JSON values only, not set"),
    ({"limits": {"timeout_s": math.nan}}, "step params cannot hold nan: JSON has no NaN or infinity"),
    ({"timeouts": [600, math.inf]}, "step params cannot hold inf: JSON has no NaN or infinity"),
    ({"timeout_s": -math.inf}, "step params cannot hold -inf: JSON has no NaN or infinity"),
])
def test_step_params_that_are_not_json_are_refused_naming_the_step_params_and_the_value(params, message):
    with pytest.raises((TypeError, ValueError)) as caught:
        NodeStep("drain", GPU_01, params)
    assert str(caught.value) == message


# ------------------------------------------------------------------ steps and waves


def test_a_step_of_an_unknown_kind_is_refused_naming_the_step_kinds_in_force():
    with pytest.raises(ValueError) as caught:
        NodeStep("reboot", GPU_01)  # type: ignore[arg-type]
    assert str(caught.value) == f"unknown step kind 'reboot'; use one of {sorted(kinds_in_force().step_kinds)}"
    assert "'cordon'" in str(caught.value)


def test_a_step_without_a_node_is_refused():
    with pytest.raises(ValueError) as caught:
        NodeStep("cordon", NodeName(""))
    assert str(caught.value) == "a step needs a node name"


def test_a_step_built_without_params_has_empty_read_only_params():
    step = NodeStep("cordon", GPU_01)
    assert dict(step.params) == {}
    with pytest.raises(TypeError):
        step.params["force"] = True  # type: ignore[index]
    assert step.to_json() == {"kind": "cordon", "node": "gpu-01", "params": {}}


def test_a_wave_with_a_negative_index_is_refused():
    with pytest.raises(ValueError) as caught:
        Wave(-1, (GPU_01,), ())
    assert str(caught.value) == "wave index must be 0 or more, not -1"


def test_a_wave_listing_a_node_twice_is_refused_naming_its_nodes():
    with pytest.raises(ValueError) as caught:
        Wave(2, (GPU_01, GPU_02, GPU_01), ())
    assert str(caught.value) == "wave 2 lists a node twice: ['gpu-01', 'gpu-02', 'gpu-01']"


def test_a_wave_with_steps_for_nodes_it_does_not_hold_is_refused_naming_them():
    with pytest.raises(ValueError) as caught:
        Wave(1, (GPU_01,), (NodeStep("cordon", NodeName("gpu-09")), NodeStep("cordon", NodeName("gpu-03")),
                            NodeStep("uncordon", NodeName("gpu-09"))))
    assert str(caught.value) == "wave 1 has steps for nodes it does not hold: ['gpu-03', 'gpu-09']"


def test_the_nodes_and_steps_a_wave_is_built_from_cannot_be_changed_after_it_is_built():
    nodes, steps = [GPU_01], [NodeStep("cordon", GPU_01)]
    wave = Wave(0, nodes, steps)  # type: ignore[arg-type]
    plan = Plan(kind="drain", pool="serving-a", waves=(wave,), summary=PlanSummary(), created_for="U0ADA")
    approved = plan_hash(plan)
    nodes.append(GPU_02)
    steps.append(NodeStep("uncordon", GPU_01))
    assert wave.nodes == ("gpu-01",)
    assert wave.steps == (NodeStep("cordon", GPU_01),)
    assert plan.nodes == ("gpu-01",)
    assert plan_hash(plan) == approved


# ------------------------------------------------------------------ summaries


class NoOffset(dt.tzinfo):
    """A zone that cannot say its UTC offset (what a broken tz database entry looks like)."""

    def utcoffset(self, when: dt.datetime | None) -> None:
        return None

    def dst(self, when: dt.datetime | None) -> None:
        return None

    def tzname(self, when: dt.datetime | None) -> str:
        return "nowhere"


@pytest.mark.parametrize("field", ["window_start", "window_end"])
@pytest.mark.parametrize("zone", [None, NoOffset()])
def test_a_summary_window_without_a_utc_offset_is_refused_naming_the_field(field, zone):
    at = dt.datetime(2025, 6, 8, 2, tzinfo=zone)
    with pytest.raises(ValueError) as caught:
        PlanSummary(**{field: at})
    assert str(caught.value) == f"plan summary {field} must be timezone-aware, not 2025-06-08T02:00:00"


@pytest.mark.parametrize("end", [dt.datetime(2025, 6, 8, 2, tzinfo=UTC), dt.datetime(2025, 6, 8, 1, tzinfo=UTC)])
def test_a_summary_window_that_does_not_end_after_it_starts_is_refused(end):
    with pytest.raises(ValueError) as caught:
        PlanSummary(window_start=dt.datetime(2025, 6, 8, 2, tzinfo=UTC), window_end=end)
    assert str(caught.value) == "plan window must end after it starts"


def test_a_summary_window_may_be_open_at_either_end_or_a_minute_long():
    start = dt.datetime(2025, 6, 8, 2, tzinfo=UTC)
    assert PlanSummary(window_start=start).window_end is None
    assert PlanSummary(window_end=start).window_start is None
    assert PlanSummary(window_start=start, window_end=start + dt.timedelta(minutes=1)).window_end == start.replace(
        minute=1)


@pytest.mark.parametrize("counts", [{"evictions_expected": -1}, {"max_gpus_unavailable": -1},
                                    {"evictions_expected": -3, "max_gpus_unavailable": -8}])
def test_a_summary_with_a_negative_count_is_refused(counts):
    with pytest.raises(ValueError) as caught:
        PlanSummary(**counts)
    assert str(caught.value) == "plan summary counts cannot be negative"


def test_a_summary_may_expect_no_evictions_and_no_gpus_out():
    summary = PlanSummary(evictions_expected=0, max_gpus_unavailable=0)
    assert (summary.evictions_expected, summary.max_gpus_unavailable) == (0, 0)


def test_the_notes_and_pre_flight_a_summary_is_built_from_cannot_be_changed_after_it_is_built():
    notes, found = ["canary first"], [note()]
    summary = PlanSummary(notes=notes, preflight=found)  # type: ignore[arg-type]
    plan = Plan(kind="drain", pool="serving-a", waves=(), summary=summary, created_for="U0ADA")
    approved = plan_hash(plan)
    notes.append("one more")
    found.append(note(severity="info"))
    assert summary.notes == ("canary first",)
    assert summary.preflight == (note(),)
    assert plan_hash(plan) == approved
