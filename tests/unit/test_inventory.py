"""The fleet inventory: per node, per pool and per cluster, from plain snapshot values (who
owns the driver: test_driver_owner.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest

from workflows.fleet.assessment import assess_node
from workflows.fleet.operator_settings import fleet_context
from workflows.fleet.pods import group_pods_by_node, image_tag
from workflows.fleet.settings import InventorySettings
from workflows.fleet.summary import build_fleet, summarize
from workflows.kube.objects import NodeName

# ------------------------------------------------------------------ GPU counts


def test_a_plain_node_expects_its_physical_gpus_to_be_advertised(make):
    node = make.node(gpus=8)

    inv = make.assess(node)

    assert inv.physical_gpus == 8
    assert inv.expected_advertised == 8
    assert inv.advertised_gpus == 8
    assert inv.allocatable_gpus == 8
    assert [r.resource for r in inv.resources] == ["nvidia.com/gpu"]


def test_time_slicing_expects_each_gpu_times_its_replicas_while_physical_stays_the_same(make):
    node = make.node(
        gpus=4,
        labels={"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
        capacity={"nvidia.com/gpu": "16"},
    )

    inv = make.assess(node)

    assert inv.physical_gpus == 4
    assert inv.replicas == 4
    assert inv.sharing_strategy == "time-slicing"
    assert inv.expected_advertised == 16
    assert inv.advertised_gpus == 16


def test_time_slicing_with_the_renamed_shared_resource_is_compared_on_nvidia_gpu_shared(make):
    node = make.node(
        gpus=2,
        labels={"nvidia.com/gpu.replicas": "5", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
        capacity={"nvidia.com/gpu": None, "nvidia.com/gpu.shared": "10"},
    )

    inv = make.assess(node)

    (shared,) = inv.resources
    assert shared.resource == "nvidia.com/gpu.shared"
    assert (shared.expected, shared.capacity) == (10, 10)
    assert inv.physical_gpus == 2


def test_mixed_mig_compares_each_profile_count_with_its_own_resource(make):
    node = make.node(
        gpus=2,
        labels={
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config": "all-balanced",
            "nvidia.com/mig-1g.10gb.count": "4",
            "nvidia.com/mig-3g.40gb.count": "2",
        },
        capacity={
            "nvidia.com/gpu": None,
            "nvidia.com/mig-1g.10gb": "4",
            "nvidia.com/mig-3g.40gb": "1",
        },
    )

    inv = make.assess(node)

    by_resource = {r.resource: (r.expected, r.capacity) for r in inv.resources}
    assert by_resource == {
        "nvidia.com/mig-1g.10gb": (4, 4),
        "nvidia.com/mig-3g.40gb": (2, 1),
    }
    assert inv.physical_gpus == 2
    assert inv.expected_advertised == 6
    assert inv.advertised_gpus == 5


def test_single_mig_counts_mig_devices_on_nvidia_gpu_and_leaves_physical_gpus_unknown(make):
    node = make.node(
        gpus=14,
        labels={
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
            "nvidia.com/mig.config": "all-1g.10gb",
        },
        capacity={"nvidia.com/gpu": "14"},
    )

    inv = make.assess(node)

    assert inv.physical_gpus is None
    assert inv.expected_advertised == 14
    assert inv.advertised_gpus == 14
    assert inv.mig.strategy == "single" and inv.mig.config == "all-1g.10gb"


def test_a_node_without_gfd_labels_has_no_expectation_to_compare_against(make):
    node = make.node(labels={"nvidia.com/gpu.count": None}, capacity={"nvidia.com/gpu": "8"})

    inv = make.assess(node)

    assert inv.physical_gpus is None
    assert inv.expected_advertised is None
    assert inv.advertised_gpus == 8


def test_only_pods_that_still_hold_gpus_count_as_requested(make):
    node = make.node()
    pods = make.operands(node.name) + [
        make.workload(node.name, gpus=2),
        make.workload(node.name, gpus=1, phase="Pending", ready=False),
        make.workload(node.name, gpus=4, phase="Succeeded", ready=False),
        make.workload(node.name, gpus=4, phase="Failed", ready=False),
        make.workload(node.name, gpus=4, deleting=True),
    ]

    inv = make.assess(node, pods)

    assert inv.requested_gpus == 3
    assert inv.resources[0].requested == 3


@pytest.mark.parametrize(
    ("labels", "version"),
    [
        (
            {
                "nvidia.com/cuda.driver-version.full": None,
                "nvidia.com/cuda.driver-version.major": "570",
                "nvidia.com/cuda.driver-version.minor": "172",
                "nvidia.com/cuda.driver-version.revision": "08",
            },
            "570.172.08",
        ),
        (
            {
                "nvidia.com/cuda.driver-version.full": None,
                "nvidia.com/cuda.driver.major": "535",
                "nvidia.com/cuda.driver.minor": "183",
                "nvidia.com/cuda.driver.rev": "01",
            },
            "535.183.01",
        ),
    ],
)
def test_the_driver_version_is_assembled_from_gfd_parts_when_the_full_label_is_missing(
    make, labels, version
):
    assert make.assess(make.node(labels=labels)).driver_version == version


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("nvcr.io/nvidia/driver:580.95.05-ubuntu22.04", "580.95.05-ubuntu22.04"),
        ("registry.local:5000/nvidia/driver:570.172.08", "570.172.08"),
        ("registry.local:5000/nvidia/driver:570.172.08@sha256:abcd", "570.172.08"),
        ("registry.local:5000/nvidia/driver", None),
    ],
)
def test_image_tags_ignore_registry_ports_and_digests(image, tag):
    assert image_tag(image) == tag


# ------------------------------------------------------------------ node state


def test_a_node_cordoned_by_gpuops_shows_who_and_which_run(make):
    mark = {"run": "run-42", "by": "U123ALICE", "prior_unschedulable": False, "at": "2025-06-07T10:00:00Z"}
    node = make.node(unschedulable=True, annotations={"gpuops.io/cordoned-by": json.dumps(mark)})

    inv = make.assess(node)

    assert inv.cordoned is True
    assert (inv.cordoned_by, inv.cordon_run) == ("U123ALICE", "run-42")


def test_a_node_cordoned_by_hand_or_with_an_unreadable_mark_has_no_cordoner(make):
    by_hand = make.assess(make.node("a", unschedulable=True))
    garbled = make.assess(
        make.node("b", unschedulable=True, annotations={"gpuops.io/cordoned-by": "{not json"})
    )
    leftover = make.assess(
        make.node("c", annotations={"gpuops.io/cordoned-by": json.dumps({"by": "U1", "run": "r"})})
    )

    assert (by_hand.cordoned, by_hand.cordoned_by) == (True, None)
    assert (garbled.cordoned_by, garbled.cordon_run) == (None, None)
    assert (leftover.cordoned, leftover.cordoned_by) == (False, None)


def test_the_upgrade_state_and_when_it_began_come_from_the_node(make):
    node = make.node(
        labels={"nvidia.com/gpu-driver-upgrade-state": "drain-required"},
        annotations={"gpuops.io/upgrade-state-since": "2025-06-07T09:30:00Z"},
    )

    inv = make.assess(node)

    assert inv.upgrade.state == "drain-required"
    assert inv.upgrade.age(make.now) == dt.timedelta(hours=2, minutes=30)


def test_without_a_recorded_start_the_controllers_wait_for_jobs_start_time_is_used(make):
    started = make.now - dt.timedelta(hours=3)
    node = make.node(
        labels={"nvidia.com/gpu-driver-upgrade-state": "wait-for-jobs-required"},
        annotations={
            "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time": str(int(started.timestamp()))
        },
    )

    assert make.assess(node).upgrade.since == started


def test_an_upgrade_state_without_any_start_time_has_an_unknown_age(make):
    node = make.node(labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"})

    inv = make.assess(node)

    assert inv.upgrade.in_progress is True
    assert inv.upgrade.age(make.now) is None


def test_operands_paused_by_the_operator_are_listed_and_others_are_not(make):
    node = make.node(
        labels={
            "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change",
            "nvidia.com/gpu.deploy.dcgm-exporter": "paused-for-mig-change",
            "nvidia.com/gpu.deploy.driver": "true",
            "nvidia.com/gpu.deploy.mig-manager": "false",
        }
    )

    inv = make.assess(node)

    assert dict(inv.paused_operands) == {
        "device-plugin": "paused-for-mig-change",
        "dcgm-exporter": "paused-for-mig-change",
    }
    assert inv.paused_for_mig_change is True


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda p: p, "Running, Ready"),
        (lambda p: {**p, "ready": False}, "Running, not Ready"),
        (
            lambda p: {**p, "ready": False, "restarts": 12, "waiting_reason": "CrashLoopBackOff"},
            "CrashLoopBackOff (12 restarts)",
        ),
        (
            lambda p: {**p, "phase": "Pending", "ready": False, "waiting_reason": "ImagePullBackOff"},
            "ImagePullBackOff (0 restarts)",
        ),
        (lambda p: {**p, "deleting": True}, "Terminating"),
    ],
)
def test_operand_pods_read_in_one_line_as_kubectl_would_describe_them(make, build, expected):
    node = make.node()
    device_plugin = make.device_plugin_pod(node.name, **build({}))

    inv = make.assess(node, [make.driver_pod(node.name), device_plugin])

    assert inv.device_plugin_pod.text == expected
    assert inv.validator_pod.text == "missing"


def test_nodes_without_any_gpu_signal_are_left_out_of_the_fleet(make):
    labelled = make.node("by-label", labels={"nvidia.com/gpu.count": None}, capacity={"nvidia.com/gpu": None})
    counted = make.node(
        "by-count", labels={"nvidia.com/gpu.present": None}, capacity={"nvidia.com/gpu": None}
    )
    advertised = make.node(
        "by-capacity",
        labels={"nvidia.com/gpu.present": None, "nvidia.com/gpu.count": None},
        capacity={"nvidia.com/gpu": "0"},
    )

    fleet = make.fleet([labelled, counted, advertised, make.cpu_node("cpu-01")])

    assert sorted(fleet.nodes) == ["by-capacity", "by-count", "by-label"]


# ------------------------------------------------------------------ pools


def test_pools_are_sorted_by_name_with_unpooled_nodes_last(make):
    nodes = [
        make.node("a", pool=None),
        make.node("b", pool="zeta"),
        make.node("c", pool="alpha"),
    ]

    fleet = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)])

    assert [p.name for p in fleet.pools] == ["alpha", "zeta", "unpooled"]
    assert fleet.nodes[NodeName("a")].pool == "unpooled"


def test_a_pool_adds_up_its_nodes_gpus_and_readiness(make):
    nodes = [
        make.node("gpu-1", gpus=8),
        make.node("gpu-2", gpus=8, ready=False, allocatable={"nvidia.com/gpu": "7"}),
    ]
    pods = make.operands("gpu-1") + make.operands("gpu-2") + [make.workload("gpu-1", gpus=6)]

    (pool,) = make.fleet(nodes, pods).pools

    assert pool.nodes == ("gpu-1", "gpu-2")
    assert (pool.nodes_ready, pool.nodes_total) == (1, 2)
    assert (pool.gpus_physical, pool.gpus_expected, pool.gpus_advertised) == (16, 16, 16)
    assert pool.gpus_allocatable == 15
    assert pool.gpus_requested == 6
    assert dict(pool.driver_versions) == {"580.95.05": 2}
    assert pool.mixed_driver_versions is False


def test_a_pool_with_two_driver_versions_is_flagged_as_mixed(make):
    nodes = [
        make.node("gpu-1"),
        make.node("gpu-2", labels={"nvidia.com/cuda.driver-version.full": "570.172.08"}),
        make.node("gpu-3", labels={"nvidia.com/cuda.driver-version.full": "570.172.08"}),
    ]

    (pool,) = make.fleet(nodes, [p for n in nodes for p in make.operands(n.name)]).pools

    assert dict(pool.driver_versions) == {"570.172.08": 2, "580.95.05": 1}
    assert pool.mixed_driver_versions is True


def test_a_cloud_node_group_label_can_name_the_pools(make):
    key = "cloud.google.com/gke-nodepool"
    settings = InventorySettings(pool_label_key=key, pool_kinds={"a3-serving": "serving"})
    nodes = [
        make.node("gke-1", pool="a3-serving", pool_label_key=key),
        make.node("gke-2", pool="a3-serving", pool_label_key=key),
    ]

    fleet = make.fleet(nodes, settings=settings)

    (pool,) = fleet.pools
    assert (pool.name, pool.kind, pool.nodes_total) == ("a3-serving", "serving", 2)


def test_a_pool_kind_comes_from_settings_and_an_unlisted_pool_has_none(make):
    settings = InventorySettings(pool_kinds={"serving-a": "serving", "train-a": "training"})
    nodes = [make.node("a", pool="serving-a"), make.node("b", pool="train-a"), make.node("c", pool="lab")]

    fleet = make.fleet(nodes, settings=settings)

    assert {p.name: p.kind for p in fleet.pools} == {
        "lab": None,
        "serving-a": "serving",
        "train-a": "training",
    }


# ------------------------------------------------------------------ auto-upgrade


@pytest.mark.parametrize(
    ("upgrade_policy", "state", "defaulted"),
    [
        ({"autoUpgrade": True}, "on", False),
        ({"autoUpgrade": False}, "off", False),
        ({"maxParallelUpgrades": 2}, "off", True),
        (None, "off", True),
    ],
)
def test_the_cluster_policy_decides_auto_upgrade_and_defaults_to_off(
    make, upgrade_policy, state, defaulted
):
    driver: dict[str, object] = {"enabled": True}
    if upgrade_policy is not None:
        driver["upgradePolicy"] = upgrade_policy

    (pool,) = make.fleet([make.node()], policies=[make.cluster_policy(driver=driver)]).pools

    assert pool.auto_upgrade.state == state
    assert pool.auto_upgrade.defaulted is defaulted
    assert pool.auto_upgrade.source == "ClusterPolicy cluster-policy"


def test_with_sandbox_workloads_on_the_operator_upgrades_no_driver_whatever_auto_upgrade_says(make):
    # Its upgrade controller removes every upgrade-state label and returns (v26.7).
    policy = make.cluster_policy(driver={"upgradePolicy": {"autoUpgrade": True}})
    sandboxed = dataclasses.replace(policy, spec={**policy.spec, "sandboxWorkloads": {"enabled": True}})
    off = dataclasses.replace(policy, spec={**policy.spec, "sandboxWorkloads": {"enabled": False}})

    (pool,) = make.fleet([make.node()], policies=[sandboxed]).pools
    assert pool.auto_upgrade.state == "off"
    assert "sandboxWorkloads.enabled" in pool.auto_upgrade.source
    (pool,) = make.fleet([make.node()], policies=[off]).pools
    assert (pool.auto_upgrade.state, pool.auto_upgrade.source) == ("on", "ClusterPolicy cluster-policy")


def test_with_nvidia_driver_crs_each_pool_gets_the_auto_upgrade_of_its_own_driver(make):
    policy = make.cluster_policy(
        driver={"useNvidiaDriverCRD": True, "upgradePolicy": {"autoUpgrade": True}}
    )
    nodes = [
        make.node("s-1", pool="serving-a"),
        make.node("t-1", pool="train-a"),
        make.node("l-1", pool="lab"),
    ]

    fleet = make.fleet(
        nodes,
        policies=[policy],
        nvidia_drivers=[
            make.nvidia_driver("h100-driver", node_selector={"gpuops.io/pool": "serving-a"}, auto_upgrade=False),
            make.nvidia_driver("train-driver", node_selector={"gpuops.io/pool": "train-a"}),
        ],
    )

    serving, lab, train = (fleet.pool("serving-a"), fleet.pool("lab"), fleet.pool("train-a"))
    assert (serving.auto_upgrade.state, serving.auto_upgrade.source) == ("off", "NVIDIADriver h100-driver")
    # Unset on the CR: the v26.7 NVIDIADriver CRD defaults it to true.
    assert (train.auto_upgrade.state, train.auto_upgrade.defaulted) == ("on", True)
    assert train.auto_upgrade.source == "NVIDIADriver train-driver"
    assert lab.auto_upgrade.state == "unknown"
    assert lab.auto_upgrade.source == "no NVIDIADriver selects this pool's nodes"


def test_a_pool_split_across_nvidia_drivers_shows_auto_upgrade_on_if_any_driver_upgrades(make):
    policy = make.cluster_policy(driver={"useNvidiaDriverCRD": True})
    nodes = [
        make.node("a", pool="mixed", labels={"gen": "h100"}),
        make.node("b", pool="mixed", labels={"gen": "a100"}),
    ]

    (pool,) = make.fleet(
        nodes,
        policies=[policy],
        nvidia_drivers=[
            make.nvidia_driver("h100", node_selector={"gen": "h100"}, auto_upgrade=False),
            make.nvidia_driver("a100", node_selector={"gen": "a100"}, auto_upgrade=True),
        ],
    ).pools

    assert pool.auto_upgrade.state == "on"
    assert pool.auto_upgrade.source == "NVIDIADriver a100 (on), NVIDIADriver h100 (off)"


def test_without_a_cluster_policy_auto_upgrade_is_unknown(make):
    (pool,) = make.fleet([make.node()], policies=[]).pools

    assert (pool.auto_upgrade.state, pool.auto_upgrade.source) == ("unknown", "no ClusterPolicy")


# ------------------------------------------------------------------ cluster


def test_cluster_info_names_the_operator_version_and_the_cluster_policy_in_effect(make):
    policy = make.cluster_policy(annotations={"gpuops.io/owner": "#gpu-platform"})

    cluster = make.fleet([make.node()], policies=[policy], operator_version="v25.10.1").cluster

    assert cluster.operator_found is True
    assert cluster.operator_version == "v25.10.1"
    assert cluster.operator_namespace == "gpu-operator"
    assert (cluster.cluster_policy, cluster.cluster_policy_state) == ("cluster-policy", "ready")
    assert cluster.cluster_policy_owner == "#gpu-platform"
    assert cluster.duplicate_cluster_policies == ()
    assert cluster.uses_nvidia_driver_crds is False


def test_the_configured_cluster_policy_owner_wins_over_the_annotation(make):
    settings = InventorySettings(cluster_policy_owner="@platform-oncall")
    policy = make.cluster_policy(annotations={"gpuops.io/owner": "#someone-else"})

    cluster = make.fleet([make.node()], policies=[policy], settings=settings).cluster

    assert cluster.cluster_policy_owner == "@platform-oncall"


def test_the_operator_keeps_one_cluster_policy_and_the_others_are_duplicates(make):
    first = make.cluster_policy("cluster-policy", created_at=make.now - dt.timedelta(days=90))
    second = make.cluster_policy("gpu-cluster-policy", state="ignored", created_at=make.now - dt.timedelta(days=99))
    third = make.cluster_policy("copy", state=None, created_at=make.now - dt.timedelta(days=1))

    cluster = make.fleet([make.node()], policies=[second, third, first]).cluster

    assert cluster.cluster_policy == "cluster-policy"
    assert cluster.duplicate_cluster_policies == ("copy", "gpu-cluster-policy")


def test_a_cluster_without_the_gpu_operator_is_described_rather_than_failing(make):
    fleet = make.fleet([make.node()], [], operator=False, crds=False)

    assert fleet.cluster.operator_found is False
    assert fleet.cluster.crds_installed is False
    assert fleet.cluster.operator_version is None
    assert fleet.cluster.cluster_policy is None
    assert list(fleet.nodes) == ["gpu-h100-01"]


# ------------------------------------------------------------------ incremental use


def test_reassessing_only_the_changed_node_gives_the_same_fleet_as_a_full_build(make):
    settings = InventorySettings(pool_kinds={"serving-a": "serving"})
    nodes = [make.node(f"gpu-{i}", pool="serving-a" if i % 2 else "train-a") for i in range(6)]
    pods = [p for n in nodes for p in make.operands(n.name)]
    before = make.snapshot(nodes, pods)
    context = fleet_context(before, settings=settings)
    by_node = group_pods_by_node(before.pods)
    cached = {
        n.name: assess_node(n, pods_on_node=by_node.get(n.name, ()), context=context, settings=settings, now=make.now)
        for n in nodes
    }

    changed = make.node("gpu-3", pool="serving-a", allocatable={"nvidia.com/gpu": "6"}, ready=False)
    after = make.snapshot([changed if n.name == "gpu-3" else n for n in nodes], pods)
    cached[changed.name] = assess_node(
        changed, pods_on_node=by_node[changed.name], context=context, settings=settings, now=make.now
    )

    incremental = summarize(cached, context=context, settings=settings, now=make.now)
    full = build_fleet(after, settings=settings, now=make.now)

    assert incremental == full
    assert {f.code for f in full.findings_about("gpu-3")} == {"node-not-ready", "unhealthy-gpus"}
