"""Plans as values: a plan's hash names exactly one plan, in every process, and a plan
survives being stored as JSON."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import codec
from workflows.kinds import KINDS
from workflows.kube.objects import NodeName
from workflows.plans import (
    NodeStep,
    Plan,
    PlanFormatError,
    PlanSummary,
    Wave,
    plan_from_json,
    plan_hash,
    plan_to_json,
    short_hash,
)

ROOT = Path(__file__).resolve().parents[2]
UTC = dt.timezone.utc
STEP_KINDS: tuple[str, ...] = KINDS.step_kinds


def two_wave_upgrade(**summary: Any) -> Plan:
    steps = lambda node: tuple(  # noqa: E731
        NodeStep(kind, NodeName(node), params)
        for kind, params in (("cordon", {}), ("drain", {"timeout_s": 600, "force": False}),
                             ("driver", {"version": "580.95.05"}), ("validate", {}),
                             ("uncordon", {}))
    )
    return Plan(
        kind="upgrade",
        pool="serving-a",
        waves=(Wave(0, (NodeName("gpu-01"),), steps("gpu-01")),
               Wave(1, (NodeName("gpu-02"),), steps("gpu-02"))),
        summary=PlanSummary(target_driver_version="580.95.05", evictions_expected=3,
                            max_gpus_unavailable=8, **summary),
        created_for="U0ADA",
    )


# ------------------------------------------------------------------ strategies

json_scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
params_maps = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
node_names = st.from_regex(r"gpu-[a-z0-9]{1,6}", fullmatch=True)
aware_times = st.datetimes(min_value=dt.datetime(2024, 1, 1), max_value=dt.datetime(2030, 1, 1),
                           timezones=st.just(UTC))


@st.composite
def waves(draw: st.DrawFn) -> tuple[Wave, ...]:
    nodes = draw(st.lists(node_names, min_size=0, max_size=6, unique=True))
    groups: list[list[str]] = []
    for node in nodes:
        if not groups or draw(st.booleans()):
            groups.append([])
        groups[-1].append(node)
    result = []
    for index, group in enumerate(groups):
        steps = draw(st.lists(
            st.builds(NodeStep, kind=st.sampled_from(STEP_KINDS), node=st.sampled_from(group),
                      params=params_maps),
            max_size=4,
        ))
        result.append(Wave(index, tuple(NodeName(n) for n in group), tuple(steps)))
    return tuple(result)


@st.composite
def summaries(draw: st.DrawFn) -> PlanSummary:
    start = draw(st.none() | aware_times)
    end = None if start is None else start + draw(st.timedeltas(dt.timedelta(minutes=1),
                                                                dt.timedelta(days=2)))
    return PlanSummary(
        target_driver_version=draw(st.none() | st.text(max_size=10)),
        target_mig_config=draw(st.none() | st.sampled_from(["all-1g.10gb", "all-disabled"])),
        window_start=start,
        window_end=end,
        evictions_expected=draw(st.integers(0, 500)),
        max_gpus_unavailable=draw(st.integers(0, 64)),
        notes=tuple(draw(st.lists(st.text(max_size=12), max_size=2))),
    )


plans = st.builds(
    Plan,
    kind=st.sampled_from(["drain", "upgrade", "mig"]),
    pool=st.from_regex(r"[a-z]{1,6}-[a-z0-9]{1,3}", fullmatch=True),
    waves=waves(),
    summary=summaries(),
    created_for=st.from_regex(r"U0[A-Z0-9]{3,8}", fullmatch=True),
)


def reordered(value: Any) -> Any:
    """The same JSON value with every object's keys in reverse insertion order."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


def changed_somewhere(plan: Plan, choice: int) -> Plan:
    """`plan` with exactly one field changed; `choice` picks which."""
    data = plan_to_json(plan)
    summary = data["summary"]
    options: list[Any] = [
        lambda: {**data, "kind": {"drain": "upgrade", "upgrade": "mig", "mig": "drain"}[plan.kind]},
        lambda: {**data, "pool": plan.pool + "x"},
        lambda: {**data, "created_for": plan.created_for + "X"},
        lambda: {**data, "summary": {**summary, "target_driver_version":
                                     (summary["target_driver_version"] or "") + "1"}},
        lambda: {**data, "summary": {**summary, "target_mig_config":
                                     None if summary["target_mig_config"] else "all-1g.10gb"}},
        lambda: {**data, "summary": {**summary,
                                     "evictions_expected": summary["evictions_expected"] + 1}},
        lambda: {**data, "summary": {**summary,
                                     "max_gpus_unavailable": summary["max_gpus_unavailable"] + 1}},
        lambda: {**data, "summary": {**summary, "notes": summary["notes"] + ["one more"]}},
        lambda: {**data, "waves": data["waves"] + [
            {"index": len(data["waves"]), "nodes": ["gpu-new-node"], "steps": []}]},
    ]
    if plan.summary.window_end is not None:
        later = plan.summary.window_end + dt.timedelta(seconds=1)
        options.append(lambda: {**data, "summary": {**summary,
                                                    "window_end": codec.time_to_text(later)}})
    steps = [(w, s) for w, wave in enumerate(data["waves"]) for s in range(len(wave["steps"]))]
    if steps:
        w, s = steps[choice % len(steps)]

        def with_step(change: dict[str, Any]) -> dict[str, Any]:
            new_waves = json.loads(json.dumps(data["waves"]))
            new_waves[w]["steps"][s].update(change)
            return {**data, "waves": new_waves}

        step = data["waves"][w]["steps"][s]
        other_kind = STEP_KINDS[(STEP_KINDS.index(step["kind"]) + 1) % len(STEP_KINDS)]
        options.append(lambda: with_step({"kind": other_kind}))
        options.append(lambda: with_step({"params": {**step["params"], "extra-key": 1}}))
    return plan_from_json(options[choice % len(options)]())


# ------------------------------------------------------------------ the properties


@given(plans)
def test_a_plan_equal_to_another_hashes_the_same_whatever_the_key_order(plan: Plan):
    rebuilt = plan_from_json(reordered(plan_to_json(plan)))
    assert rebuilt == plan
    assert plan_hash(rebuilt) == plan_hash(plan)
    assert hash(rebuilt) == hash(plan)


@given(plans, st.integers(0, 1000))
@settings(max_examples=300)
def test_changing_any_field_of_a_plan_changes_its_hash(plan: Plan, choice: int):
    changed = changed_somewhere(plan, choice)
    assert changed != plan
    assert plan_hash(changed) != plan_hash(plan)


@given(plans)
def test_a_plan_survives_a_round_trip_through_json_text(plan: Plan):
    text = json.dumps(plan_to_json(plan))
    assert plan_from_json(text) == plan
    assert plan_from_json(json.loads(text)) == plan
    assert plan_hash(plan_from_json(text)) == plan_hash(plan)


def test_the_hash_is_the_same_in_another_process_with_another_hash_seed():
    plan = two_wave_upgrade(window_start=dt.datetime(2025, 6, 8, 2, tzinfo=UTC),
                            window_end=dt.datetime(2025, 6, 8, 4, tzinfo=UTC))
    program = (
        "import datetime as dt, sys; sys.path.insert(0, sys.argv[1]);"
        "from tests.unit.test_plans import two_wave_upgrade, UTC;"
        "from workflows.plans import plan_hash;"
        "print(plan_hash(two_wave_upgrade(window_start=dt.datetime(2025, 6, 8, 2, tzinfo=UTC),"
        " window_end=dt.datetime(2025, 6, 8, 4, tzinfo=UTC))))"
    )
    for seed in ("1", "4242"):
        out = subprocess.run([sys.executable, "-c", program, str(ROOT)], capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed})
        assert out.stdout.strip() == plan_hash(plan)


def test_a_window_given_in_another_zone_is_the_same_plan():
    paris = dt.timezone(dt.timedelta(hours=2))
    utc = two_wave_upgrade(window_start=dt.datetime(2025, 6, 8, 2, tzinfo=UTC),
                           window_end=dt.datetime(2025, 6, 8, 4, tzinfo=UTC))
    local = two_wave_upgrade(window_start=dt.datetime(2025, 6, 8, 4, tzinfo=paris),
                             window_end=dt.datetime(2025, 6, 8, 6, tzinfo=paris))
    assert plan_hash(utc) == plan_hash(local)


def test_a_flag_written_as_true_is_not_the_same_plan_as_one_written_as_1():
    # Python alone calls {"force": True} and {"force": 1} equal; an approver approved one of them.
    def with_force(value: object) -> Plan:
        step = NodeStep("drain", NodeName("gpu-01"), {"force": value})
        return Plan(kind="drain", pool="serving-a", waves=(Wave(0, (NodeName("gpu-01"),), (step,)),),
                    summary=PlanSummary(), created_for="U0ADA")

    flag, one = with_force(True), with_force(1)
    assert flag != one and flag.waves[0].steps[0] != one.waves[0].steps[0]
    assert plan_hash(flag) != plan_hash(one)
    assert len({flag, one}) == 2
    # Stored and read back, each stays what it was.
    assert plan_from_json(json.dumps(plan_to_json(flag))).waves[0].steps[0].params["force"] is True
    assert type(plan_from_json(json.dumps(plan_to_json(one))).waves[0].steps[0].params["force"]) is int


# Known answers. An approval names a plan by its hash, and requests in flight keep their
# approvals across an upgrade of gpuops only if the same plan still hashes the same: a
# change to the canonical form, the field names or the hash function fails here first.
ONE_NODE_DRAIN_TEXT = (
    '{"created_for":"U0ADA","format":1,"kind":"drain","pool":"serving-a","summary":{"evictions_expected":0,'
    '"max_gpus_unavailable":0,"notes":[],"target_driver_version":null,"target_mig_config":null,'
    '"window_end":null,"window_start":null},"waves":[{"index":0,"nodes":["gpu-01"],"steps":['
    '{"kind":"cordon","node":"gpu-01","params":{}},{"kind":"evict","node":"gpu-01","params":'
    '{"pdb_timeout_action":"wait","pdb_timeout_s":600,"scope":"all-non-daemonset"}},'
    '{"kind":"uncordon","node":"gpu-01","params":{"leave_cordoned":false}}]}]}'
)


def one_node_drain() -> Plan:
    node = NodeName("gpu-01")
    return Plan(kind="drain", pool="serving-a", summary=PlanSummary(), created_for="U0ADA", waves=(Wave(0, (node,), (
        NodeStep("cordon", node, {}),
        NodeStep("evict", node, {"scope": "all-non-daemonset", "pdb_timeout_s": 600, "pdb_timeout_action": "wait"}),
        NodeStep("uncordon", node, {"leave_cordoned": False}))),))


@pytest.mark.parametrize("build, expected", [
    (one_node_drain, "26e33bba6634cf69a397a8ab3d323b15c4de345d6cd8fc5a44e89d3fbb322496"),
    (lambda: Plan(kind="mig", pool="p", waves=(), summary=PlanSummary(), created_for="U0X"),
     "78a9978b8046a906b4caf1aa0178a6ddaba6794f633cbd1979347569d783c5ac"),
    (two_wave_upgrade, "154ee84023fdd0d4eb9e830d96611e37cba1708a66e7d6bab4e3cb6bbaa27451"),
    (lambda: two_wave_upgrade(window_start=dt.datetime(2025, 6, 8, 2, tzinfo=UTC),
                              window_end=dt.datetime(2025, 6, 8, 4, tzinfo=UTC)),
     "3aaf81a45cb2ee368431cb338fc2479904a22299695ee1072211804e334f8dab"),
])
def test_a_plan_approved_before_an_upgrade_of_gpuops_has_the_same_hash_after_it(build, expected):
    assert plan_hash(build()) == expected


def test_the_hash_is_the_sha256_of_the_plans_canonical_json_text():
    assert codec.json_to_text(plan_to_json(one_node_drain())) == ONE_NODE_DRAIN_TEXT
    assert plan_hash(one_node_drain()) == hashlib.sha256(ONE_NODE_DRAIN_TEXT.encode()).hexdigest()
    assert plan_from_json(ONE_NODE_DRAIN_TEXT) == one_node_drain()


def test_step_params_cannot_be_changed_after_the_plan_is_built():
    params = {"version": "580.95.05", "images": ["a", "b"]}
    step = NodeStep("driver", NodeName("gpu-01"), params)
    params["version"] = "999"
    assert step.params["version"] == "580.95.05"
    with pytest.raises(TypeError):
        step.params["version"] = "999"  # type: ignore[index]
    assert step.params["images"] == ("a", "b")


def test_the_short_hash_is_what_people_see():
    digest = plan_hash(two_wave_upgrade())
    assert len(digest) == 64
    assert short_hash(digest) == digest[:8]


def test_the_plan_lists_its_nodes_in_wave_order_and_storage_steps_count_per_node():
    plan = two_wave_upgrade()
    assert plan.nodes == ("gpu-01", "gpu-02")
    rows = plan.new_steps()
    assert [(r.wave, r.node, r.seq, r.kind) for r in rows[:2]] == [
        (0, "gpu-01", 0, "cordon"), (0, "gpu-01", 1, "drain")]
    assert rows[2].detail == {"version": "580.95.05"}
    assert len(rows) == 10


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda: Wave(0, (NodeName("a"),), (NodeStep("cordon", NodeName("b")),)),
         "steps for nodes it does not hold: ['b']"),
        (lambda: Plan("upgrade", "p", (Wave(1, (), ()),), PlanSummary(), "U"),
         "numbered 0, 1, 2"),
        (lambda: Plan("upgrade", "p", (Wave(0, (NodeName("a"),), ()),
                                       Wave(1, (NodeName("a"),), ())), PlanSummary(), "U"),
         "node a is in wave 0 and wave 1"),
        (lambda: PlanSummary(window_start=dt.datetime(2025, 1, 1)), "timezone-aware"),
        (lambda: NodeStep("reboot", NodeName("a")), "unknown step kind 'reboot'"),  # type: ignore[arg-type]
        (lambda: NodeStep("drain", NodeName("a"), {"t": float("nan")}), "no NaN"),
    ],
)
def test_an_impossible_plan_is_refused_when_built(build, fragment):
    with pytest.raises(ValueError, match=None) as caught:
        build()
    assert fragment in str(caught.value)


def test_stored_json_that_is_not_a_plan_says_what_is_wrong():
    with pytest.raises(PlanFormatError, match="lacks the field 'summary'"):
        plan_from_json({k: v for k, v in plan_to_json(two_wave_upgrade()).items() if k != "summary"})
    with pytest.raises(PlanFormatError, match="format 7"):
        plan_from_json({**plan_to_json(two_wave_upgrade()), "format": 7})
    with pytest.raises(PlanFormatError, match="not valid JSON"):
        plan_from_json("{nope")
