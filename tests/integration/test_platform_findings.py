"""The platform under the GPU Operator, on the real control plane with the real operator,
as the bot's ServiceAccount reads it: the operator's release against this cluster's
Kubernetes, the container runtime the operator configured the toolkit for against the
runtime each node's kubelet reports, kernels against precompiled driver images, and a
serving pool the operator upgrades unattended (and not, with sandbox workloads on, where
its upgrade controller upgrades nothing). Each fleet shows one pattern beside its healthy
counterpart, and each answer is read through `/gpu findings` and `/gpu node`. The failed
canary beside a Ready device plugin is in test_upgrade_run.py, where a real check pod fails."""

from __future__ import annotations

from kubernetes import client

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from testenv import fleet as fl
from testenv.build import KUBERNETES_VERSION
from testenv.install import wait_until
from tests.integration.desk import bot_rbac_granted
from tests.integration.inventory_helpers import CONFIG, _codes, _now, wait_fleet
from workflows.config import GpuopsConfig, OperatorSupportRow
from workflows.fleet.platform import minor_of, minor_text, shipped_operator_support


API_MINOR = minor_text(minor_of(KUBERNETES_VERSION) or (0, 0))


def _say(cache, text: str, config: GpuopsConfig = CONFIG) -> str:
    reply = dispatch(text, actor=config.actor("U0DAVE"), services=Services(config=config, fleet=cache), now=_now())
    return render_text(reply)


def _pairs(view) -> set[tuple[str, str]]:
    return {(f.subject, f.code) for f in view.findings}


def _toolkit_runtime(cluster, namespace: str) -> str | None:
    apps = client.AppsV1Api(cluster.api_client())
    sets = apps.list_namespaced_daemon_set(namespace, label_selector="app=nvidia-container-toolkit-daemonset").items
    for container in (sets[0].spec.template.spec.containers if sets else []):
        for env in container.env or []:
            if env.name == "RUNTIME":
                return env.value
    return None


# --- container runtime ----------------------------------------------------------------------

RUNTIMES = fl.FleetSpec(
    name="runtimes", system_nodes=0,
    pools=(
        fl.PoolSpec(name="steady", nodes=2, container_runtime="containerd://1.7.20"),
        fl.PoolSpec(name="crio", nodes=2, container_runtime="cri-o://1.30.4"),
    ),
    special_nodes=(fl.SpecialNode(node="crio-02", container_runtime="containerd://1.7.20"),),
)


def test_nodes_on_another_runtime_than_the_operator_configured_the_toolkit_for_are_found(
        fleet, cluster, fleet_cache):
    fleet(RUNTIMES)
    # The operator itself picks containerd as soon as one GPU node runs it.
    wait_until(lambda: _toolkit_runtime(cluster, RUNTIMES.operator.namespace) == "containerd", timeout=90,
               what="the operator to configure the toolkit for containerd")
    with bot_rbac_granted(cluster.installer()) as bot:
        cache = fleet_cache(user=bot)
        view = wait_fleet(cache, lambda v: "runtime-mismatch" in _codes(v, "crio"), "the runtime mismatch")

        assert ("steady", "runtime-mismatch") not in _pairs(view)
        (found,) = [f for f in view.findings if f.code == "runtime-mismatch"]
        assert found.severity == "warning"
        assert "1 of 2 nodes in pool crio" in found.message
        assert "cri-o://1.30.4 on crio-01" in found.message and "crio-02" not in found.message
        assert "RUNTIME=containerd" in found.message, found.message
        text = _say(cache, "findings crio")
        assert "cri-o://1.30.4 on crio-01" in text, text
        assert "nodes in pool steady" not in _say(cache, "findings")
        node = _say(cache, "node crio-01")
        assert "cri-o://1.30.4" in node, node

        # The node moves to containerd: the finding goes.
        client.CoreV1Api(cluster.api_client()).patch_node_status(
            "crio-01", {"status": {"nodeInfo": {"containerRuntimeVersion": "containerd://1.7.20"}}})
        view = wait_fleet(cache, lambda v: "runtime-mismatch" not in _codes(v, "crio"), "the mismatch to clear")
        assert "runtime-mismatch" not in {f.code for f in view.findings}
        assert "run another container runtime" not in _say(cache, "findings")


# --- the operator's release against this cluster's Kubernetes -------------------------------

KUBELETS = fl.FleetSpec(
    name="kubelets", system_nodes=0,
    pools=(
        fl.PoolSpec(name="current", nodes=1, kubelet_version="v1.36.3"),
        fl.PoolSpec(name="lagging", nodes=1, kubelet_version="v1.31.4"),
    ),
)
# A vendor's validation of 26.7 on this control plane's Kubernetes.
VALIDATED = CONFIG.model_copy(update={"inventory": CONFIG.inventory.model_copy(update={
    "operator_support": {"26.7": OperatorSupportRow(kubernetes=f"1.32-{API_MINOR}", source="our validation")}})})


def test_the_operator_release_is_read_against_the_api_servers_and_the_kubelets_kubernetes(
        fleet, cluster, fleet_cache):
    fleet(KUBELETS)
    with bot_rbac_granted(cluster.installer()) as bot:
        # NVIDIA lists 26.7 for 1.32-1.36; this control plane runs a newer API server.
        assert not shipped_operator_support()["26.7"].contains(minor_of(KUBERNETES_VERSION) or (0, 0)), \
            "the test control plane's Kubernetes is now supported by 26.7: give this test an older release"
        view = wait_fleet(fleet_cache(user=bot), lambda v: "kubernetes-unsupported" in _codes(v, "cluster"),
                          "the support finding")
        (found,) = view.findings_about("cluster")
        assert found.severity == "warning"
        assert "GPU Operator v26.7.0 (release 26.7) is supported on Kubernetes 1.32-1.36" in found.message
        assert f"the API server runs {API_MINOR}" in found.message, found.message
        assert "lagging-01's kubelet runs 1.31" in found.message
        assert "current-01" not in found.message

        # Where the configuration says 26.7 is validated on this API server, only the lagging
        # kubelet is outside.
        cache = fleet_cache(user=bot, config=VALIDATED)
        view = wait_fleet(cache, lambda v: bool(v.nodes) and "kubernetes-unsupported" in _codes(v, "cluster"),
                          "the support finding under the validated range")
        (found,) = view.findings_about("cluster")
        assert "lagging-01's kubelet runs 1.31" in found.message
        assert "API server" not in found.message, found.message
        assert "lagging-01" in _say(cache, "findings cluster", VALIDATED)
        assert "v1.31.4" in _say(cache, "node lagging-01", VALIDATED)

        # The lagging kubelet is upgraded: nothing is outside the supported range.
        client.CoreV1Api(cluster.api_client()).patch_node_status(
            "lagging-01", {"status": {"nodeInfo": {"kubeletVersion": "v1.36.3"}}})
        view = wait_fleet(cache, lambda v: "kubernetes-unsupported" not in _codes(v, "cluster"),
                          "the support finding to clear")
        assert not view.findings_about("cluster")


# --- kernels against precompiled driver images ----------------------------------------------

KERNEL = "5.15.0-125-generic"
NEWER = "5.15.0-130-generic"
UNBUILT = "6.8.0-1015-nvidia"
PRECOMPILED = fl.FleetSpec(
    name="precompiled", system_nodes=0,
    operator=fl.OperatorSpec(use_precompiled=True),
    pools=(fl.PoolSpec(name="pre", nodes=3, kernel=KERNEL),),
    special_nodes=(
        # Rebooted into a newer kernel; NFD has not labelled it yet, so the operator's
        # DaemonSet for the old kernel still runs there.
        fl.SpecialNode(node="pre-02", kernel=NEWER, nfd_kernel=KERNEL),
        # A kernel NVIDIA built no precompiled driver for: the operator's DaemonSet for it
        # names an image the registry does not have.
        fl.SpecialNode(node="pre-03", kernel=UNBUILT),
    ),
    no_precompiled_kernels=(UNBUILT,),
)


def test_a_precompiled_driver_built_for_another_kernel_than_the_node_runs_is_found(fleet, cluster, fleet_cache):
    fleet(PRECOMPILED)
    with bot_rbac_granted(cluster.installer()) as bot:
        cache = fleet_cache(user=bot)
        view = wait_fleet(cache, lambda v: "precompiled-kernel" in _codes(v, "pre-02")
                          and v.nodes["pre-01"].driver_pod.present, "the precompiled kernel finding", timeout=90)

        assert view.nodes["pre-01"].precompiled
        assert KERNEL in (view.nodes["pre-01"].driver_pod.image_tag or "")
        assert "precompiled-kernel" not in _codes(view, "pre-01")
        (found,) = [f for f in view.findings_about("pre-02") if f.code == "precompiled-kernel"]
        assert found.severity == "warning"
        assert f"runs kernel {NEWER}" in found.message and KERNEL in found.message, found.message
        assert f"runs kernel {NEWER}" in _say(cache, "node pre-02")
        assert f"runs kernel {NEWER}" in _say(cache, "findings")
        # Three kernels under precompiled drivers in one pool.
        assert "precompiled-kernels-mixed" in _codes(view, "pre")


def test_a_kernel_without_a_precompiled_driver_image_is_found_as_critical(fleet, cluster, fleet_cache):
    fleet(PRECOMPILED)
    with bot_rbac_granted(cluster.installer()) as bot:
        cache = fleet_cache(user=bot)
        view = wait_fleet(cache, lambda v: "precompiled-kernel" in _codes(v, "pre-03")
                          and v.nodes["pre-01"].driver_pod.ready, "the missing precompiled image finding", timeout=90)

        pod = view.nodes["pre-03"].driver_pod
        assert pod.waiting_reason == "ImagePullBackOff" and UNBUILT in (pod.image_tag or "")
        (found,) = [f for f in view.findings_about("pre-03") if f.code == "precompiled-kernel"]
        assert found.severity == "critical"
        assert f"no precompiled driver image for kernel {UNBUILT} on pre-03" in found.message, found.message
        assert f"no precompiled driver image for kernel {UNBUILT}" in _say(cache, "node pre-03")
        # The node whose kernel has its image runs its driver and is not found.
        assert "precompiled-kernel" not in _codes(view, "pre-01")


# --- a serving pool the operator upgrades unattended ----------------------------------------

AUTO = fl.FleetSpec(
    name="auto", system_nodes=0,
    operator=fl.OperatorSpec(auto_upgrade=True),
    pools=(fl.PoolSpec(name="serving-a", kind="serving", nodes=1),
           fl.PoolSpec(name="training-a", kind="training", nodes=1)),
)


def test_a_serving_pool_under_the_operators_auto_upgrade_is_found_and_a_training_pool_is_not(
        fleet, cluster, fleet_cache):
    fleet(AUTO)
    with bot_rbac_granted(cluster.installer()) as bot:
        cache = fleet_cache(user=bot)
        view = wait_fleet(cache, lambda v: len(v.nodes) == 2 and "serving-auto-upgrade" in _codes(v, "serving-a"),
                          "the auto-upgrade finding")
        assert "serving-auto-upgrade" not in _codes(view, "training-a")
        serving = view.pool("serving-a")
        assert (serving.auto_upgrade.state, serving.auto_upgrade.source) == ("on", "ClusterPolicy cluster-policy")
        assert "serving pool serving-a has driver auto-upgrade on" in _say(cache, "findings serving-a")

        # Turned off in the ClusterPolicy: the finding goes.
        client.CustomObjectsApi(cluster.api_client()).patch_cluster_custom_object(
            "nvidia.com", "v1", "clusterpolicies", AUTO.operator.cluster_policy_name,
            {"spec": {"driver": {"upgradePolicy": {"autoUpgrade": False}}}})
        view = wait_fleet(cache, lambda v: "serving-auto-upgrade" not in _codes(v, "serving-a"),
                          "the auto-upgrade finding to clear")
        assert view.pool("serving-a").auto_upgrade.state == "off"
        assert "auto-upgrade on" not in _say(cache, "findings serving-a")


SANDBOXED = fl.FleetSpec(
    # The upgrade controller looks again every 2 minutes; the nudge wakes it when a driver
    # pod turns Ready, as its next look would.
    name="sandboxed", system_nodes=1, nudge_upgrade_controller=True,
    operator=fl.OperatorSpec(auto_upgrade=True),
    pools=(fl.PoolSpec(name="serving-a", kind="serving", nodes=1),),
)
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"


def test_with_sandbox_workloads_on_the_operator_upgrades_no_driver_and_no_serving_pool_is_found(
        fleet, cluster, fleet_cache):
    fleet(SANDBOXED)
    core = client.CoreV1Api(cluster.api_client())
    # autoUpgrade on: the operator's upgrade controller takes the node in hand.
    wait_until(lambda: UPGRADE_STATE in (core.read_node("serving-a-01").metadata.labels or {}), timeout=90,
               what="the operator's upgrade controller to label the node")
    client.CustomObjectsApi(cluster.api_client()).patch_cluster_custom_object(
        "nvidia.com", "v1", "clusterpolicies", SANDBOXED.operator.cluster_policy_name,
        {"spec": {"sandboxWorkloads": {"enabled": True}}})
    # The operator's own word: with sandbox workloads it resets every upgrade state and
    # upgrades nothing, whatever autoUpgrade says.
    wait_until(lambda: UPGRADE_STATE not in (core.read_node("serving-a-01").metadata.labels or {}), timeout=90,
               what="the operator to drop the node's upgrade state")
    with bot_rbac_granted(cluster.installer()) as bot:
        cache = fleet_cache(user=bot)
        view = wait_fleet(cache, lambda v: "serving-a-01" in v.nodes, "the node")
        assert "serving-auto-upgrade" not in _codes(view, "serving-a"), view.findings_about("serving-a")
        setting = view.pool("serving-a").auto_upgrade
        assert setting.state == "off" and "sandboxWorkloads" in setting.source, setting
        assert "auto-upgrade on" not in _say(cache, "findings serving-a")
