"""Pre-flight: a plan whose canary pod asks for a resource its nodes will not advertise
after the change is refused before anyone approves it, naming what the pool advertises
and which key to set; a MIG pool (mixed strategy) and a shared pool (renamed resource)
are the cases people meet; a check turned off that a move runs anyway asks to be turned on."""

from __future__ import annotations

import datetime as dt

import pytest

from workflows.kube.objects import NodeName
from workflows.migrate.plan import MigrateAsk, MigrateRefused, plan_migrate
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.pools.config import GpuCheck, PoolConfig
from workflows.preflight.check import canary_refusal
from workflows.upgrade.plan import UpgradeAsk, plan_upgrade
from workflows.upgrade.scope import UpgradeRefused

NOW = dt.datetime(2026, 12, 4, 10, 0, tzinfo=dt.timezone.utc)
A100 = "NVIDIA-A100-SXM4-80GB"
MIG = "nvidia.com/mig-1g.10gb"


def _policy(**more) -> PoolConfig:
    return PoolConfig.model_validate({"kind": "serving", "windows": "always", "max_unavailable": 1, **more})


def _mig_node(make, name: str, *, devices: dict[str, int] | None = None):
    devices = {"1g.10gb": 56} if devices is None else devices
    labels: dict[str, str | None] = {"nvidia.com/gpu.product": A100, "nvidia.com/mig.strategy": "mixed",
                                     "nvidia.com/mig.config": "all-1g.10gb"}
    labels.update({f"nvidia.com/mig-{p}.count": str(n) for p, n in devices.items()})
    capacity: dict[str, str | None] = {f"nvidia.com/mig-{p}": str(n) for p, n in devices.items()}
    capacity["nvidia.com/gpu"] = None
    return make.node(name, pool="inf", labels=labels, capacity=capacity)


def _shared_node(make, name: str):
    return make.node(name, pool="inf", labels={"nvidia.com/gpu.replicas": "4",
                                               "nvidia.com/gpu.sharing-strategy": "time-slicing"},
                     capacity={"nvidia.com/gpu": None, "nvidia.com/gpu.shared": "32"})


def _fleet(make, nodes):
    pods = [p for n in nodes for p in make.operands(n.name)]
    return make.fleet(nodes, pods, policies=[make.cluster_policy(
        driver={"enabled": True, "version": "580.95.05", "upgradePolicy": {"autoUpgrade": False}})])


def _upgrade(fleet, *, policy=None, gpu_check=None):
    return plan_upgrade(UpgradeAsk(pool="inf", version="580.105.08"), fleet=fleet, policy=policy or _policy(),
                        now=NOW, requested_by="U0ALICE", gpu_check=gpu_check)


def test_an_upgrade_of_a_mig_pool_whose_check_asks_for_the_default_gpu_is_refused_asking_for_a_mig_device(make):
    fleet = _fleet(make, [_mig_node(make, "m1"), _mig_node(make, "m2")])

    with pytest.raises(UpgradeRefused) as refused:
        _upgrade(fleet, gpu_check=GpuCheck())

    assert refused.value.code == "gpu-check-resource-unset"
    reason = refused.value.reason
    assert "asks for one nvidia.com/gpu by default (no `gpu_check.resource` is configured)" in reason
    assert "m1 and m2 will not advertise after this change" in reason
    assert f"inf's nodes advertise {MIG}: name the one the check should use" in reason
    assert f"set `pools.inf.gpu_check.resource` to {MIG}" in reason


def test_a_check_configured_for_a_resource_the_pool_does_not_advertise_is_refused_naming_where_it_is_set(make):
    fleet = _fleet(make, [_mig_node(make, "m1")])

    with pytest.raises(UpgradeRefused) as refused:
        _upgrade(fleet, gpu_check=GpuCheck(resource="nvidia.com/gpu"))

    assert refused.value.code == "gpu-check-resource"
    assert refused.value.reason.startswith("The canary pod (upgrades.gpu_check) asks for one nvidia.com/gpu, which m1 "
                                           "will not advertise after this change")
    with pytest.raises(UpgradeRefused, match=r"The canary pod \(pools.inf.gpu_check\) asks for one "
                                             r"nvidia.com/mig-3g.40gb"):
        _upgrade(fleet, policy=_policy(gpu_check={"resource": "nvidia.com/mig-3g.40gb"}))


def test_a_mig_pool_whose_own_check_asks_for_its_mig_device_is_planned_with_that_check(make):
    fleet = _fleet(make, [_mig_node(make, "m1"), _mig_node(make, "m2")])

    planned = _upgrade(fleet, policy=_policy(gpu_check={"resource": MIG}), gpu_check=GpuCheck())

    checks = [s for w in planned.plan.waves for s in w.steps if s.kind == "gpu-check"]
    assert [(s.node, s.params["resource"]) for s in checks] == [("m1", MIG), ("m2", MIG)]


def test_a_shared_pool_whose_device_plugin_renames_its_resource_is_asked_for_the_renamed_one(make):
    fleet = _fleet(make, [_shared_node(make, "s1")])

    with pytest.raises(UpgradeRefused) as refused:
        _upgrade(fleet, gpu_check=GpuCheck())

    assert refused.value.code == "gpu-check-resource-unset"
    assert "set `pools.inf.gpu_check.resource` to nvidia.com/gpu.shared" in refused.value.reason


def test_a_pool_of_whole_gpus_keeps_the_default_check_and_a_pool_without_a_check_is_not_judged(make):
    whole = _fleet(make, [make.node("g1", pool="inf"), make.node("g2", pool="inf")])
    assert len(_upgrade(whole, gpu_check=GpuCheck()).plan.waves) == 2

    mig = _fleet(make, [_mig_node(make, "m1")])
    planned = _upgrade(mig)  # no check configured: no canary pod, nothing to refuse
    assert not any(s.kind == "gpu-check" for w in planned.plan.waves for s in w.steps)


def test_only_the_nodes_that_will_not_advertise_it_are_named_and_one_resource_every_node_has_is_offered(make):
    mixed = _mig_node(make, "m2", devices={"1g.10gb": 16, "3g.40gb": 16})
    fleet = _fleet(make, [make.node("g1", pool="inf"), _mig_node(make, "m1", devices={"1g.10gb": 56}), mixed])

    with pytest.raises(UpgradeRefused) as refused:
        _upgrade(fleet, policy=_policy(gpu_check={"resource": "nvidia.com/mig-3g.40gb"}))

    reason = refused.value.reason
    assert "nvidia.com/mig-3g.40gb, which g1 and m1 will not advertise" in reason
    assert (f"inf's nodes advertise {MIG} (on 2 of 3 nodes), nvidia.com/gpu (on 1 of 3 nodes) and "
            "nvidia.com/mig-3g.40gb (on 1 of 3 nodes)") in reason
    assert "no one resource is advertised by every node it checks" in reason


def test_a_node_that_advertises_no_gpu_resource_at_all_is_not_judged(make):
    silent = make.node("m9", pool="inf", capacity={"nvidia.com/gpu": None},
                       labels={"nvidia.com/gpu.count": None, "nvidia.com/mig.strategy": "mixed"})
    fleet = _fleet(make, [silent])
    plan = Plan(kind="upgrade", pool="inf", created_for="U0ALICE", summary=PlanSummary(), waves=(
        Wave(0, (NodeName("m9"),), (NodeStep("gpu-check", NodeName("m9"), {"resource": "nvidia.com/gpu"}),)),))

    assert canary_refusal("inf", plan.waves, fleet=fleet, check=None, configured_at="upgrades.gpu_check") is None


def test_what_a_node_advertises_after_the_change_is_what_its_mig_step_expects(make):
    fleet = _fleet(make, [make.node("g1", pool="inf")])
    g1 = NodeName("g1")

    def plan(expect: dict[str, int]) -> Plan:
        return Plan(kind="mig", pool="inf", created_for="U0ALICE", summary=PlanSummary(), waves=(
            Wave(0, (g1,), (NodeStep("mig", g1, {"config": "all-1g.10gb", "expect": expect}),
                            NodeStep("gpu-check", g1, {"resource": "nvidia.com/gpu"}))),))

    # Today g1 advertises nvidia.com/gpu; its new layout makes only MIG devices.
    refused = canary_refusal("inf", plan({MIG: 56}).waves, fleet=fleet, check=None, configured_at="upgrades.gpu_check")
    assert refused is not None and f"inf's nodes advertise {MIG}" in refused.reason
    assert canary_refusal("inf", plan({"nvidia.com/gpu": 8}).waves, fleet=fleet, check=None,
                          configured_at="upgrades.gpu_check") is None


def test_a_move_to_the_operator_of_a_mig_pool_with_the_default_test_pod_is_refused(make):
    node = make.node("m1", pool="inf", labels={"nvidia.com/gpu.product": A100, "nvidia.com/mig.strategy": "mixed",
                                               "nvidia.com/mig-1g.10gb.count": "56",
                                               "nvidia.com/gpu.deploy.driver": "pre-installed"},
                     capacity={"nvidia.com/gpu": None, MIG: "56"})
    fleet = make.fleet([node], [make.device_plugin_pod("m1"), make.validator_pod("m1")])
    assert fleet.nodes["m1"].driver.owner == "host"

    with pytest.raises(MigrateRefused) as refused:
        plan_migrate(MigrateAsk(targets=("inf",)), fleet=fleet, policy_of={"inf": _policy()}, now=NOW,
                     requested_by="U0ALICE")

    assert refused.value.code == "gpu-check-resource-unset"
    assert f"set `pools.inf.gpu_check.resource` to {MIG}" in refused.value.reason


def test_a_check_asking_for_more_gpus_than_a_node_will_advertise_is_refused_naming_how_many_it_has(make):
    four = make.node("g4", pool="inf", labels={"nvidia.com/gpu.count": "4"}, capacity={"nvidia.com/gpu": "4"})
    fleet = _fleet(make, [make.node("g1", pool="inf"), four])

    with pytest.raises(UpgradeRefused) as refused:
        _upgrade(fleet, policy=_policy(gpu_check={"count": 8}))

    assert refused.value.code == "gpu-check-count"
    reason = refused.value.reason
    assert reason.startswith("The canary pod (pools.inf.gpu_check) asks for 8 nvidia.com/gpu, more than g4 (4) will "
                             "advertise after this change")
    assert "Set `count` in pools.inf.gpu_check to `all` (every one the node advertises) or to at most 4" in reason
    # What every node has, or all of each, plans; and the plan says how many the pod holds.
    assert len(_upgrade(fleet, policy=_policy(gpu_check={"count": 4})).plan.waves) == 2
    planned = _upgrade(fleet, policy=_policy(gpu_check={"count": "all"}))
    assert any("every nvidia.com/gpu of the node" in note for note in planned.plan.summary.notes)
    assert any(" 4 nvidia.com/gpu); a non-zero exit halts the run" in note
               for note in _upgrade(fleet, policy=_policy(gpu_check={"count": 4})).plan.summary.notes)


def test_a_check_turned_off_that_the_change_runs_anyway_is_refused_asking_to_turn_it_on_not_to_name_a_resource(make):
    # A move runs the default test pod when the pool's check is off; a MIG pool of two layouts
    # has no one resource to offer, so the sentence says to split it.
    fleet = _fleet(make, [_mig_node(make, "m1"), _mig_node(make, "m2", devices={"3g.40gb": 16})])
    plan = Plan(kind="migrate", pool="inf", created_for="U0ALICE", summary=PlanSummary(), waves=tuple(
        Wave(i, (NodeName(n),), (NodeStep("gpu-check", NodeName(n), {"resource": "nvidia.com/gpu"}),))
        for i, n in enumerate(("m1", "m2"))))

    refused = canary_refusal("inf", plan.waves, fleet=fleet, check=GpuCheck(enabled=False, resource=MIG),
                             configured_at="pools.inf.gpu_check")

    assert refused is not None and refused.code == "gpu-check-resource-unset"
    assert refused.reason == (
        "The canary pod asks for one nvidia.com/gpu by default: `pools.inf.gpu_check` is turned off (`enabled: "
        "false`), and this change runs the default test pod then, which m1 and m2 will not advertise after this "
        "change: it would stay Pending until its timeout and halt the run with the node cordoned. inf's nodes "
        f"advertise {MIG} (on 1 of 2 nodes) and nvidia.com/mig-3g.40gb (on 1 of 2 nodes); no one resource is "
        "advertised by every node it checks: split the pool")
