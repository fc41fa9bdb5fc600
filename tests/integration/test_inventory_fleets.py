"""The fleet inventory on fleets built for one question each: driver-owner verdicts,
time-slicing, NVIDIADriver per pool, no operator, cloud node-group labels."""

from __future__ import annotations

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from testenv import fleet as fl

from tests.integration.inventory_helpers import CONFIG, _codes, _now, wait_fleet

# --- purpose-built fleets ------------------------------------------------------------------

OWNERS = fl.FleetSpec(
    name="owners", system_nodes=1,
    pools=(
        fl.PoolSpec(name="mixed", kind="training", nodes=4),
        fl.PoolSpec(name="sliced", kind="training", nodes=1, replicas=4),
        fl.PoolSpec(name="renamed", kind="training", nodes=1, replicas=2, rename_shared=True),
    ),
    special_nodes=(
        fl.SpecialNode(node="mixed-01", host_driver="570.172.08", driver_deploy="pre-installed"),
        fl.SpecialNode(node="mixed-02", host_driver="570.172.08"),
        fl.SpecialNode(node="mixed-03", driver_deploy="false"),
    ),
)


def test_driver_owner_verdicts_and_time_slicing_counts(fleet, fleet_cache):
    fleet(OWNERS)
    cache = fleet_cache()
    fleet_view = wait_fleet(cache, lambda f: len(f.nodes) == 6 and f.nodes["mixed-04"].advertised_gpus == 8
                            and f.nodes["sliced-01"].advertised_gpus == 32
                            and f.nodes["renamed-01"].advertised_gpus == 16, "the owners fleet to settle")

    owners = {name: fleet_view.nodes[name].driver.owner for name in ("mixed-01", "mixed-02", "mixed-03", "mixed-04")}
    assert owners == {"mixed-01": "host", "mixed-02": "conflict", "mixed-03": "none", "mixed-04": "operator"}
    missing = fleet_view.nodes["mixed-03"]
    assert missing.driver.evidence[-1] == "no driver pod, no pre-installed label and no driver version from GFD"
    assert missing.advertised_gpus == 0 and "advertised-mismatch" in _codes(fleet_view, "mixed-03")

    sliced = fleet_view.nodes["sliced-01"]
    assert (sliced.physical_gpus, sliced.expected_advertised, sliced.advertised_gpus) == (8, 32, 32)
    renamed = fleet_view.nodes["renamed-01"]
    assert [(r.resource, r.expected, r.capacity) for r in renamed.resources] == [("nvidia.com/gpu.shared", 16, 16)]
    assert "advertised-mismatch" not in _codes(fleet_view, "sliced-01") | _codes(fleet_view, "renamed-01")
    # The pools are not in the configuration, and nodes without the pool label are unpooled.
    assert fleet_view.pool("sliced").kind is None


PER_POOL_DRIVERS = fl.FleetSpec(
    name="nvidiadriver", system_nodes=1,
    operator=fl.OperatorSpec(
        use_nvidia_driver_crd=True, driver_follows_deploy_label=False,
        stand_in="a stale pre-installed label beside a running operator driver pod: the real driver "
                 "DaemonSet selects gpu.deploy.driver=true, so the DaemonSet controller removes the pod"),
    pools=(
        fl.PoolSpec(name="serving-a", kind="serving", nodes=2, driver_version="580.95.05", auto_upgrade=True),
        fl.PoolSpec(name="training-a", kind="training", nodes=2, driver_version="570.172.08", auto_upgrade=False),
    ),
    # pre-installed, but the operator's driver pod runs and is Ready: the label is stale.
    special_nodes=(fl.SpecialNode(node="training-a-02", driver_deploy="pre-installed"),),
)


def test_per_pool_nvidia_drivers_set_versions_and_auto_upgrade_per_pool(fleet, fleet_cache):
    fleet(PER_POOL_DRIVERS)
    cache = fleet_cache()
    view = wait_fleet(cache, lambda f: len(f.nodes) == 4 and all(n.advertised_gpus == 8 for n in f.nodes.values()),
                      "every node to advertise its GPUs")

    assert view.cluster.uses_nvidia_driver_crds
    serving, training = view.pool("serving-a"), view.pool("training-a")
    assert dict(serving.driver_versions) == {"580.95.05": 2}
    assert dict(training.driver_versions) == {"570.172.08": 2}
    assert (serving.auto_upgrade.state, serving.auto_upgrade.source) == ("on", "NVIDIADriver serving-a-driver")
    assert training.auto_upgrade.state == "off"
    assert "serving-auto-upgrade" in _codes(view, "serving-a")

    stale = view.nodes["training-a-02"]
    assert stale.driver.owner == "operator"
    assert any("stale" in e for e in stale.driver.evidence)
    assert any("NVIDIADriver training-a-driver" in e for e in stale.driver.evidence)


def test_a_cluster_without_the_gpu_operator_gets_a_clear_answer(fleet, fleet_cache):
    fleet(fl.FleetSpec(name="bare", system_nodes=0, operator=fl.OperatorSpec(installed=False),
                       pools=(fl.PoolSpec(name="plain", nodes=1),),
                       special_nodes=(fl.SpecialNode(node="plain-01", host_driver="570.172.08"),)),
          simulate=False, advertise=True)
    cache = fleet_cache()
    view = wait_fleet(cache, lambda f: "plain-01" in f.nodes, "the node to be seen")
    assert not view.cluster.operator_found
    assert "no-gpu-operator" in {f.code for f in view.findings}
    assert view.nodes["plain-01"].driver.owner == "host"
    text = render_text(dispatch("status", actor=CONFIG.actor("U0DAVE"), services=Services(config=CONFIG, fleet=cache),
                                now=_now()))
    assert "No GPU Operator found" in text


def test_a_cloud_node_group_label_names_the_pools(fleet, fleet_cache):
    key = "cloud.google.com/gke-nodepool"
    fleet(fl.FleetSpec(name="gke", system_nodes=0, pools=(fl.PoolSpec(name="a3-highgpu", nodes=2, label_key=key),)),
          simulate=False, advertise=True)
    config = CONFIG.model_copy(update={"cluster": CONFIG.cluster.model_copy(update={"pool_label": key})})
    view = wait_fleet(fleet_cache(config=config), lambda f: len(f.nodes) == 2, "both nodes")
    assert [p.name for p in view.pools] == ["a3-highgpu"]
    default = wait_fleet(fleet_cache(), lambda f: len(f.nodes) == 2, "both nodes")
    assert [p.name for p in default.pools] == ["unpooled"]
    assert "unpooled-nodes" in {f.code for f in default.findings}
