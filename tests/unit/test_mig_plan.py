"""MIG layout changes planned as capacity changes, against the operator's own default
mig-parted config (../shared/reference, as the operator ships it): which layouts a GPU
can take, what a node and the pool advertise before and after, the capacity floor in the
units the pool has at each point, and who is left without their resource."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

from workflows.mig.layouts import MigLayouts, MigRefused, resources
from workflows.mig.plan import MigAsk, MigRollbackOf, plan_mig
from workflows.pools.config import PoolConfig

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "gpu-operator" / "mig-parted"
NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
A100 = "NVIDIA-A100-SXM4-80GB"


@pytest.fixture(scope="module")
def layouts() -> MigLayouts:
    config = yaml.safe_load((REFERENCE / "default-mig-parted-config.yaml").read_text())["data"]["config.yaml"]
    return MigLayouts.parse(config, source="ConfigMap gpu-operator/default-mig-parted-config")


def test_a_layout_makes_the_devices_its_entry_names_for_every_gpu_and_the_strategy_names_the_resources(layouts):
    applied = layouts.apply("all-1g.10gb", product=A100, gpus=8)
    assert dict(applied.profiles) == {"1g.10gb": 56} and applied.whole_gpus == 0
    assert resources(applied, strategy="mixed", layout="all-1g.10gb") == {"nvidia.com/mig-1g.10gb": 56}
    # Single: the resource keeps its name, and counts MIG devices.
    assert resources(applied, strategy="single", layout="all-1g.10gb") == {"nvidia.com/gpu": 56}
    whole = layouts.apply("all-disabled", product=A100, gpus=8)
    assert resources(whole, strategy="mixed", layout="all-disabled") == {"nvidia.com/gpu": 8}
    mixed = layouts.apply("all-balanced", product=A100, gpus=8)
    assert dict(mixed.profiles) == {"1g.10gb": 16, "2g.20gb": 8, "3g.40gb": 8}


def test_a_layout_for_another_gpu_is_refused_with_what_this_gpu_makes(layouts):
    with pytest.raises(MigRefused) as refused:
        layouts.apply("all-1g.5gb", product=A100, gpus=8)  # an A100-40GB layout
    assert refused.value.code == "layout-not-for-gpu"
    assert "asks for 1g.5gb, which a NVIDIA-A100-SXM4-80GB cannot make" in refused.value.reason
    assert "7g.80gb" in refused.value.reason


def test_a_wrong_layout_name_is_refused_with_the_closest_names_and_the_layouts_this_gpu_takes(layouts):
    with pytest.raises(MigRefused) as refused:
        layouts.apply("all-1g.10g", product=A100, gpus=8)
    reason = refused.value.reason
    assert refused.value.code == "unknown-layout"
    assert reason.startswith("no MIG layout `all-1g.10g` in ConfigMap gpu-operator/default-mig-parted-config; "
                             "did you mean all-1g.10gb")
    assert "for NVIDIA-A100-SXM4-80GB it offers" in reason and "all-3g.40gb" in reason
    assert "all-1g.5gb," not in reason  # an A100-40GB layout is not offered for this GPU


def test_the_single_strategy_refuses_a_layout_of_several_profiles(layouts):
    with pytest.raises(MigRefused, match="mig.strategy is single, which needs one profile on every GPU"):
        resources(layouts.apply("all-balanced", product=A100, gpus=8), strategy="single", layout="all-balanced")


def test_a_config_that_is_not_mig_parted_is_refused_saying_where_it_was_read():
    with pytest.raises(MigRefused, match="ConfigMap x/y.*cannot be read as a mig-parted config: no mig-configs"):
        MigLayouts.parse("version: v1\n", source="ConfigMap x/y")


# ---- plans

def _mig_node(make, name: str, layout: str, *, pool: str = "inf", devices: dict[str, int] | None = None):
    devices = devices if devices is not None else {"all-1g.10gb": {"1g.10gb": 56}, "all-7g.80gb": {"7g.80gb": 8},
                                                   "all-disabled": {}}[layout]
    labels: dict[str, str | None] = {"nvidia.com/gpu.product": A100, "nvidia.com/mig.strategy": "mixed",
                                     "nvidia.com/mig.config": layout}
    labels.update({f"nvidia.com/mig-{p}.count": str(n) for p, n in devices.items()})
    capacity: dict[str, str | None] = {f"nvidia.com/mig-{p}": str(n) for p, n in devices.items()}
    if devices:
        capacity["nvidia.com/gpu"] = None
    return make.node(name, pool=pool, labels=labels, capacity=capacity)


def _plan(make, layouts, nodes, layout: str, *, floor: int = 0, budget: int = 2, pods=(), rollback=None):
    fleet = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)] + list(pods))
    policy = PoolConfig.model_validate({"kind": "serving", "windows": "always", "max_unavailable": budget,
                                        "min_ready_gpus": floor})
    return plan_mig(MigAsk(targets=("inf",), layout=layout, reason="r"), fleet=fleet, policy_of={"inf": policy},
                    layouts=layouts, strategy="mixed", now=NOW, requested_by="U0ALICE", gpu_pods=pods,
                    rollback=rollback)


def test_the_plan_says_per_node_and_for_the_pool_what_is_advertised_before_and_after(make, layouts):
    nodes = [_mig_node(make, f"n{i}", "all-7g.80gb") for i in range(1, 4)]
    planned = _plan(make, layouts, nodes, "all-1g.10gb")

    assert planned.pool_before == {"nvidia.com/mig-7g.80gb": 24}
    assert planned.pool_after == {"nvidia.com/mig-1g.10gb": 168}
    assert [(c.node, dict(c.before), dict(c.after)) for c in planned.changes] == [
        (n, {"nvidia.com/mig-7g.80gb": 8}, {"nvidia.com/mig-1g.10gb": 56}) for n in ("n1", "n2", "n3")]
    notes = planned.plan.summary.notes
    assert notes[0] == "pool inf: 24x nvidia.com/mig-7g.80gb -> 168x nvidia.com/mig-1g.10gb"
    assert "n1, n2 and n3: 8x nvidia.com/mig-7g.80gb -> 56x nvidia.com/mig-1g.10gb each" in notes
    assert planned.plan.summary.target_mig_config == "all-1g.10gb"
    steps = [(s.kind, dict(s.params).get("config")) for s in planned.plan.waves[0].steps]
    assert steps == [("cordon", None), ("evict", None), ("mig", "all-1g.10gb"), ("validate", None), ("uncordon", None)]
    mig = next(s for s in planned.plan.waves[0].steps if s.kind == "mig")
    assert dict(mig.params["expect"]) == {"nvidia.com/mig-1g.10gb": 56}


def test_the_floor_counts_a_changed_node_in_its_new_units_which_can_allow_larger_waves(make, layouts):
    # 4 x 8 whole-GPU MIG devices -> 4 x 56 slices, floor 20, two at a time.
    nodes = [_mig_node(make, f"n{i}", "all-7g.80gb") for i in range(1, 5)]
    planned = _plan(make, layouts, nodes, "all-1g.10gb", floor=20)
    # After the first node comes back with 56, two nodes (16) may go together: 80 - 16 >= 20.
    assert [w.nodes for w in planned.plan.waves] == [("n1",), ("n2", "n3"), ("n4",)]


def test_the_floor_in_the_new_units_refuses_a_change_that_would_take_the_pool_below_it(make, layouts):
    # 4 x 56 slices -> whole GPUs (8 each), floor 100: the third node cannot go out.
    nodes = [_mig_node(make, f"n{i}", "all-1g.10gb") for i in range(1, 5)]
    with pytest.raises(MigRefused) as refused:
        _plan(make, layouts, nodes, "all-disabled", floor=100)
    assert refused.value.code == "min-ready-gpus"
    assert "taking n3 out (56 Ready GPUs) would leave the pool 72 of its 128 Ready GPUs" in refused.value.reason


def test_workloads_that_ask_for_a_resource_no_node_will_advertise_are_named_with_their_owner(make, layouts):
    nodes = [_mig_node(make, f"n{i}", "all-1g.10gb") for i in range(1, 3)]
    # A workload's image (the builder's default is a device plugin's, a finding on the node).
    running = make.pod(node="n1", namespace="ml", name="small-7d9f-abc", owner_kind="ReplicaSet",
                       gpu_requests={"nvidia.com/mig-1g.10gb": 1}, image="registry.example/app:1")
    pending = make.pod(node=None, namespace="ml", name="batch-0", owner_kind="Job", phase="Pending",
                       gpu_requests={"nvidia.com/mig-1g.10gb": 2}, image="registry.example/app:1")
    planned = _plan(make, layouts, nodes, "all-3g.40gb", pods=[running, pending])

    assert planned.vanishing == ("nvidia.com/mig-1g.10gb",)
    assert [(w.pod, w.resources) for w in planned.stranded] == [
        ("ml/batch-0", ("nvidia.com/mig-1g.10gb",)), ("ml/small-7d9f-abc", ("nvidia.com/mig-1g.10gb",))]
    assert planned.moved["n1"].evicted == ("ml/small-7d9f-abc",) and planned.moved["n2"].evicted == ()
    assert planned.plan.summary.evictions_expected == 1
    assert "GPU pods evicted (PodDisruptionBudgets respected): n1: ml/small-7d9f-abc" in planned.plan.summary.notes
    assert any(n.startswith("no GPU node will advertise nvidia.com/mig-1g.10gb afterwards; asking for them now: "
                            "ml/batch-0 (Job owner)") and "(they will not schedule)" in n
               for n in planned.plan.summary.notes)


def test_nodes_already_at_the_layout_are_left_out_and_a_pool_all_there_is_refused(make, layouts):
    nodes = [_mig_node(make, "n1", "all-1g.10gb"), _mig_node(make, "n2", "all-7g.80gb")]
    planned = _plan(make, layouts, nodes, "all-1g.10gb")
    assert [c.node for c in planned.changes] == ["n2"]
    assert "n1 already runs `all-1g.10gb`: left out" in planned.plan.summary.notes
    with pytest.raises(MigRefused) as refused:
        _plan(make, layouts, nodes[:1], "all-1g.10gb")
    assert refused.value.code == "nothing-to-change"


def test_a_rollback_puts_each_node_back_to_its_own_layout_failed_node_first_taking_over_the_cordon(make, layouts):
    nodes = [_mig_node(make, "n1", "all-3g.40gb", devices={"3g.40gb": 16}),
             _mig_node(make, "n2", "all-1g.10gb")]
    planned = _plan(make, layouts, nodes, "", rollback=MigRollbackOf(
        run="run-9", layouts=(("n2", "all-7g.80gb"), ("n1", "all-1g.10gb"))))
    assert planned.order.canary == "n2"
    assert [(c.node, c.layout) for c in planned.changes] == [("n2", "all-7g.80gb"), ("n1", "all-1g.10gb")]
    cordon = planned.plan.waves[0].steps[0]
    assert cordon.kind == "cordon" and cordon.params["takes_over"] == "run-9"
    assert planned.plan.summary.target_mig_config is None  # two layouts: named per node


def test_a_node_mid_change_is_refused_a_new_layout_but_may_be_rolled_back(make, layouts):
    wedged = _mig_node(make, "n1", "all-3g.40gb", devices={})
    wedged = type(wedged)(**{**{f: getattr(wedged, f) for f in wedged.__slots__},
                             "labels": {**wedged.labels, "nvidia.com/mig.config.state": "pending"}})
    with pytest.raises(MigRefused) as refused:
        _plan(make, layouts, [wedged], "all-7g.80gb")
    assert refused.value.code == "mig-in-progress" and "in the middle of a MIG change" in refused.value.reason
    back = _plan(make, layouts, [wedged], "", rollback=MigRollbackOf(run="run-3", layouts=(("n1", "all-1g.10gb"),)))
    assert [(c.node, c.layout) for c in back.changes] == [("n1", "all-1g.10gb")]


@pytest.mark.parametrize(("check", "runs"), [({"diag": 1}, True), ({"command": ["nvidia-smi", "-L"]}, False)])
def test_a_pools_diag_check_runs_on_the_new_mig_devices_after_validation_and_a_command_check_does_not(
        make, layouts, check, runs):
    nodes = [_mig_node(make, "n1", "all-7g.80gb")]
    fleet = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)])
    policy = PoolConfig.model_validate({"kind": "serving", "windows": "always", "max_unavailable": 1,
                                        "gpu_check": check})
    planned = plan_mig(MigAsk(targets=("inf",), layout="all-1g.10gb", reason="r"), fleet=fleet,
                       policy_of={"inf": policy}, layouts=layouts, strategy="mixed", now=NOW, requested_by="U0ALICE")
    kinds = [s.kind for s in planned.plan.waves[0].steps]
    if not runs:
        assert "gpu-check" not in kinds
        return
    assert kinds[kinds.index("validate"):] == ["validate", "gpu-check", "uncordon"]
    check_step = next(s for s in planned.plan.waves[0].steps if s.kind == "gpu-check")
    # It holds every one of the devices the new layout makes, not the GPUs the node had.
    assert (check_step.params["resource"], check_step.params["count"], check_step.params["diag"]) == (
        "nvidia.com/mig-1g.10gb", "all", 1)
