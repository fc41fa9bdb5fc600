"""Reads: whole collections listed page by page (as raw JSON dicts or straight into a
wire schema), and the single objects and small lists the engine, the plans and the
previews read fresh rather than from the watch cache."""

from __future__ import annotations

import builtins
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from workflows.kube import wire
from workflows.kube.errors import Gone
from workflows.kube.gateway.client import KubeClient
from workflows.kube.gateway.decoding import (
    Json,
    custom_object_from_json,
    disruption_budget_from_json,
    driver_template_from_json,
    lease_from_json,
    node_from_json,
    page_reader,
    pod_from_json,
    pod_on_node_from_json,
)
from workflows.kube.gateway.paths import CLUSTER_POLICIES, NODES, PODS, RESOURCE_QUOTAS, leases
from workflows.kube.objects import (
    CustomObject,
    DisruptionBudget,
    DriverTemplate,
    LeaseRecord,
    NodeObject,
    PodObject,
    PodOnNode,
    ResourceQuotaObject,
)


@dataclass(frozen=True)
class ListResult:
    items: list[Any]  # JSON dicts, or schema instances when listed with a schema
    resource_version: str


class KubeReads(KubeClient):
    """The gateway's reads."""

    def list(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None,
             page_size: int = 500, on_page: Callable[[list[Any]], None] | None = None,
             schema: type[msgspec.Struct] | None = None) -> ListResult:
        """Every item of a collection, page by page, as raw JSON dicts or, with `schema`
        (see `workflows.kube.wire`), decoded straight into that schema.

        With `on_page`, each page is handed over as it arrives while the next one is
        being fetched (the server's work overlaps ours), and `items` comes back empty."""
        read_page = page_reader(path, schema)
        pages: queue.Queue[list[Any] | None] = queue.Queue(maxsize=2)
        consumer: threading.Thread | None = None
        failure: list[BaseException] = []
        if on_page is not None:
            def consume() -> None:
                while (page_items := pages.get()) is not None:
                    if not failure:
                        try:
                            on_page(page_items)
                        except BaseException as err:  # noqa: BLE001 - re-raised below
                            failure.append(err)
            consumer = threading.Thread(target=consume, name=f"list{path}", daemon=True)
            consumer.start()
        items: list[Any] = []
        token: str | None = None
        try:
            while True:
                query: list[tuple[str, Any]] = [("limit", page_size)]
                if label_selector:
                    query.append(("labelSelector", label_selector))
                if field_selector:
                    query.append(("fieldSelector", field_selector))
                if token:
                    query.append(("continue", token))
                try:
                    page_items, token, version = read_page(self._fetch("GET", path, query=query))
                except Gone:
                    if consumer is not None:
                        raise  # pages already handed over cannot be taken back
                    # The continue token expired between pages: start over for a consistent list.
                    items, token = [], None
                    continue
                if consumer is not None:
                    pages.put(page_items)
                else:
                    items.extend(page_items)
                if not token:
                    return ListResult(items=items, resource_version=version)
        finally:
            if consumer is not None:
                pages.put(None)
                consumer.join()
                if failure:
                    raise failure[0]

    # --- reads the engine needs fresh (not from the cache) -----------------------------
    def get_node(self, name: str) -> NodeObject:
        return node_from_json(self.request("GET", f"{NODES}/{name}"))

    def get_node_json(self, name: str) -> Json:
        """Node `name` as the API server sends it, managedFields included (the watch
        cache keeps neither them nor its taints' owners); for `/gpu node`."""
        return self.request("GET", f"{NODES}/{name}", timeout=(3, 5))

    def server_version(self) -> str | None:
        """The API server's version (`GET /version`, its gitVersion such as "v1.31.4"),
        which every identity may read; None when it names none."""
        version = self.request("GET", "/version").get("gitVersion")
        return version if isinstance(version, str) and version else None

    def may(self, verb: str, resource: str, *, group: str = "", namespace: str | None = None) -> bool:
        """Whether this identity may `verb` `resource` (in `namespace`; None: in every
        namespace), as the API server's authorizer answers (a SelfSubjectAccessReview,
        which every authenticated identity may ask)."""
        attributes: dict[str, str] = {"verb": verb, "resource": resource, "group": group}
        if namespace is not None:
            attributes["namespace"] = namespace
        answer = self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes}})
        return bool((answer.get("status") or {}).get("allowed"))

    def labels_with_owners(self, name: str) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Node `name`'s labels, each with the field managers that own it: label ->
        (value, managers), from the managedFields the watch cache does not keep."""
        found = self.request("GET", f"{NODES}/{name}")
        meta = found.get("metadata") or {}
        owners: dict[str, set[str]] = {}
        for entry in meta.get("managedFields") or ():
            fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
            for key in fields:
                if key.startswith("f:"):
                    owners.setdefault(key[2:], set()).add(str(entry.get("manager") or "unknown"))
        return {str(k): (str(v), tuple(sorted(owners.get(k, ())))) for k, v in (meta.get("labels") or {}).items()}

    def list_pods_on_node(self, node: str, *, label_selector: str | None = None) -> builtins.list[PodOnNode]:
        """Every pod bound to `node` (fieldSelector spec.nodeName), in every namespace."""
        result = self.list(PODS, field_selector=f"spec.nodeName={node}", label_selector=label_selector)
        return [pod_on_node_from_json(obj) for obj in result.items]

    def get_pod(self, namespace: str, name: str) -> PodOnNode:
        return pod_on_node_from_json(self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}"))

    def read_pod_log(self, namespace: str, name: str, *, container: str, limit_bytes: int) -> str:
        """The first `limit_bytes` of a container's log (a finished pod's too), as text."""
        data = self._fetch("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log",
                           query=[("container", container), ("limitBytes", limit_bytes)])
        return data[:limit_bytes].decode("utf-8", errors="replace")

    def get_custom_object(self, path: str, name: str) -> CustomObject:
        """A ClusterPolicy (`CLUSTER_POLICIES`) or NVIDIADriver (`NVIDIA_DRIVERS`), read fresh."""
        return custom_object_from_json(self.request("GET", f"{path}/{name}"))

    def get_cluster_policy(self, name: str) -> CustomObject:
        return self.get_custom_object(CLUSTER_POLICIES, name)

    def get_config_map_data(self, namespace: str, name: str) -> dict[str, str]:
        found = self.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        return {str(k): str(v) for k, v in (found.get("data") or {}).items()}

    def list_gpu_pods(self) -> builtins.list[PodObject]:
        """Every pod in the cluster that asks for a GPU resource (one list, read fresh)."""
        return [pod for pod in (pod_from_json(obj) for obj in self.list(PODS).items) if pod.gpu_requests]

    def list_pods_bound_to(self, node: str) -> builtins.list[PodObject]:
        """Every pod bound to `node`, as the inventory's views (for previews)."""
        return [pod_from_json(obj) for obj in self.list(PODS, field_selector=f"spec.nodeName={node}").items]

    def list_driver_templates(self, namespace: str) -> builtins.list[DriverTemplate]:
        """The driver DaemonSets (app.kubernetes.io/component=nvidia-driver) of `namespace`,
        read fresh: what each would run on the nodes it selects."""
        path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets"
        return [driver_template_from_json(obj)
                for obj in self.list(path, label_selector="app.kubernetes.io/component=nvidia-driver").items]

    def list_disruption_budgets(self, namespace: str) -> builtins.list[DisruptionBudget]:
        """The PodDisruptionBudgets of one namespace (policy/v1)."""
        path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
        return [disruption_budget_from_json(obj) for obj in self.list(path).items]

    def list_resource_quotas(self) -> builtins.list[ResourceQuotaObject]:
        """Every ResourceQuota of the cluster that names a GPU resource, its GPU entries
        only (one list, read fresh)."""
        found = (wire.resource_quota_view(q) for q in self.list(RESOURCE_QUOTAS, schema=wire.ResourceQuotaWire).items)
        return [quota for quota in found if quota.hard]

    def get_lease(self, namespace: str, name: str) -> LeaseRecord:
        return lease_from_json(self.request("GET", f"{leases(namespace)}/{name}"))
