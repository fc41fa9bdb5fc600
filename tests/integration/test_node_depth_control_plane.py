"""`/gpu node` in depth on the real control plane, beside the real GPU Operator's operand
pods: every operand pod with its state, restarts and version; a device plugin installed
by hand beside the operator's (a critical finding); a GPU pod of a Deployment with the
PodDisruptionBudget covering it; and a label and a taint set with kubectl, named with the
tool that set them (the node's managedFields, read when asked)."""

from __future__ import annotations

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from testenv import fleet as fl
from testenv.install import wait_until
from tests.integration.inventory_helpers import CONFIG, _codes, _now, wait_fleet
from tests.integration.test_real_operator import REAL
from workflows.kube.gateway import KubeGateway

NODE = "train-01"
OPERANDS = {"nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset", "nvidia-device-plugin-daemonset",
            "gpu-feature-discovery", "nvidia-operator-validator"}


def _namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {fl.FLEET_LABEL: REAL.name}}}


def _hand_installed_device_plugin() -> dict:
    """One pod of the device plugin's own Helm chart (its DaemonSet is not needed to be one)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "nvdp-nvidia-device-plugin-x2k9q", "namespace": "nvdp",
                         "labels": {"app.kubernetes.io/name": "nvidia-device-plugin",
                                    "app.kubernetes.io/instance": "nvdp"}},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "nvidia-device-plugin-ctr",
                                     "image": "nvcr.io/nvidia/k8s-device-plugin:v0.16.1"}]}}


def _gpu_deployment() -> dict:
    labels = {"app": "web"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "ml"},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                                           "terminationGracePeriodSeconds": 1,
                                           "containers": [{"name": "main", "image": "registry.example/web:1.0",
                                                           "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}}


def test_gpu_node_shows_every_operand_a_second_device_plugin_the_gpu_pods_budgets_and_what_kubectl_set(
        fleet, cluster, fleet_cache):
    fleet(REAL)
    installer = cluster.installer()
    cache = fleet_cache()
    wait_fleet(cache, lambda f: len(f.nodes) == 3 and all(n.advertised_gpus for n in f.nodes.values()),
               "every node to advertise its GPUs", timeout=120)
    for name in ("nvdp", "ml"):
        installer.create(_namespace(name))
    installer.create(_gpu_deployment())
    installer.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                      "metadata": {"name": "web", "namespace": "ml"},
                      "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
    installer.create(_hand_installed_device_plugin())
    # What `kubectl label node train-01 team=vision` and `kubectl taint node train-01
    # dedicated=vision:PreferNoSchedule` send.
    installer.call("PATCH", f"/api/v1/nodes/{NODE}", query=[("fieldManager", "kubectl-label")],
                   content_type="application/merge-patch+json", body={"metadata": {"labels": {"team": "vision"}}})
    taints = installer.call("GET", f"/api/v1/nodes/{NODE}")["spec"].get("taints") or []
    installer.call("PATCH", f"/api/v1/nodes/{NODE}", query=[("fieldManager", "kubectl-taint")],
                   content_type="application/merge-patch+json",
                   body={"spec": {"taints": [*taints, {"key": "dedicated", "value": "vision",
                                                        "effect": "PreferNoSchedule"}]}})

    # NB: on a loaded machine an operand's pod can reach the cache after the rest.
    view = wait_fleet(cache, lambda f: "second-device-plugin" in _codes(f, NODE)
                      and any(p.owner == "Deployment web" for p in f.nodes[NODE].gpu_pods)
                      and OPERANDS <= {o.operand for o in f.nodes[NODE].operands},
                      "the second device plugin, the GPU pod and every operand to be seen", timeout=60)
    (finding,) = [f for f in view.findings_about(NODE) if f.code == "second-device-plugin"]
    assert finding.severity == "critical"
    assert "nvdp/nvdp-nvidia-device-plugin-x2k9q" in finding.message
    # The operator's other nodes run only its own device plugin.
    assert "second-device-plugin" not in _codes(view, "train-02") | _codes(view, "infer-01")
    operands = {o.operand: o.state for o in view.nodes[NODE].operands}
    assert OPERANDS <= set(operands), sorted(operands)
    assert operands["nvidia-device-plugin-daemonset"].version is not None
    wait_until(lambda: installer.get({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                      "metadata": {"name": "web", "namespace": "ml"}}
                                     ).get("status", {}).get("disruptionsAllowed") == 1,
               timeout=30, what="the budget to allow one disruption")

    gateway = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context="admin")
    reply = dispatch(f"node {NODE}", actor=CONFIG.actor("U0DAVE"),
                     services=Services(config=CONFIG, fleet=cache, node_reads=gateway), now=_now())
    text = render_text(reply)
    assert reply.ok, text
    assert "runs a second NVIDIA device plugin" in text
    assert "nvidia-container-toolkit-daemonset" in text and "gpu-feature-discovery" in text
    (web,) = [line for line in text.splitlines() if "ml/web-" in line]
    assert "Deployment web" in web and "web (1 disruption allowed)" in web, web
    (team,) = [line.split() for line in text.splitlines() if "kubectl-label" in line]
    assert team[:4] == ["label", "team", "vision", "kubectl-label"], team
    (taint,) = [line.split() for line in text.splitlines() if "kubectl-taint" in line]
    assert taint[:4] == ["taint", "dedicated", "dedicated=vision:PreferNoSchedule", "kubectl-taint"], taint
    # The labels NFD, GFD and the operator set are not a person's.
    assert "nvidia.com/gpu.present" not in text.split("Set by a person's tool")[1]
