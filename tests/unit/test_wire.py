"""The typed reading of API objects (workflows.kube.wire) gives the views the dict reading
gave, skips what gpuops does not use, and refuses a malformed object clearly."""

from __future__ import annotations

import datetime as dt

import msgspec
import orjson
import pytest

from workflows.kube import wire
from workflows.kube.errors import KubeError
from workflows.kube.gateway.decoding import node_from_json, pod_from_json
from workflows.kube.objects import ContainerState, OwnerRef, Taint

UTC = dt.timezone.utc

NODE = {
    "kind": "Node",
    "apiVersion": "v1",
    "metadata": {
        "name": "gpu-a-01",
        "uid": "0d5c",
        "resourceVersion": "4711",
        "creationTimestamp": "2026-11-30T08:00:00Z",
        "labels": {"nvidia.com/gpu.count": "8", "gpuops.io/pool": "training-a"},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {"f:images": {}}}}],
    },
    "spec": {"unschedulable": True, "podCIDR": "10.0.0.0/24",
             "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
    "status": {
        "capacity": {"cpu": "96", "nvidia.com/gpu": "8"},
        "allocatable": {"cpu": "95", "nvidia.com/gpu": "7"},
        "conditions": [
            {"type": "MemoryPressure", "status": "False", "lastTransitionTime": "2026-11-30T08:00:00Z"},
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T09:30:15Z"},
        ],
        "images": [{"names": ["nvcr.io/nvidia/driver:580.95.05-ubuntu22.04"], "sizeBytes": 1}],
        "nodeInfo": {"kubeletVersion": "v1.37.2"},
    },
}

POD = {
    "metadata": {
        "name": "trainer-0", "namespace": "ml", "resourceVersion": "88",
        "creationTimestamp": "2026-12-01T10:00:00Z", "deletionTimestamp": "2026-12-02T10:00:00Z",
        "labels": {"app": "trainer"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "trainer",
                             "uid": "9b5b", "controller": True}],
    },
    "spec": {
        "nodeName": "gpu-a-01",
        "containers": [
            {"name": "main", "image": "trainer:1",
             "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "4"}},
             "env": [{"name": "X", "value": "1"}]},
            {"name": "side", "image": "side:2",
             "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"}}},
        ],
    },
    "status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {"name": "main", "image": "trainer:1", "ready": True, "restartCount": 3,
             "state": {"running": {"startedAt": "2026-12-01T10:01:00Z"}},
             "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}},
            {"name": "side", "image": "side:2", "ready": False, "restartCount": 0,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
        ],
    },
}


def test_a_node_reads_what_gpuops_uses_and_nothing_else():
    node = node_from_json(NODE)

    assert node.name == "gpu-a-01"
    assert dict(node.labels) == {"nvidia.com/gpu.count": "8", "gpuops.io/pool": "training-a"}
    assert node.unschedulable is True
    assert node.taints == (Taint(key="nvidia.com/gpu", value="", effect="NoSchedule"),)
    assert node.ready is True
    assert node.ready_changed_at == dt.datetime(2026, 12, 1, 9, 30, 15, tzinfo=UTC)
    assert node.capacity["nvidia.com/gpu"] == "8" and node.allocatable["nvidia.com/gpu"] == "7"
    assert node.created_at == dt.datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    assert node.resource_version == "4711"


def test_a_page_decoded_from_bytes_gives_the_same_views_as_the_dict_reading():
    page = orjson.dumps({"metadata": {"resourceVersion": "5000", "continue": "next"}, "items": [NODE, NODE]})

    decoded = msgspec.json.decode(page, type=wire.ListPageWire[wire.NodeWire])

    meta = wire.list_meta_of(decoded)
    assert meta.continue_ == "next" and meta.resourceVersion == "5000"
    assert [wire.node_view(n) for n in decoded.items] == [node_from_json(NODE)] * 2


def test_a_node_without_status_or_conditions_is_not_ready_known():
    node = node_from_json({"metadata": {"name": "bare"}})

    assert node.ready is None and node.capacity == {} and node.labels == {} and not node.unschedulable
    assert node.created_at == wire.EPOCH


def test_a_pod_reads_owner_state_restarts_and_gpu_requests():
    pod = pod_from_json(POD)

    assert (pod.namespace, pod.name, pod.node_name, pod.phase) == ("ml", "trainer-0", "gpu-a-01", "Running")
    assert pod.ready and pod.deleting
    assert pod.owners == (OwnerRef(kind="StatefulSet", name="trainer", controller=True),)
    assert pod.controller == OwnerRef(kind="StatefulSet", name="trainer", controller=True)
    assert pod.containers == (
        ContainerState(name="main", image="trainer:1", ready=True, restart_count=3,
                       last_terminated_reason="Error", running=True),
        ContainerState(name="side", image="side:2", ready=False, restart_count=0,
                       waiting_reason="CrashLoopBackOff"),
    )
    assert pod.images == ("trainer:1", "side:2")
    # Per resource, the sum over containers of max(request, limit); cpu is not a GPU.
    assert dict(pod.gpu_requests) == {"nvidia.com/gpu": 5, "nvidia.com/mig-1g.10gb": 1}


def test_a_pending_pod_without_status_is_pending_and_asks_for_nothing():
    pod = pod_from_json({"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [{"name": "c"}]}})

    assert pod.phase == "Pending" and not pod.ready and not pod.deleting and pod.node_name is None
    assert pod.gpu_requests == {} and pod.containers == ()


def test_a_watch_bookmark_decodes_although_it_names_no_object():
    event = msgspec.json.decode(
        b'{"type":"BOOKMARK","object":{"kind":"Node","metadata":{"resourceVersion":"9001"}}}',
        type=wire.WatchEventWire)

    node = msgspec.json.decode(event.object, type=wire.NodeWire)

    assert event.type == "BOOKMARK" and wire.meta_of(node).resourceVersion == "9001"
    assert wire.object_key(node) == ""


def test_a_field_of_the_wrong_type_is_refused_with_where_it_is():
    broken = {**NODE, "status": {**NODE["status"], "capacity": {"nvidia.com/gpu": ["8"]}}}

    with pytest.raises(KubeError, match=r"unexpected Node from the API: .*\$\.status\.capacity"):
        node_from_json(broken)


def test_a_cluster_policy_keeps_its_free_form_spec_and_tolerates_a_null_status():
    raw = orjson.dumps({"kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
                        "spec": {"driver": {"enabled": True, "upgradePolicy": {"autoUpgrade": False}}},
                        "status": None})

    policy = wire.custom_object_view(msgspec.json.decode(raw, type=wire.CustomObjectWire))

    assert policy.kind == "ClusterPolicy" and policy.name == "cluster-policy"
    assert policy.spec["driver"] == {"enabled": True, "upgradePolicy": {"autoUpgrade": False}}
    assert policy.status == {}


def test_a_pod_bookmark_with_null_containers_decodes():
    # What kube-apiserver v1.37 sends on a pod watch about once a minute.
    raw = (b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"8123",'
           b'"creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}},'
           b'"spec":{"containers":null},"status":{}}}')
    event = msgspec.json.decode(raw, type=wire.WatchEventWire)

    pod = msgspec.json.decode(event.object, type=wire.PodWire)

    assert wire.meta_of(pod).resourceVersion == "8123"
    assert wire.pod_view(pod).images == () and wire.gpu_requests(wire.pod_spec_of(pod)) == {}


# Go's map[string]string and ResourceList never hold null values; the maps themselves may be null.
_STRING_MAPS = frozenset({"labels", "annotations", "capacity", "allocatable", "requests", "limits"})


def _nulled(value: object) -> list[object]:
    """Copies of `value` with one field (at any depth) set to null, one copy per field."""
    copies: list[object] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            copies.append({**value, key: None})
            if key not in _STRING_MAPS:
                copies.extend({**value, key: changed} for changed in _nulled(inner))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            copies.extend([*value[:index], changed, *value[index + 1:]] for changed in _nulled(inner))
    return copies


DEPLOYMENT = {"metadata": {"name": "gpu-operator", "namespace": "gpu-operator", "labels": {"app": "gpu-operator"}},
              "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "o", "image": "op:v26.7.0"}]}}},
              "status": {"readyReplicas": 1}}


@pytest.mark.parametrize(("obj", "schema", "view"), [
    (NODE, wire.NodeWire, wire.node_view),
    (POD, wire.PodWire, wire.pod_view),
    (DEPLOYMENT, wire.DeploymentWire, wire.deployment_view),
], ids=["node", "pod", "deployment"])
def test_a_null_in_any_field_reads_as_the_empty_value(obj, schema, view):
    variants = _nulled(obj)
    assert len(variants) >= 10

    for variant in variants:
        decoded = msgspec.json.decode(orjson.dumps(variant), type=schema)
        view(decoded)  # no error: a null is "not set", as the API means it
        assert isinstance(wire.object_key(decoded), str)


def test_null_labels_and_conditions_read_as_none_set():
    node = node_from_json({"metadata": {"name": "n", "labels": None, "annotations": None},
                           "spec": {"unschedulable": None, "taints": None},
                           "status": {"capacity": None, "conditions": None}})

    assert node.labels == {} and node.annotations == {} and not node.unschedulable
    assert node.taints == () and node.capacity == {} and node.ready is None


def test_a_driver_daemonset_reads_as_its_template_generation_and_driver_image_only():
    daemonset = {
        "kind": "DaemonSet", "apiVersion": "apps/v1",
        "metadata": {"name": "nvidia-driver-daemonset", "namespace": "gpu-operator", "generation": 4,
                     "annotations": {"deprecated.daemonset.template.generation": "4"}},
        "spec": {"template": {"spec": {
            "initContainers": [{"name": "k8s-driver-manager", "image": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.9.1"}],
            "containers": [{"name": "nvidia-peermem-ctr", "image": "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04"},
                           {"name": "nvidia-driver-ctr", "image": "nvcr.io/nvidia/driver:580.105.08-ubuntu22.04"}]}}},
        "status": {"numberReady": 3, "updatedNumberScheduled": 1},
    }
    view = wire.driver_template_view(msgspec.json.decode(orjson.dumps(daemonset), type=wire.DaemonSetWire))
    assert (view.namespace, view.name, view.template_generation, view.driver_image) == (
        "gpu-operator", "nvidia-driver-daemonset", "4", "nvcr.io/nvidia/driver:580.105.08-ubuntu22.04")
    # Status moves with every pod; the view does not, so the cache does not re-assess the fleet.
    daemonset["status"] = {"numberReady": 2}
    assert wire.driver_template_view(msgspec.json.decode(orjson.dumps(daemonset), type=wire.DaemonSetWire)) == view
