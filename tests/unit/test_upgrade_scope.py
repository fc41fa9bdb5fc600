"""The scope of a pool's driver upgrade: the one object whose version changes, every
refusal before a plan (with what to do instead), and the canary and waves."""

from __future__ import annotations

import pytest

from workflows.pools.capacity import MaxUnavailable
from workflows.upgrade.scope import DriverVersion, UpgradeRefused, upgrade_order, upgrade_scope

NEW = "580.105.08"


def _operands(make, node: str, **driver) -> list:
    return [make.driver_pod(node, **driver), make.device_plugin_pod(node), make.validator_pod(node)]


def _per_pool(make, *, serving_nodes=2, training_auto=False, extra_nodes=(), extra_pods=()):
    nodes = [make.node(f"s{i}", pool="serving-a") for i in range(1, serving_nodes + 1)]
    nodes += [make.node("t1", pool="training-a"), *extra_nodes]
    pods = [p for n in nodes if n.name not in {e.name for e in extra_nodes} for p in _operands(make, n.name)]
    drivers = [make.nvidia_driver("serving-driver", node_selector={"gpuops.io/pool": "serving-a"}, auto_upgrade=False),
               make.nvidia_driver("training-driver", node_selector={"gpuops.io/pool": "training-a"},
                                  auto_upgrade=training_auto)]
    return make.fleet(nodes, pods + list(extra_pods), policies=[make.cluster_policy(driver={"useNvidiaDriverCRD": True})],
                      nvidia_drivers=drivers)


def _one_policy(make, *, auto_upgrade=False):
    nodes = [make.node("s1", pool="serving-a"), make.node("t1", pool="training-a"), make.node("m1", pool="mig")]
    pods = [p for n in nodes for p in _operands(make, n.name)]
    policy = make.cluster_policy(driver={"enabled": True, "version": "580.95.05",
                                         "upgradePolicy": {"autoUpgrade": auto_upgrade}})
    return make.fleet(nodes, pods, policies=[policy])


def refused(code: str, call) -> str:
    with pytest.raises(UpgradeRefused) as caught:
        call()
    assert caught.value.code == code, caught.value.reason
    return caught.value.reason


def test_a_pool_with_its_own_nvidia_driver_upgrades_that_object_alone(make):
    scope = upgrade_scope(_per_pool(make), "serving-a", version=NEW)
    assert (scope.manager.ref, scope.mode, scope.target.text) == ("NVIDIADriver serving-driver", "gpuops-drives", NEW)
    assert scope.nodes == ("s1", "s2") and scope.also_moves == () and not scope.downgrade
    assert scope.current == (("580.95.05", 2),)
    # autoUpgrade on: gpuops gates the operator's own upgrade instead of driving it.
    assert upgrade_scope(_per_pool(make, training_auto=True), "training-a", version=NEW).mode == "gates-operator"


@pytest.mark.parametrize("text", ["58.95", "580.95.05-ubuntu22.04", "v580.95.05", "latest", "580..05", ""])
def test_a_malformed_version_is_refused_with_the_form_to_use(make, text):
    reason = refused("malformed-version", lambda: upgrade_scope(_per_pool(make), "serving-a", version=text))
    assert reason == f"`{text}` is not a driver version: write it as NVIDIA does, three numbers (e.g. 580.95.05 or 570.172.08)"


def test_versions_compare_by_their_numbers_not_as_text():
    assert DriverVersion.parse("570.172.08") < DriverVersion.parse("580.95.05")
    assert DriverVersion.parse("580.95.05") < DriverVersion.parse("580.105.08")
    assert DriverVersion.parse("470.82").numbers == (470, 82)


def test_an_unknown_pool_and_a_version_outside_the_allowed_list_are_refused(make):
    fleet = _per_pool(make)
    assert "did you mean serving-a?" in refused("unknown-pool", lambda: upgrade_scope(fleet, "serving-b", version=NEW))
    reason = refused("version-not-allowed", lambda: upgrade_scope(fleet, "serving-a", version=NEW,
                                                                  allowed_versions=("580.95.05", "580.82.07")))
    assert reason.startswith(f"driver {NEW} is not in upgrades.allowed_versions (580.95.05 and 580.82.07)")


def test_host_drivers_and_two_driver_sources_in_the_pool_are_refused_by_name(make):
    host = make.node("s3", pool="serving-a", labels={"nvidia.com/gpu.deploy.driver": "pre-installed",
                                                     "nvidia.com/cuda.driver-version.full": "570.172.08"})
    both = make.node("s4", pool="serving-a", labels={"nvidia.com/cuda.driver-version.full": "570.172.08"})
    crashing = make.driver_pod("s4", waiting_reason="CrashLoopBackOff", restarts=12, ready=False,
                               last_terminated_reason="Error")
    fleet = _per_pool(make, extra_nodes=[host, both], extra_pods=[crashing])
    assert (fleet.nodes["s3"].driver.owner, fleet.nodes["s4"].driver.owner) == ("host", "conflict")
    reason = refused("not-operator-owned", lambda: upgrade_scope(fleet, "serving-a", version=NEW))
    assert "s3 (host driver) and s4 (two driver sources)" in reason
    assert "move them to the operator first" in reason


def test_an_nvidia_driver_that_also_drives_other_pools_is_refused_with_them_listed(make):
    nodes = [make.node("s1", pool="serving-a"), make.node("t1", pool="training-a")]
    pods = [p for n in nodes for p in _operands(make, n.name)]
    fleet = make.fleet(nodes, pods, policies=[make.cluster_policy(driver={"useNvidiaDriverCRD": True})],
                       nvidia_drivers=[make.nvidia_driver("everything", default=True)])
    reason = refused("shared-nvidiadriver", lambda: upgrade_scope(fleet, "serving-a", version=NEW))
    assert reason.startswith("NVIDIADriver everything also drives training-a: changing its version would upgrade "
                             "that pool too")


def test_a_cluster_policy_change_is_refused_unless_every_pool_it_reaches_is_named_or_the_scope_allows_it(make):
    fleet = _one_policy(make)
    reason = refused("shared-cluster-policy", lambda: upgrade_scope(fleet, "serving-a", version=NEW))
    assert reason.startswith("ClusterPolicy cluster-policy sets the driver of mig and training-a too")
    assert "their driver pods take it on their next restart (OnDelete)" in reason
    assert "at once" in refused("shared-cluster-policy", lambda: upgrade_scope(
        _one_policy(make, auto_upgrade=True), "serving-a", version=NEW))
    # Naming one of the two is not enough; naming both, or the configured scope, is.
    refused("shared-cluster-policy", lambda: upgrade_scope(fleet, "serving-a", version=NEW, named_pools=("mig",)))
    named = upgrade_scope(fleet, "serving-a", version=NEW, named_pools=("mig", "training-a"))
    scoped = upgrade_scope(fleet, "serving-a", version=NEW, cluster_policy_scope="all-pools")
    assert named.also_moves == scoped.also_moves == ("mig", "training-a")
    assert scoped.manager.ref == "ClusterPolicy cluster-policy"


def test_the_same_version_is_nothing_to_do_and_an_older_one_needs_consent(make):
    fleet = _per_pool(make)
    assert refused("same-version", lambda: upgrade_scope(fleet, "serving-a", version="580.95.05")).endswith(
        "nothing to do")
    reason = refused("downgrade", lambda: upgrade_scope(fleet, "serving-a", version="570.172.08"))
    assert reason.startswith("570.172.08 is older than 580.95.05: a downgrade is allowed only as a rollback")
    assert upgrade_scope(fleet, "serving-a", version="570.172.08", downgrade=True).downgrade


def test_the_canary_runs_the_fewest_gpu_pods_and_waves_respect_the_budget_left(make):
    nodes = [make.node(f"n{i}", pool="p") for i in range(1, 7)]
    nodes[5] = make.node("n6", pool="p", unschedulable=True)  # a human cordon: already out
    pods = [p for n in nodes for p in _operands(make, n.name)]
    pods += [make.pod(node=f"n{i}", namespace="work", gpu_requests={"nvidia.com/gpu": 8}) for i in (1, 2, 4, 5, 6)]
    fleet = make.fleet(nodes, pods)
    members = [fleet.nodes[n.name] for n in nodes]

    order = upgrade_order(members, pool=members, budget=MaxUnavailable.parse("50%"))
    assert order.canary == "n3"  # the only node without GPU pods
    # 50% of 6 is 3, one is out already: waves of two.
    assert order.waves == (("n1", "n2"), ("n4", "n5"), ("n6",))
    assert upgrade_order(members, pool=members, budget=MaxUnavailable.parse(1)).waves[0] == ("n1",)
    assert upgrade_order(members, pool=members, budget=MaxUnavailable.parse(1), canary="n5").canary == "n5"
    reason = refused("canary-not-in-scope", lambda: upgrade_order(members[:2], pool=members,
                                                                  budget=MaxUnavailable.parse(1), canary="n5"))
    assert reason == "the pool's canary node n5 is not among the nodes this upgrade changes (n1 and n2)"



def test_no_wave_takes_the_pool_below_its_ready_gpu_floor_and_a_node_that_alone_would_is_refused(make):
    nodes = [make.node(f"n{i}", pool="p") for i in range(1, 6)]
    fleet = make.fleet(nodes, [p for n in nodes for p in _operands(make, n.name)])
    members = [fleet.nodes[n.name] for n in nodes]  # 5 x 8 = 40 Ready GPUs

    # Budget 4 at once, but 40 - 3 x 8 = 16 < 24: waves of two.
    order = upgrade_order(members, pool=members, budget=MaxUnavailable.parse(4), min_ready_gpus=24)
    assert (order.canary, order.waves) == ("n1", (("n2", "n3"), ("n4", "n5")))
    reason = refused("min-ready-gpus", lambda: upgrade_order(members, pool=members, budget=MaxUnavailable.parse(1),
                                                             min_ready_gpus=36))
    assert reason.startswith("taking n1 out (8 Ready GPUs) would leave the pool 32 of its 40 Ready GPUs, "
                             "below its min_ready_gpus of 36")
