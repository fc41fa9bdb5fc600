"""The real NVIDIA GPU Operator (built from its vendored source, testenv/operator.py) runs
the fleets: given a ClusterPolicy and kwok nodes labelled as Node Feature Discovery
labels GPU nodes, it labels the nodes for its operands, creates the ClusterPolicy's
DaemonSets and the mig-parted ConfigMap, and reports the policy ready once the
simulator has played the operand containers; its upgrade controller upgrades nodes
itself with autoUpgrade on. gpuops's inventory reads what it made, including driver pods
left behind a changed DaemonSet with autoUpgrade off."""

from __future__ import annotations

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from testenv import fleet as fl
from testenv import operator
from testenv.install import wait_until
from tests.integration import observe
from tests.integration.inventory_helpers import CONFIG, _codes, _now, wait_fleet


REAL = fl.FleetSpec(
    name="real", system_nodes=0,
    pools=(
        fl.PoolSpec(name="train", nodes=2, product="NVIDIA-H100-80GB-HBM3"),
        fl.PoolSpec(name="infer", nodes=1, product="NVIDIA-A100-SXM4-80GB", mig_config="all-balanced"),
    ),
    special_nodes=(fl.SpecialNode(node="train-02", host_driver="570.172.08", driver_deploy="pre-installed"),),
)
NEW_DRIVER = "580.105.08"


def _policy(installer) -> dict:
    return installer.get({"kind": "ClusterPolicy", "metadata": {"name": REAL.operator.cluster_policy_name}})


def test_the_real_operator_labels_the_gpu_nodes_and_runs_its_operands_on_them(fleet, cluster):
    fleet(REAL)
    installer = cluster.installer()
    wait_until(lambda: (_policy(installer).get("status") or {}).get("state") == "ready", timeout=120,
               what="the operator to report its ClusterPolicy ready")

    train = observe.node(installer, "train-01")["metadata"]["labels"]
    infer = observe.node(installer, "infer-01")["metadata"]["labels"]
    # The operator's labels: the nodes were created with NFD's and GFD's only.
    assert train["nvidia.com/gpu.present"] == infer["nvidia.com/gpu.present"] == "true"
    assert all(train[f"nvidia.com/gpu.deploy.{o}"] == "true"
               for o in ("driver", "container-toolkit", "device-plugin", "gpu-feature-discovery", "operator-validator"))
    # The MIG manager only where GFD says the GPUs can do MIG.
    assert infer["nvidia.com/gpu.deploy.mig-manager"] == "true"
    assert train.get("nvidia.com/gpu.deploy.mig-manager") != "true"
    # The sticky mark the driver manager left on the host-driver node is kept.
    assert observe.node(installer, "train-02")["metadata"]["labels"]["nvidia.com/gpu.deploy.driver"] == "pre-installed"

    # The DaemonSets are the operator's, from its own manifests, owned by the policy.
    daemonsets = {d["metadata"]["name"]: d for d in installer.list("DaemonSet", namespace=operator.NAMESPACE)}
    driver = daemonsets["nvidia-driver-daemonset"]
    assert driver["metadata"]["ownerReferences"][0]["kind"] == "ClusterPolicy"
    template = driver["spec"]["template"]["spec"]
    assert [c["name"] for c in template["initContainers"]][0] == "k8s-driver-manager"
    (ctr,) = [c for c in template["containers"] if c["name"] == "nvidia-driver-ctr"]
    assert ctr["image"] == f"nvcr.io/nvidia/driver:{REAL.operator.driver_version}-ubuntu22.04"
    assert driver["spec"]["updateStrategy"]["type"] == "OnDelete"
    assert {"nvidia-device-plugin-daemonset", "gpu-feature-discovery", "nvidia-operator-validator",
            "nvidia-mig-manager"} <= set(daemonsets)

    # Driver pods where the operator's driver is wanted, none on the host-driver node.
    assert len(observe.operand_pods(installer, "train-01", "nvidia-driver-daemonset")) == 1
    assert observe.operand_pods(installer, "train-02", "nvidia-driver-daemonset") == []


def test_the_operators_mig_parted_config_decides_the_mig_devices_a_node_advertises(fleet, cluster):
    fleet(REAL)
    installer = cluster.installer()
    # all-balanced on an A100-SXM4-80GB is, per GPU, 2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb
    # in the operator's default-mig-parted-config (a device-filter entry for its PCI id).
    wait_until(lambda: observe.node(installer, "infer-01")["status"]["capacity"].get("nvidia.com/mig-3g.40gb") == "8",
               timeout=120, what="infer-01 to advertise its all-balanced MIG devices")
    config = installer.get({"kind": "ConfigMap", "metadata": {"name": fl.MIG_PARTED_CONFIGMAP,
                                                               "namespace": operator.NAMESPACE}})
    assert config["metadata"]["ownerReferences"][0]["kind"] == "ClusterPolicy"  # the operator made it
    capacity = observe.node(installer, "infer-01")["status"]["capacity"]
    assert {k: capacity[k] for k in capacity if k.startswith("nvidia.com/")} == {
        "nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8", "nvidia.com/mig-3g.40gb": "8"}

    # A layout whose profile this GPU cannot make (1g.18gb is an H200's) fails, as
    # mig-parted does on the hardware, and the node keeps the layout it had.
    installer.call("PATCH", "/api/v1/nodes/infer-01", content_type="application/merge-patch+json",
                   body={"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.18gb"}}})
    wait_until(lambda: observe.node(installer, "infer-01")["metadata"]["labels"].get("nvidia.com/mig.config.state")
               == "failed", timeout=60, what="the impossible MIG layout to fail")
    wait_until(lambda: observe.node(installer, "infer-01")["status"]["capacity"].get("nvidia.com/mig-3g.40gb") == "8",
               timeout=60, what="infer-01 to advertise its old layout again")
    assert observe.node(installer, "infer-01")["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "true"


def test_gpuops_reads_the_real_operators_driver_pods_as_the_operators_driver(fleet, fleet_cache):
    fleet(REAL)
    view = wait_fleet(fleet_cache(), lambda f: len(f.nodes) == 3 and all(n.advertised_gpus for n in f.nodes.values()),
                      "every node to advertise its GPUs", timeout=120)
    node = view.nodes["train-01"]
    assert node.driver_pod.name.startswith(f"{operator.NAMESPACE}/nvidia-driver-daemonset-")
    assert (node.driver_pod.owner_kind, node.driver_pod.version) == ("DaemonSet", REAL.operator.driver_version)
    assert node.driver.owner == "operator", node.driver.evidence
    assert node.driver_version == REAL.operator.driver_version
    assert view.nodes["train-02"].driver.owner == "host", view.nodes["train-02"].driver.evidence
    assert view.cluster.operator_found


AUTO = fl.FleetSpec(
    # A new driver pod takes 3 s to load, so the state it waits in is seen by a poll.
    name="auto", system_nodes=1, nudge_upgrade_controller=True, driver_ready_seconds=3.0,
    operator=fl.OperatorSpec(auto_upgrade=True),
    pools=(fl.PoolSpec(name="auto", nodes=2),),
)
def test_with_auto_upgrade_on_the_operators_own_upgrade_controller_moves_each_node_to_the_new_driver(
        fleet, cluster):
    fleet(AUTO)
    installer = cluster.installer()
    nodes = fl.pool_node_names(AUTO.pools[0])
    wait_until(lambda: all(observe.node(installer, n)["metadata"]["labels"].get("nvidia.com/gpu-driver-upgrade-state")
                           == "upgrade-done" for n in nodes), timeout=120,
               what="the upgrade controller to find both nodes up to date")
    seen: dict[str, list[str]] = {n: [] for n in nodes}

    def record() -> None:
        for name in nodes:
            node = observe.node(installer, name)
            state = node["metadata"]["labels"].get("nvidia.com/gpu-driver-upgrade-state", "")
            mark = state + (" (cordoned)" if node["spec"].get("unschedulable") else "")
            if not seen[name] or seen[name][-1] != mark:
                seen[name].append(mark)

    installer.call("PATCH", f"/apis/nvidia.com/v1/clusterpolicies/{AUTO.operator.cluster_policy_name}",
                   content_type="application/merge-patch+json", body={"spec": {"driver": {"version": NEW_DRIVER}}})

    def upgraded() -> bool:
        record()
        return all(observe.node(installer, n)["metadata"]["labels"].get("nvidia.com/cuda.driver-version.full")
                   == NEW_DRIVER and seen[n][-1] == "upgrade-done" for n in nodes)

    wait_until(upgraded, timeout=240, what=f"the operator to upgrade both nodes to {NEW_DRIVER}")
    for name in nodes:
        # The operator's states, its own cordon while it replaced the driver pod, and the
        # node given back; the new driver pod runs the new image.
        # (Its states pass quicker than a poll sees each; the driver restart is always seen.)
        assert any(mark.startswith(("pod-restart-required", "validation-required")) for mark in seen[name]), seen[name]
        assert any(mark.endswith("(cordoned)") for mark in seen[name]), seen[name]
        assert not observe.node(installer, name)["spec"].get("unschedulable")
        (pod,) = observe.operand_pods(installer, name, "nvidia-driver-daemonset")
        assert any(c["image"].startswith(f"nvcr.io/nvidia/driver:{NEW_DRIVER}") for c in pod["spec"]["containers"])


def test_a_driver_version_changed_with_auto_upgrade_off_leaves_pods_behind_until_each_is_replaced(
        fleet, cluster, fleet_cache):
    fleet(REAL)  # autoUpgrade off: the operator changes the DaemonSet and leaves the pods (OnDelete)
    installer = cluster.installer()
    cache = fleet_cache()
    wait_fleet(cache, lambda f: len(f.nodes) == 3 and all(n.advertised_gpus for n in f.nodes.values()),
               "every node to advertise its GPUs", timeout=120)

    installer.call("PATCH", f"/apis/nvidia.com/v1/clusterpolicies/{REAL.operator.cluster_policy_name}",
                   content_type="application/merge-patch+json", body={"spec": {"driver": {"version": NEW_DRIVER}}})
    view = wait_fleet(cache, lambda f: "driver-pods-behind-template" in _codes(f, "train")
                      and "driver-pods-behind-template" in _codes(f, "infer"),
                      "the pods behind their DaemonSet to be found", timeout=60)
    # train-02 runs the host driver: no driver pod, nothing behind.
    assert dict(view.pool("train").driver_pods_behind) == {NEW_DRIVER: ("train-01",)}
    assert view.nodes["train-01"].driver_version == REAL.operator.driver_version  # nothing changed yet
    text = render_text(dispatch("status", actor=CONFIG.actor("U0DAVE"), services=Services(config=CONFIG, fleet=cache),
                                now=_now()))
    assert f"1 pod behind ({NEW_DRIVER} next)" in text

    # Replacing the pod on purpose brings the node to the new version and clears it.
    (old,) = observe.operand_pods(installer, "train-01", "nvidia-driver-daemonset")
    installer.delete(old)
    view = wait_fleet(cache, lambda f: f.nodes["train-01"].driver_version == NEW_DRIVER
                      and "driver-pods-behind-template" not in _codes(f, "train"),
                      "train-01 to run the new driver and no longer be behind", timeout=60)
    assert "driver-pods-behind-template" in _codes(view, "infer")
