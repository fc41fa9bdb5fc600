"""The fleet summary kept up to date node by node (`FleetIndex`, what the watch cache
uses so that `/gpu status` after one change costs what the change touched) says exactly
what a summary of the same nodes from scratch says, after any sequence of nodes coming,
changing and going, at any later time; and a node's findings that move with time (a
node not Ready, its age) move although nothing else changed."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workflows.fleet.assessment import InventorySettings, assess_node, fleet_context, group_pods_by_node
from workflows.fleet.findings import node_findings, node_findings_depend_on_time
from workflows.fleet.summary import FleetIndex, summarize
from workflows.kube.objects import NodeInfo

NOW = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.timezone.utc)
SETTINGS = InventorySettings(pool_kinds={"serve-a": "serving", "train-a": "training"})
NAMES = [f"gpu-{i:02d}" for i in range(8)]


def variants(make, name: str) -> list:
    """Nodes `name` may be, from healthy to sick, in different pools, drivers, runtimes,
    kubelets and states (with the pods it runs)."""
    base = dict(labels={})
    shapes = [
        dict(pool="train-a"),
        dict(pool="serve-a"),
        dict(pool=None),  # unpooled
        dict(pool="train-a", ready=False, ready_changed_at=NOW - dt.timedelta(minutes=7)),
        dict(pool="serve-a", labels={"nvidia.com/cuda.driver-version.full": "570.172.08"}),
        dict(pool="train-a", labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}),
        dict(pool="train-a", labels={"nvidia.com/gpu-driver-upgrade-state": "pod-restart-required"}),
        dict(pool="serve-a", labels={"nvidia.com/mig.config.state": "pending"}),
        dict(pool="train-a", allocatable={"nvidia.com/gpu": "6"}),
        dict(pool="serve-a", capacity={"nvidia.com/gpu": "4"}, allocatable={"nvidia.com/gpu": "4"}),
        dict(pool="train-a", labels={"nvidia.com/gpu.deploy.driver": "pre-installed"}),
        dict(pool="train-a", labels={"nvidia.com/gpu.present": None, "nvidia.com/gpu.count": None},
             capacity={"nvidia.com/gpu": None}, allocatable={"nvidia.com/gpu": None}),  # no GPU node
    ]
    infos = [NodeInfo(kubelet_version="v1.33.2", container_runtime_version="containerd://1.7.20",
                      kernel_version="5.15.0-1045-nvidia"),
             NodeInfo(kubelet_version="v1.31.4", container_runtime_version="cri-o://1.31.0",
                      kernel_version="6.8.0-1015-nvidia")]
    found = []
    for index, shape in enumerate(shapes):
        node = make.node(name, **{**base, **shape})
        node = dataclasses.replace(node, info=infos[index % 2])
        pods = [] if shape.get("labels", {}).get("nvidia.com/gpu.deploy.driver") == "pre-installed" else \
            make.operands(name)
        found.append((node, pods))
    return found


@pytest.fixture(scope="module")
def candidates():
    from tests.unit.conftest import FleetBuilder

    make = FleetBuilder()
    every = {name: variants(make, name) for name in NAMES}
    nodes = [node for options in every.values() for node, _ in options[:1]]
    pods = [pod for options in every.values() for _, node_pods in options[:1] for pod in node_pods]
    context = fleet_context(make.snapshot(nodes, pods), settings=SETTINGS)
    assessed = {name: [assess_node(node, pods_on_node=group_pods_by_node(node_pods).get(name, ()), context=context,
                                   settings=SETTINGS, now=NOW) for node, node_pods in options]
                for name, options in every.items()}
    return context, assessed


steps = st.lists(st.tuples(st.sampled_from(NAMES), st.integers(min_value=-1, max_value=11),
                           st.integers(min_value=0, max_value=3)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_kept_up_to_date_it_says_what_a_summary_from_scratch_says(candidates, steps):
    context, assessed = candidates
    index = FleetIndex(SETTINGS)
    current = {}
    now = NOW
    for name, choice, hours_later in steps:
        if choice < 0:
            current.pop(name, None)
            index.update(name, None)
        else:
            current[name] = assessed[name][choice]
            index.update(name, current[name])
        now += dt.timedelta(hours=hours_later)  # time goes on between looks
        assert index.fleet(now, context=context) == summarize(current, context=context, settings=SETTINGS, now=now)


def test_a_node_not_ready_ages_between_two_looks_with_nothing_else_changed(candidates):
    context, assessed = candidates
    index = FleetIndex(SETTINGS)
    index.update("gpu-00", assessed["gpu-00"][3])  # not Ready since NOW - 7m

    first = index.fleet(NOW, context=context).findings_about("gpu-00")
    later = index.fleet(NOW + dt.timedelta(hours=2), context=context).findings_about("gpu-00")

    assert "for 7m" in first[0].message and "for 2h 7m" in later[0].message


def test_a_fleet_handed_out_does_not_change_when_the_index_does(candidates):
    context, assessed = candidates
    index = FleetIndex(SETTINGS)
    index.update("gpu-00", assessed["gpu-00"][0])
    before = index.fleet(NOW, context=context)
    seen = (dict(before.nodes), before.pools, before.findings)

    index.update("gpu-01", assessed["gpu-01"][8])
    index.update("gpu-00", None)
    index.fleet(NOW, context=context)

    assert (dict(before.nodes), before.pools, before.findings) == seen


def test_findings_said_not_to_depend_on_time_do_not(candidates):
    _, assessed = candidates
    timeless = [inv for options in assessed.values() for inv in options if not node_findings_depend_on_time(inv)]
    timed = [inv for options in assessed.values() for inv in options if node_findings_depend_on_time(inv)]
    assert timeless and timed  # both kinds are among the candidates

    for inv in timeless:
        assert node_findings(inv, settings=SETTINGS, now=NOW) == node_findings(
            inv, settings=SETTINGS, now=NOW + dt.timedelta(days=30))
    # A node not Ready is among those said to depend on it, and does (its age).
    not_ready = [inv for inv in timed if inv.ready is not True]
    assert not_ready and all(node_findings(inv, settings=SETTINGS, now=NOW) != node_findings(
        inv, settings=SETTINGS, now=NOW + dt.timedelta(days=30)) for inv in not_ready)
