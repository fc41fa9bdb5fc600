"""`/gpu node` in depth: every operand pod of the operator, the GPU pods with their owners
and budgets, what a person's tool set on the node, and a device plugin that is not the
operator's."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from typing import Any

import pytest

from workflows.fleet.node_detail import BadShape, hand_set_fields, read_node_detail
from workflows.fleet.pods import GpuPod
from workflows.kube.errors import Forbidden
from workflows.kube.objects import DisruptionBudget, OwnerRef


def codes(findings) -> list[tuple[str, str]]:
    return [(f.severity, f.code) for f in findings]


def hand_installed_plugin(make, node: str, **kwargs):
    """What the device plugin's own Helm chart runs, in a namespace of its own."""
    return make.pod(node=node, namespace="nvidia-device-plugin", name="nvdp-nvidia-device-plugin-x2k9q",
                    labels={"app.kubernetes.io/name": "nvidia-device-plugin"},
                    image="nvcr.io/nvidia/k8s-device-plugin:v0.16.1", **kwargs)


# ------------------------------------------------------------------ a second device plugin


def test_a_hand_installed_device_plugin_beside_the_operators_is_critical(make):
    node = make.node("gpu-1")

    fleet = make.fleet([node], [*make.operands("gpu-1"), hand_installed_plugin(make, "gpu-1")])

    (finding,) = fleet.findings_about("gpu-1")
    assert (finding.severity, finding.code) == ("critical", "second-device-plugin")
    assert "nvidia-device-plugin/nvdp-nvidia-device-plugin-x2k9q" in finding.message
    assert "k8s-device-plugin:v0.16.1" in finding.message
    assert "remove the hand-installed one" in finding.message
    assert fleet.nodes["gpu-1"].other_device_plugins[0].name == "nvidia-device-plugin/nvdp-nvidia-device-plugin-x2k9q"


def test_a_device_plugin_found_only_by_its_image_counts_too(make):
    node = make.node("gpu-1")
    plain = make.pod(node="gpu-1", namespace="kube-system", labels={"k8s-app": "gpu"},
                     image="registry.example.com:5000/mirror/k8s-device-plugin:v0.14.5@sha256:abc")

    assert ("critical", "second-device-plugin") in codes(make.fleet([node], [*make.operands("gpu-1"), plain]).findings)


def test_gpu_feature_discovery_shipped_in_the_device_plugin_image_is_not_a_device_plugin(make):
    node = make.node("gpu-1")
    gfd = make.pod(node="gpu-1", namespace="nvidia-device-plugin",
                   labels={"app.kubernetes.io/name": "gpu-feature-discovery"},
                   image="nvcr.io/nvidia/k8s-device-plugin:v0.16.1")

    assert make.fleet([node], [*make.operands("gpu-1"), gfd]).findings == ()


def test_a_device_plugin_the_operator_was_told_to_leave_to_others_is_no_finding(make):
    node = make.node("gpu-1", labels={"nvidia.com/gpu.deploy.device-plugin": "false"})
    pods = [make.driver_pod("gpu-1"), make.validator_pod("gpu-1"), hand_installed_plugin(make, "gpu-1")]

    assert "second-device-plugin" not in {f.code for f in make.fleet([node], pods).findings}


def test_without_the_operator_a_device_plugin_is_not_a_second_one(make):
    node = make.node("gpu-1")

    fleet = make.fleet([node], [hand_installed_plugin(make, "gpu-1")], operator=False)

    assert "second-device-plugin" not in {f.code for f in fleet.findings}


# ------------------------------------------------------------------ every operand, every GPU pod


def test_every_pod_of_the_operator_on_the_node_is_listed_with_its_state_restarts_and_version(make):
    node = make.node("gpu-1")
    dcgm = make.pod(node="gpu-1", labels={"app": "nvidia-dcgm-exporter"},
                    image="nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04",
                    waiting_reason="CrashLoopBackOff", restarts=7, ready=False)
    toolkit = make.pod(node="gpu-1", labels={"app": "nvidia-container-toolkit-daemonset"},
                       image="nvcr.io/nvidia/k8s/container-toolkit:v1.17.8-ubuntu20.04")

    inv = make.assess(node, [*make.operands("gpu-1"), dcgm, toolkit])

    by_operand = {o.operand: o.state for o in inv.operands}
    assert set(by_operand) == {"nvidia-driver-daemonset", "nvidia-device-plugin-daemonset",
                               "nvidia-operator-validator", "nvidia-dcgm-exporter",
                               "nvidia-container-toolkit-daemonset"}
    assert (by_operand["nvidia-dcgm-exporter"].text, by_operand["nvidia-dcgm-exporter"].version) == (
        "CrashLoopBackOff (7 restarts)", "4.2.3")
    assert by_operand["nvidia-container-toolkit-daemonset"].version == "1.17.8"


def test_a_gpu_pod_is_owned_by_its_deployment_through_its_replicaset(make):
    node = make.node("gpu-1")
    web = dataclasses.replace(make.workload("gpu-1", gpus=2, name="web-7d9f8c6b5-abcde",
                                            labels={"app": "web", "pod-template-hash": "7d9f8c6b5"}),
                              owners=(OwnerRef(kind="ReplicaSet", name="web-7d9f8c6b5", controller=True),))
    job = make.workload("gpu-1", gpus=1, name="train-1-xyz")
    bare = make.workload("gpu-1", gpus=1, name="notebook", owner_kind=None)

    inv = make.assess(node, [*make.operands("gpu-1"), web, job, bare])

    assert [(p.ref, p.owner, p.gpus) for p in inv.gpu_pods] == [
        ("ml/notebook", None, 1), ("ml/train-1-xyz", "Job owner", 1), ("ml/web-7d9f8c6b5-abcde", "Deployment web", 2)]


# ------------------------------------------------------------------ who set what (managedFields)


NODE = {
    "metadata": {
        "name": "gpu-1",
        "labels": {"team": "vision", "nvidia.com/gpu.product": "NVIDIA-H100", "kubernetes.io/hostname": "gpu-1"},
        "annotations": {"ops/why": "bad fan", "node.alpha.kubernetes.io/ttl": "0",
                        "kubectl.kubernetes.io/last-applied-configuration": "{}"},
        "managedFields": [
            {"manager": "kubelet", "operation": "Update", "time": "2026-11-01T08:00:00Z",
             "fieldsV1": {"f:metadata": {"f:labels": {"f:kubernetes.io/hostname": {}},
                                         "f:annotations": {"f:node.alpha.kubernetes.io/ttl": {}}}}},
            {"manager": "nfd-master", "operation": "Update", "time": "2026-11-01T08:01:00Z",
             "fieldsV1": {"f:metadata": {"f:labels": {"f:nvidia.com/gpu.product": {}}}}},
            {"manager": "kubectl-label", "operation": "Update", "time": "2026-12-01T09:30:00Z",
             "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}}},
            {"manager": "kubectl-annotate", "operation": "Update", "time": "2026-12-02T10:00:00Z",
             "fieldsV1": {"f:metadata": {"f:annotations": {"f:ops/why": {}}}}},
            {"manager": "kubectl-taint", "operation": "Update", "time": "2026-12-03T11:00:00Z",
             "fieldsV1": {"f:spec": {"f:taints": {}}}},
        ],
    },
    "spec": {"taints": [{"key": "dedicated", "value": "vision", "effect": "NoSchedule"}]},
}


def test_labels_taints_and_annotations_a_persons_tool_set_are_named_with_the_tool_and_its_time():
    found = hand_set_fields(NODE)

    assert [(h.what, h.key, h.value, h.manager, h.at) for h in found] == [
        ("taint", "dedicated", "dedicated=vision:NoSchedule", "kubectl-taint",
         dt.datetime(2026, 12, 3, 11, tzinfo=dt.timezone.utc)),
        ("label", "team", "vision", "kubectl-label", dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.timezone.utc)),
        ("annotation", "ops/why", "bad fan", "kubectl-annotate", dt.datetime(2026, 12, 2, 10, tzinfo=dt.timezone.utc)),
    ]


def test_taints_keyed_one_by_one_name_only_the_ones_the_tool_owns():
    node = {"metadata": {"managedFields": [
        {"manager": "kubectl-taint", "fieldsV1": {"f:spec": {"f:taints": {
            'k:{"effect":"NoSchedule","key":"dedicated"}': {}}}}}]},
            "spec": {"taints": [{"key": "dedicated", "effect": "NoSchedule"},
                                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}

    assert [(h.value, h.at) for h in hand_set_fields(node)] == [("dedicated:NoSchedule", None)]


@pytest.mark.parametrize("node", [
    ["not", "a", "node"],
    {"metadata": []},
    {"metadata": {"managedFields": {"manager": "kubectl"}}},
    {"metadata": {"managedFields": ["kubectl"]}},
    {"metadata": {"managedFields": [{"manager": "kubectl-label", "fieldsV1": {"f:metadata": {"f:labels": []}}}]}},
    {"metadata": {"managedFields": [{"manager": "kubectl-taint", "fieldsV1": {"f:spec": {"f:taints": []}}}]}},
    {"metadata": {}, "spec": {"taints": "dedicated"}},
])
def test_an_answer_not_shaped_as_documented_is_refused_with_where_it_went_wrong(node):
    with pytest.raises(BadShape, match="not shaped as documented"):
        hand_set_fields(node)


# ------------------------------------------------------------------ the reads at command time


class Reads:
    """What the gateway answers, as plain values (the reads are the gateway's)."""

    def __init__(self, *, node: Any = NODE, budgets: list[DisruptionBudget] | None = None,
                 hold: threading.Event | None = None, refuse: bool = False) -> None:
        self.node, self.budgets, self.hold, self.refuse = node, budgets or [], hold, refuse

    def get_node_json(self, name: str) -> Any:
        if self.hold is not None:
            self.hold.wait(10)
        if self.refuse:
            raise Forbidden("GET /api/v1/nodes/gpu-1: forbidden", status=403)
        return self.node

    def list_disruption_budgets(self, namespace: str) -> list[DisruptionBudget]:
        if namespace == "odd":
            raise KeyError("name")  # what the gateway's reading of a budget without a name raises
        return [b for b in self.budgets if b.namespace == namespace]


WEB = GpuPod(namespace="ml", name="web-1", owner="Deployment web", gpus=2, labels={"app": "web"})
BATCH = GpuPod(namespace="ml", name="batch-1", owner="Job batch", gpus=1, labels={"app": "batch"})
BUDGETS = [DisruptionBudget(namespace="ml", name="web", selector={"app": "web"}, disruptions_allowed=1),
           DisruptionBudget(namespace="other", name="all", selector={}, disruptions_allowed=0)]


def test_each_gpu_pod_is_given_the_budgets_that_select_it_or_none():
    detail = read_node_detail(Reads(budgets=BUDGETS), "gpu-1", [WEB, BATCH])

    assert detail.budgets == {"ml/web-1": ("web (1 disruption allowed)",), "ml/batch-1": ()}
    assert detail.hand_set is not None and len(detail.hand_set) == 3


def test_a_read_that_does_not_answer_by_the_deadline_leaves_its_part_unknown_and_the_rest_stands():
    hold = threading.Event()
    try:
        detail = read_node_detail(Reads(budgets=BUDGETS, hold=hold), "gpu-1", [WEB], deadline=0.2)
    finally:
        hold.set()

    assert detail.hand_set is None
    assert detail.hand_set_unknown == "the API server did not answer within 0.2s"
    assert detail.budgets == {"ml/web-1": ("web (1 disruption allowed)",)}


def test_a_refused_or_misshapen_read_says_why_its_part_is_unknown():
    refused = read_node_detail(Reads(refuse=True), "gpu-1", [])
    misshapen = read_node_detail(Reads(node={"metadata": {"managedFields": "x"}}), "gpu-1", [])

    assert refused.hand_set is None and "forbidden" in (refused.hand_set_unknown or "")
    assert misshapen.hand_set is None and "not shaped as documented" in (misshapen.hand_set_unknown or "")


def test_budgets_answered_in_an_odd_shape_are_unknown_with_the_namespace_and_who_set_what_stands():
    odd = GpuPod(namespace="odd", name="x", owner=None, gpus=1, labels={})

    detail = read_node_detail(Reads(budgets=BUDGETS), "gpu-1", [WEB, odd])

    assert detail.budgets is None
    assert detail.budgets_unknown == "budgets of namespace odd not read: the API server's answer is not shaped as documented (KeyError('name'))"
    assert detail.hand_set is not None
