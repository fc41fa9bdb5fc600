"""Put things into the local control plane: the GPU Operator CRDs, a fleet, and take a
fleet away again. Plain JSON manifests through the API, as the operator's Helm chart
and controllers would create them."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from testenv import fleet as fl
from testenv.operator import NAMESPACE

CRDS_ENV = "GPUOPS_GPU_OPERATOR_CRDS"
CRD_FILES = ("nvidia.com_clusterpolicies.yaml", "nvidia.com_nvidiadrivers.yaml")

# kind -> (API path prefix, plural, namespaced)
_KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Secret": ("/api/v1", "secrets", True),
    "Service": ("/api/v1", "services", True),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "ClusterPolicy": ("/apis/nvidia.com/v1", "clusterpolicies", False),
    "NVIDIADriver": ("/apis/nvidia.com/v1alpha1", "nvidiadrivers", False),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
}


class CrdsMissing(RuntimeError):
    """The GPU Operator CRDs were not found where GPUOPS_GPU_OPERATOR_CRDS points."""


def crds_folder() -> Path:
    value = os.environ.get(CRDS_ENV, "")
    hint = (
        f"set {CRDS_ENV} to a folder holding {' and '.join(CRD_FILES)} "
        "(the GPU Operator's Helm chart has them in crds/; in this repository's CI they "
        "come from ../shared/reference/gpu-operator/v26.7.0)"
    )
    if not value:
        raise CrdsMissing(f"{CRDS_ENV} is not set: {hint}")
    folder = Path(value)
    missing = [name for name in CRD_FILES if not (folder / name).is_file()]
    if missing:
        raise CrdsMissing(f"{folder} lacks {', '.join(missing)}: {hint}")
    return folder


def _path(obj: dict[str, Any], *, name: str | None = None, subresource: str | None = None) -> str:
    prefix, plural, namespaced = _KINDS[obj["kind"]]
    parts = [prefix]
    if namespaced:
        parts += ["namespaces", obj["metadata"]["namespace"]]
    parts.append(plural)
    if name:
        parts.append(name)
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


class Installer:
    """Creates and deletes manifests with one ApiClient (raw JSON, no models)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def call(self, method: str, path: str, *, body: Any = None, content_type: str = "application/json",
             query: list[tuple[str, Any]] | None = None) -> dict[str, Any]:
        """One request, JSON in and out, no model classes."""
        _, url, headers, payload, _ = self.api.param_serialize(
            method=method, resource_path=path, query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, header_params=headers, body=payload)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=response.reason, body=data.decode(errors="replace"))
        return json.loads(data) if data else {}

    def create(self, obj: dict[str, Any], *, exist_ok: bool = False) -> dict[str, Any]:
        try:
            return self.call("POST", _path(obj), body=obj)
        except ApiException as err:
            if exist_ok and err.status == 409:
                return self.get(obj)
            raise

    def get(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.call("GET", _path(obj, name=obj["metadata"]["name"]))

    def exists(self, obj: dict[str, Any]) -> bool:
        try:
            self.get(obj)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        return self.call("PATCH", _path(obj, name=obj["metadata"]["name"], subresource="status"),
                         body={"status": status}, content_type="application/merge-patch+json")

    def delete(self, obj: dict[str, Any], *, grace: int | None = None) -> None:
        # NB: the options go in the body: with a body, the API server ignores them in the query.
        options: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        try:
            self.call("DELETE", _path(obj, name=obj["metadata"]["name"]), body=options)
        except ApiException as err:
            if err.status != 404:
                raise

    def list(self, kind: str, *, namespace: str | None = None, selector: str | None = None) -> list[dict[str, Any]]:
        stub = {"kind": kind, "metadata": {"namespace": namespace}}
        prefix, plural, namespaced = _KINDS[kind]
        path = _path(stub) if namespaced and namespace else f"{prefix}/{plural}"
        query = [("labelSelector", selector)] if selector else []
        items = self.call("GET", path, query=query).get("items", [])
        for item in items:  # list items carry no kind of their own
            item["kind"] = kind
        return items


def wait_until(check: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Wait for a condition of the control plane (not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def install_crds(installer: Installer, folder: Path | None = None) -> None:
    """The ClusterPolicy and NVIDIADriver CRDs from the reference folder (all a stand-in
    fleet needs, and what the inventory reads)."""
    folder = folder or crds_folder()
    docs = [doc for file in CRD_FILES for doc in yaml.safe_load_all((folder / file).read_text())
            if doc and doc.get("kind") == "CustomResourceDefinition"]
    create_crds(installer, docs)


def create_crds(installer: Installer, crds: list[dict[str, Any]]) -> None:
    """Create CRDs (those already there are kept) and wait until each is established."""
    names = [installer.create(doc, exist_ok=True)["metadata"]["name"] for doc in crds]

    def established() -> bool:
        for name in names:
            crd = installer.get({"kind": "CustomResourceDefinition", "metadata": {"name": name}})
            conditions = (crd.get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    wait_until(established, timeout=30, what=f"CRDs {', '.join(names)} to be established")


def apply_fleet(installer: Installer, spec: fl.FleetSpec, *, advertise: bool = False) -> None:
    """Create every object of the fleet. With the real operator (running, see
    Environment.apply_fleet) that is the nodes, the ClusterPolicy or NVIDIADriver CRs and
    the workloads; a stand-in fleet also gets the operator's part from `_stand_in`.
    `advertise` creates nodes already advertising their GPUs (for fleets run without the
    operand simulator, e.g. benchmarks)."""
    for namespace in fl.namespaces(spec):
        installer.create({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": namespace, "labels": {fl.FLEET_LABEL: spec.name}}},
                         exist_ok=True)
    for index in range(1, spec.system_nodes + 1):
        installer.create(fl.system_node_object(spec, index), exist_ok=True)
    for pool in spec.pools:
        for name in fl.pool_node_names(pool):
            installer.create(fl.node_object(spec, pool, name, advertise=advertise), exist_ok=True)
    if spec.operator.installed:
        _install_operator(installer, spec)
    for workload in spec.workloads:
        for obj in fl.workload_objects(spec, workload):
            installer.create(obj, exist_ok=True)


def _install_operator(installer: Installer, spec: fl.FleetSpec) -> None:
    """What a GPU Operator install holds besides the operator's own work: the
    ClusterPolicy (and NVIDIADriver CRs), the simulator's faults ConfigMap, and the
    operator's Deployment as Helm makes it (the operator itself runs as a process beside
    the control plane, so this Deployment is how readers find its version)."""
    op = spec.operator
    policy = installer.create(fl.cluster_policy_object(spec), exist_ok=True)
    installer.create({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": fl.FAULTS_CONFIGMAP, "namespace": op.namespace},
                      "data": {fl.FAULT_CRASHLOOP_VERSIONS: ",".join(spec.crashloop_driver_versions),
                               fl.FAULT_CHECK_FAILING_VERSIONS: ",".join(spec.check_failing_driver_versions),
                               fl.FAULT_NO_PRECOMPILED_KERNELS: ",".join(spec.no_precompiled_kernels)}},
                     exist_ok=True)
    drivers = [installer.create(fl.nvidia_driver_object(spec, pool), exist_ok=True)
               for pool in spec.pools] if op.use_nvidia_driver_crd else []
    if not op.real:
        _stand_in(installer, spec, policy, drivers)
    installer.create(fl.operator_deployment(spec), exist_ok=True)


def _stand_in(installer: Installer, spec: fl.FleetSpec, policy: dict[str, Any],
              drivers: list[dict[str, Any]]) -> None:
    """The operator's part, for a fleet that names why the real operator cannot play it
    (`operator.stand_in`): a ready ClusterPolicy and NVIDIADrivers, the mig-parted
    ConfigMap and the operand DaemonSets (deploy labels are on the nodes already)."""
    op = spec.operator
    installer.patch_status(policy, {"state": "ready", "namespace": op.namespace})
    installer.create({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": fl.MIG_PARTED_CONFIGMAP, "namespace": op.namespace},
                      "data": {"config.yaml": fl.default_mig_parted_config()}}, exist_ok=True)
    policy_owner = fl._owner("ClusterPolicy", "nvidia.com/v1", policy["metadata"]["name"],
                             policy["metadata"]["uid"])
    for name, deploy in fl.OPERANDS:
        if deploy == "driver" and op.use_nvidia_driver_crd:
            continue
        image = fl.driver_image(op.driver_version) if deploy == "driver" else f"nvcr.io/nvidia/k8s/{name}:{op.version}"
        installer.create(fl.operand_daemonset(spec, name=name, deploy=deploy, owner=policy_owner, image=image),
                         exist_ok=True)
    for pool, driver in zip(spec.pools, drivers):
        installer.patch_status(driver, {"state": "ready"})
        owner = fl._owner("NVIDIADriver", "nvidia.com/v1alpha1", driver["metadata"]["name"],
                          driver["metadata"]["uid"])
        installer.create(fl.operand_daemonset(
            spec, name=fl.daemonset_name_for_driver(pool), deploy="driver", owner=owner,
            image=fl.driver_image(fl.pool_driver_version(spec, pool)),
            extra_selector={pool.label_key: pool.name}), exist_ok=True)


def delete_fleet(installer: Installer, *, timeout: float = 90) -> None:
    """Remove every object a fleet made, and wait until it is gone. Pods are removed
    with no grace period first, so a namespace never waits on a kubelet."""
    selector = fl.FLEET_LABEL
    namespaces = [ns["metadata"]["name"] for ns in installer.list("Namespace", selector=selector)]
    # The operator's namespace goes with the fleet even when something made it before the
    # fleet did (a test granting the bot its Role there first): left behind, the next
    # fleet would find its objects, the faults ConfigMap among them, already there and keep them.
    operator_namespace = {"kind": "Namespace", "metadata": {"name": NAMESPACE}}
    if NAMESPACE not in namespaces and installer.exists(operator_namespace):
        namespaces.append(NAMESPACE)
    for kind in ("ClusterPolicy", "NVIDIADriver"):
        try:
            for obj in installer.list(kind, selector=selector):
                installer.delete(obj)
        except ApiException as err:
            if err.status != 404:  # CRDs not installed
                raise
    for namespace in namespaces:
        for kind in ("DaemonSet", "Deployment"):
            for obj in installer.list(kind, namespace=namespace):
                installer.delete(obj)
        for pod in installer.list("Pod", namespace=namespace):
            installer.delete(pod, grace=0)
        installer.delete({"kind": "Namespace", "metadata": {"name": namespace}})
    nodes = installer.list("Node", selector=selector)
    # Pods of other namespaces bound to the fleet's nodes (gpuops's check pods in its own
    # namespace): the pod garbage collector would take them only after its quarantine.
    names = {node["metadata"]["name"] for node in nodes}
    for pod in installer.list("Pod"):
        if pod["spec"].get("nodeName") in names and pod["metadata"]["namespace"] not in namespaces:
            installer.delete(pod, grace=0)
    for node in nodes:
        installer.delete(node)

    def gone() -> bool:
        if installer.list("Node", selector=selector):
            return False
        remaining = {ns["metadata"]["name"] for ns in installer.list("Namespace")}
        stuck = remaining.intersection(namespaces)
        for namespace in stuck:  # pods recreated by a controller before it stopped
            for pod in installer.list("Pod", namespace=namespace):
                installer.delete(pod, grace=0)
        return not stuck

    wait_until(gone, timeout=timeout, what="the fleet's nodes and namespaces to be deleted")


def apply_manifests(installer: Installer, objects: Iterable[dict[str, Any]]) -> None:
    for obj in objects:
        installer.create(obj, exist_ok=True)
