"""The fleet summary kept up to date node by node (`FleetIndex`, what the watch cache
uses so that `/gpu status` after one change costs what the change touched) says exactly
what a summary of the same nodes from scratch says, after any sequence of nodes coming,
changing and going, of the cluster-level context and the canary verdicts changing, at any
later time; and a node's findings that move with time (a node not Ready, its age) move
although nothing else changed."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from workflows.fleet.assessment import assess_node
from workflows.fleet.operator_settings import fleet_context
from workflows.fleet.pods import group_pods_by_node
from workflows.fleet.settings import InventorySettings
from workflows.fleet.canaries import CanaryVerdict
from workflows.fleet.findings import node_findings, node_findings_depend_on_time
from workflows.fleet.summary import FleetIndex, summarize
from workflows.kube.objects import NodeInfo, NodeName

NOW = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.timezone.utc)
SETTINGS = InventorySettings(pool_kinds={"serve-a": "serving", "train-a": "training"})
NAMES = [f"gpu-{i:02d}" for i in range(8)]
KERNEL = "5.15.0-1045-nvidia"
SHAPES = [
    dict(pool="train-a"),
    dict(pool="serve-a"),
    dict(pool=None),  # unpooled
    dict(pool="train-a", ready=False, ready_changed_at=NOW - dt.timedelta(minutes=7)),
    dict(pool="serve-a", labels={"nvidia.com/cuda.driver-version.full": "570.172.08"}),
    dict(pool="train-a", labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}),
    dict(pool="train-a", labels={"nvidia.com/gpu-driver-upgrade-state": "pod-restart-required"}),
    dict(pool="serve-a", labels={"nvidia.com/mig.config.state": "pending",
                                 "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change"}),
    dict(pool="train-a", allocatable={"nvidia.com/gpu": "6"}),
    dict(pool="serve-a", capacity={"nvidia.com/gpu": "4"}, allocatable={"nvidia.com/gpu": "4"}),
    dict(pool="train-a", labels={"nvidia.com/gpu.deploy.driver": "pre-installed"}),
    dict(pool="train-a", labels={"nvidia.com/gpu.present": None, "nvidia.com/gpu.count": None},
         capacity={"nvidia.com/gpu": None}, allocatable={"nvidia.com/gpu": None}),  # no GPU node
    # Cordoned by gpuops (its mark) and by hand; MIG slices under the mixed and the single strategy.
    dict(pool="serve-a", unschedulable=True, annotations={"gpuops.io/cordoned-by": json.dumps(
        {"by": "alice", "run": "run-7", "at": "2026-12-04T11:00:00Z"})}),
    dict(pool="train-a", unschedulable=True),
    dict(pool="serve-a", labels={"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.strategy": "mixed"},
         capacity={"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"},
         allocatable={"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"}),
    dict(pool="train-a", labels={"nvidia.com/mig.config": "all-1g.10gb"},
         capacity={"nvidia.com/gpu": "56"}, allocatable={"nvidia.com/gpu": "56"}),
]
# Kubelets inside and outside the operator's supported range, the runtimes the toolkit is
# read against, and kernels a precompiled driver is or is not built for.
INFOS = [NodeInfo(kubelet_version="v1.33.2", container_runtime_version="containerd://1.7.20", kernel_version=KERNEL),
         NodeInfo(kubelet_version="v1.31.4", container_runtime_version="cri-o://1.31.0",
                  kernel_version="6.8.0-1015-nvidia"),
         NodeInfo(kubelet_version="v1.34.1", container_runtime_version="containerd://2.0.4",
                  kernel_version="5.15.0-1050-nvidia")]
CONTEXTS = ("cluster-policy", "precompiled", "nvidia-driver-crds")


def snapshots(make) -> dict[str, object]:
    """The cluster as each context sees it: a ClusterPolicy whose driver DaemonSet moved on
    to another version (driver pods behind it), one not ready with precompiled drivers, and
    NVIDIADriver CRs (one for train-a not upgraded automatically, a default for the rest)."""
    policy = make.snapshot([], driver_templates=(make.driver_template(version="580.105.08", generation="2"),))
    precompiled = make.snapshot([], policies=(make.cluster_policy(
        driver={"enabled": True, "usePrecompiled": True, "version": "580"}, state="notReady"),))
    crds = make.snapshot([], policies=(make.cluster_policy(driver={"enabled": True, "useNvidiaDriverCRD": True}),),
                         nvidia_drivers=(make.nvidia_driver("train", node_selector={"gpuops.io/pool": "train-a"},
                                                            auto_upgrade=False),
                                         make.nvidia_driver("rest", default=True, version="570.172.08")))
    return {"cluster-policy": dataclasses.replace(policy, kubernetes_version="v1.33.1"),
            "precompiled": precompiled, "nvidia-driver-crds": crds}


def variants(make, name: str, kind: str) -> list:
    """Nodes `name` may be under the context `kind`, from healthy to sick, in different
    pools, drivers, runtimes, kubelets and states (with the pods it runs)."""
    found = []
    for index, shape in enumerate(SHAPES):
        node = dataclasses.replace(make.node(name, **{"labels": {}, **shape}), info=INFOS[index % len(INFOS)])
        pods = [] if shape.get("labels", {}).get("nvidia.com/gpu.deploy.driver") == "pre-installed" else \
            make.operands(name)
        if pods and kind == "precompiled":
            pods[0] = dataclasses.replace(pods[0], images=(f"nvcr.io/nvidia/driver:580-{KERNEL}-ubuntu22.04",))
        if index % 4 == 1:
            pods.append(make.workload(name, gpus=2))
        found.append((node, pods))
    return found


def aged(inv):
    """`inv` as the watch cache hands it over: its upgrade and MIG states aged from when
    gpuops first saw them (`workflows.fleet.first_seen`), here 20 minutes before NOW."""
    seen = NOW - dt.timedelta(minutes=20)
    return dataclasses.replace(inv, upgrade=dataclasses.replace(inv.upgrade, since=seen),
                               mig=dataclasses.replace(inv.mig, since=seen))


@pytest.fixture
def candidates(make):
    """Each context, and for each node name every inventory it may have (each shape
    assessed under each context, then those of the first context aged), in one list."""
    contexts = {kind: fleet_context(snapshot, settings=SETTINGS) for kind, snapshot in snapshots(make).items()}
    assessed = {}
    for name in NAMES:
        options = [assess_node(node, pods_on_node=group_pods_by_node(pods).get(name, ()), context=contexts[kind],
                               settings=SETTINGS, now=NOW)
                   for kind in CONTEXTS for node, pods in variants(make, name, kind)]
        assessed[name] = options + [aged(inv) for inv in options[:len(SHAPES)]]
    return [contexts[kind] for kind in CONTEXTS], assessed


def failed_canary(name: str) -> CanaryVerdict:
    return CanaryVerdict(node=NodeName(name), passed=False, at=NOW - dt.timedelta(hours=1), run_id="run-7f3a",
                         pod=f"gpuops/gpuops-check-{name}", exit_code=1, reason="Error")


def option(kind: str, shape: int) -> int:
    """Where a candidate is: the node of SHAPES[shape] assessed under the context `kind`."""
    return CONTEXTS.index(kind) * len(SHAPES) + shape


# Each step: a node, which candidate it becomes (-1: it goes), hours until the next look,
# the context of that look, and whether the node's last canary failed.
steps = st.lists(st.tuples(st.sampled_from(NAMES), st.integers(min_value=-1, max_value=len(SHAPES) * (len(CONTEXTS) + 1) - 1),
                           st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=len(CONTEXTS) - 1),
                           st.booleans()), min_size=1, max_size=40)
CRDS = CONTEXTS.index("nvidia-driver-crds")  # no pool finding lists the nodes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
# A node with a finding goes while its pool and the other findings stay as they were.
@example(steps=[("gpu-00", option("nvidia-driver-crds", 0), 0, CRDS, False),
                ("gpu-01", option("nvidia-driver-crds", 3), 0, CRDS, False), ("gpu-01", -1, 0, CRDS, False)])
# A node's failed canary is followed by none, the node unchanged.
@example(steps=[("gpu-00", option("nvidia-driver-crds", 0), 0, CRDS, True),
                ("gpu-00", option("nvidia-driver-crds", 0), 0, CRDS, False)])
def test_kept_up_to_date_it_says_what_a_summary_from_scratch_says(candidates, steps):
    contexts, assessed = candidates
    index = FleetIndex(SETTINGS, piece_size=2)  # several pieces of nodes, each shared and copied
    current = {}
    handed_out = []
    canaries: dict[NodeName, CanaryVerdict] = {}
    now = NOW
    for name, choice, hours_later, context_choice, canary_failed in steps:
        if choice < 0:
            current.pop(name, None)
            index.update(name, None)
        else:
            current[name] = assessed[name][choice]
            index.update(name, current[name])
        if canary_failed:
            canaries[NodeName(name)] = failed_canary(name)
        else:
            canaries.pop(NodeName(name), None)
        context = contexts[context_choice]  # the cluster-level objects changed, or not
        # Time goes on between looks; each look is also taken again an hour later.
        for later in (dt.timedelta(hours=hours_later), dt.timedelta(hours=1)):
            now += later
            fleet = index.fleet(now, context=context, canaries=canaries)
            assert fleet == summarize(current, context=context, settings=SETTINGS, now=now, canaries=canaries)
            assert list(fleet.nodes) == sorted(n for n, inv in current.items() if inv.gpu_node)
            handed_out.append((fleet, dict(fleet.nodes)))
            # What /gpu status reads from the pools' sums is what a walk of every node says.
            assert sorted(n.name for n in fleet.cordoned_nodes()) == sorted(
                n.name for n in fleet.nodes.values() if n.cordoned)
            assert sum(p.mig_slices_advertised for p in fleet.pools) == sum(
                n.mig_slices_advertised for n in fleet.nodes.values())
    # Views handed out earlier still say what they said when they were handed out.
    assert all(dict(fleet.nodes) == seen for fleet, seen in handed_out)


def test_a_node_not_ready_ages_between_two_looks_with_nothing_else_changed(candidates):
    (context, *_), assessed = candidates
    index = FleetIndex(SETTINGS)
    index.update("gpu-00", assessed["gpu-00"][3])  # not Ready since NOW - 7m

    first = index.fleet(NOW, context=context).findings_about("gpu-00")
    later = index.fleet(NOW + dt.timedelta(hours=2), context=context).findings_about("gpu-00")

    assert "for 7m" in first[0].message and "for 2h 7m" in later[0].message


def test_a_fleet_handed_out_does_not_change_when_the_index_does(candidates):
    (context, *_), assessed = candidates
    index = FleetIndex(SETTINGS)
    index.update("gpu-00", assessed["gpu-00"][0])
    before = index.fleet(NOW, context=context)
    seen = (dict(before.nodes), before.pools, before.findings)

    index.update("gpu-01", assessed["gpu-01"][8])
    index.update("gpu-00", None)
    index.fleet(NOW, context=context)

    assert (dict(before.nodes), before.pools, before.findings) == seen


@pytest.mark.parametrize("piece_size", [1, 2, 64])
def test_a_node_changed_in_place_leaves_the_views_handed_out_before_as_they_were(candidates, piece_size):
    (context, *_), assessed = candidates
    index = FleetIndex(SETTINGS, piece_size=piece_size)
    for name in ("gpu-00", "gpu-01", "gpu-02"):
        index.update(name, assessed[name][0])
    first = index.fleet(NOW, context=context)

    index.update("gpu-01", assessed["gpu-01"][8])  # the same node, another state: its place kept
    second = index.fleet(NOW, context=context)
    index.update("gpu-01", assessed["gpu-01"][0])
    index.update("gpu-02", assessed["gpu-02"][8])
    third = index.fleet(NOW, context=context)

    assert [v is assessed[n][0] for n, v in first.nodes.items()] == [True, True, True]
    assert second.nodes["gpu-01"] is assessed["gpu-01"][8] and second.nodes["gpu-02"] is assessed["gpu-02"][0]
    assert third.nodes["gpu-01"] is assessed["gpu-01"][0] and third.nodes["gpu-02"] is assessed["gpu-02"][8]
    assert list(third.nodes) == ["gpu-00", "gpu-01", "gpu-02"] and len(third.nodes) == 3
    assert "gpu-03" not in third.nodes and third.nodes.get("gpu-03") is None


def test_findings_said_not_to_depend_on_time_do_not(candidates):
    _, assessed = candidates
    timeless = [inv for options in assessed.values() for inv in options if not node_findings_depend_on_time(inv)]
    timed = [inv for options in assessed.values() for inv in options if node_findings_depend_on_time(inv)]
    assert timeless and timed  # both kinds are among the candidates

    for inv in timeless:
        assert node_findings(inv, settings=SETTINGS, now=NOW) == node_findings(
            inv, settings=SETTINGS, now=NOW + dt.timedelta(days=30))
    # Each kind said to depend on it does, once its state has a time: a node not Ready (its
    # age), an upgrade failed (its age) or under way (stuck), a MIG change paused for (stuck).
    moving = [inv for inv in timed if inv.ready is not True or inv.upgrade.since is not None]
    kinds = {kind for inv in moving for kind, holds in (("not ready", inv.ready is not True),
                                                       ("upgrade failed", inv.upgrade.failed),
                                                       ("upgrade under way", inv.upgrade.in_progress),
                                                       ("MIG change paused", inv.paused_for_mig_change)) if holds}
    assert kinds == {"not ready", "upgrade failed", "upgrade under way", "MIG change paused"}
    assert all(node_findings(inv, settings=SETTINGS, now=NOW) != node_findings(
        inv, settings=SETTINGS, now=NOW + dt.timedelta(days=30)) for inv in moving)
