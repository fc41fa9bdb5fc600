"""Writes: node patches (cordon, uncordon, labels, annotations, taints), custom-object
spec patches, evictions, pod deletes and creates, the leader election's Lease, and the
Events (events.k8s.io/v1) that tell what gpuops did to an object.

Every write takes `dry_run`: the API server then authorises, validates and admits it
(RBAC, webhooks, PodDisruptionBudgets) but persists nothing (query dryRun=All). Each
write is logged at INFO as "mutation: <what> <target>" before it is sent, and as
"mutation refused: ..." when the server refused it, so the log says exactly what
gpuops changed in the cluster."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from workflows.kube.errors import KubeError
from workflows.kube.gateway.client import KubeClient
from workflows.kube.gateway.decoding import (
    Json,
    custom_object_from_json,
    lease_from_json,
    node_from_json,
    pod_from_json,
)
from workflows.kube.gateway.paths import NODES, kube_events_in, leases
from workflows.kube.objects import CustomObject, LeaseRecord, NodeObject, PodObject, Taint

log = logging.getLogger("gpuops.kube")


def _micro_time(at: dt.datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with microseconds."""
    return at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# An Event is a report, never a step: its calls get a short deadline of their own (connect,
# read) and no retry on 429, so a slow or throttling events API costs a sender seconds,
# not the minute a node patch may take. The API refuses a note over 1 kB; bodies larger
# than `EVENT_BODY_CAP` are refused here before they are sent.
EVENT_CALL_TIMEOUT = (3.0, 10.0)
EVENT_BODY_CAP = 4096


class KubeWrites(KubeClient):
    """The gateway's writes."""

    def _mutate(self, what: str, target: str, method: str, path: str, *, body: Any, dry_run: bool,
                content_type: str = "application/json", retry_too_many: bool = True,
                quiet: bool = False, timeout: tuple[float, float] = (5, 60)) -> Json:
        query: list[tuple[str, Any]] = [("dryRun", "All")] if dry_run else []
        say = log.debug if quiet else log.info
        say("mutation: %s %s%s", what, target, " (dry run)" if dry_run else "")
        try:
            return self.request(method, path, query=query, body=body, content_type=content_type,
                                retry_too_many=retry_too_many, timeout=timeout)
        except KubeError as err:
            # The server refused it (a conflict, a PDB): nothing was changed.
            say("mutation refused: %s %s (%s %s)", what, target, err.status, err.reason)
            raise

    # --- nodes -------------------------------------------------------------------------
    def _patch_node(self, what: str, name: str, *, unschedulable: bool | None = None,
                    labels: Mapping[str, str | None] | None = None,
                    annotations: Mapping[str, str | None] | None = None,
                    taints: Sequence[Taint] | None = None,
                    resource_version: str | None = None, dry_run: bool) -> NodeObject:
        metadata: Json = {}
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        if resource_version:
            # NB: a merge patch that names a resourceVersion applies only to that version
            # (409 otherwise), so a decision made on what was read cannot land on a node
            # someone changed meanwhile.
            metadata["resourceVersion"] = resource_version
        body: Json = {"metadata": metadata}
        spec: Json = {}
        if unschedulable is not None:
            spec["unschedulable"] = unschedulable
        if taints is not None:
            # A merge patch replaces the whole list: exactly these taints afterwards.
            spec["taints"] = [{"key": t.key, "value": t.value or None, "effect": t.effect} for t in taints] or None
        if spec:
            body["spec"] = spec
        return node_from_json(self._mutate(what, f"node {name}", "PATCH", f"{NODES}/{name}", body=body,
                                           dry_run=dry_run, content_type="application/merge-patch+json"))

    def cordon_node(self, name: str, *, annotations: Mapping[str, str | None],
                    resource_version: str | None, dry_run: bool) -> NodeObject:
        """Mark the node unschedulable and set `annotations` (None removes a key), in one patch."""
        return self._patch_node("cordon", name, unschedulable=True, annotations=annotations,
                                resource_version=resource_version, dry_run=dry_run)

    def uncordon_node(self, name: str, *, annotations: Mapping[str, str | None],
                      resource_version: str | None, dry_run: bool) -> NodeObject:
        """Mark the node schedulable and set `annotations` (None removes a key), in one patch."""
        return self._patch_node("uncordon", name, unschedulable=False, annotations=annotations,
                                resource_version=resource_version, dry_run=dry_run)

    def restore_node(self, name: str, *, labels: Mapping[str, str | None], taints: Sequence[Taint],
                     resource_version: str | None, dry_run: bool) -> NodeObject:
        """Set (or remove, None) `labels` and make the node's taints exactly `taints`, in one patch."""
        return self._patch_node("restore", name, labels=labels, taints=taints, resource_version=resource_version,
                                dry_run=dry_run)

    def annotate_node(self, name: str, *, annotations: Mapping[str, str | None],
                      resource_version: str | None, dry_run: bool) -> NodeObject:
        """Set or remove (None) node annotations, leaving schedulability alone."""
        return self._patch_node("annotate", name, annotations=annotations,
                                resource_version=resource_version, dry_run=dry_run)

    def label_node(self, name: str, *, labels: Mapping[str, str | None], dry_run: bool,
                   resource_version: str | None = None,
                   annotations: Mapping[str, str | None] | None = None) -> NodeObject:
        """Set or remove (None) node labels, and `annotations` in the same patch."""
        return self._patch_node("label", name, labels=labels, annotations=annotations,
                                resource_version=resource_version, dry_run=dry_run)

    # --- the GPU Operator's custom resources -------------------------------------------
    def patch_custom_object(self, path: str, name: str, *, spec: Json, resource_version: str | None,
                            dry_run: bool) -> CustomObject:
        """Merge-patch the spec of a ClusterPolicy or NVIDIADriver (never a strategic-merge
        patch: a custom resource has no patch strategy). With `resource_version` the patch
        applies only to that version of the object (409 otherwise)."""
        body: Json = {"spec": spec}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return custom_object_from_json(self._mutate("patch", f"{path.rsplit('/', 1)[-1]} {name}", "PATCH",
                                                    f"{path}/{name}", body=body, dry_run=dry_run,
                                                    content_type="application/merge-patch+json"))

    # --- pods --------------------------------------------------------------------------
    def evict_pod(self, namespace: str, name: str, *, uid: str, dry_run: bool) -> None:
        """Ask the Eviction API (policy/v1) to remove a pod, so PodDisruptionBudgets apply.

        Raises TooManyRequests (429) at once, without retrying, when a budget does not
        allow the disruption now; Conflict when the pod named is no longer the pod with
        `uid` (it was replaced); NotFound when it is gone."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        self._mutate("evict", f"pod {namespace}/{name} uid={uid}", "POST",
                     f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body, dry_run=dry_run,
                     retry_too_many=False)

    def delete_pod(self, namespace: str, name: str, *, uid: str, dry_run: bool,
                   grace_seconds: int | None = None) -> None:
        """Delete a pod (no PodDisruptionBudget applies), only if it is still the pod with
        `uid`: Conflict otherwise, NotFound when it is gone."""
        body: Json = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        self._mutate("delete", f"pod {namespace}/{name} uid={uid}", "DELETE",
                     f"/api/v1/namespaces/{namespace}/pods/{name}", body=body, dry_run=dry_run)

    def create_pod(self, namespace: str, manifest: Json, *, dry_run: bool) -> PodObject:
        """Create a pod from `manifest` (a v1 Pod); Conflict when one of its name exists,
        NotFound when the namespace does not."""
        name = manifest.get("metadata", {}).get("name", "?")
        return pod_from_json(self._mutate("create", f"pod {namespace}/{name}", "POST",
                                          f"/api/v1/namespaces/{namespace}/pods", body=manifest, dry_run=dry_run))

    # --- the leader election's Lease ---------------------------------------------------
    def create_lease(self, namespace: str, name: str, *, holder: str, duration_seconds: int,
                     at: dt.datetime, dry_run: bool = False) -> LeaseRecord:
        """Create the Lease held by `holder`; Conflict when it exists already."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration_seconds,
                         "acquireTime": _micro_time(at), "renewTime": _micro_time(at),
                         "leaseTransitions": 0}}
        return lease_from_json(self._mutate("create lease", f"{namespace}/{name}", "POST", leases(namespace),
                                            body=body, dry_run=dry_run, quiet=True))

    def update_lease(self, lease: LeaseRecord, *, dry_run: bool = False) -> LeaseRecord:
        """Replace the Lease with `lease`, only if it is still at `lease.resource_version`
        (Conflict otherwise: someone else wrote it first)."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": lease.name, "namespace": lease.namespace,
                             "resourceVersion": lease.resource_version},
                "spec": {"holderIdentity": lease.holder or None,
                         "leaseDurationSeconds": lease.duration_seconds,
                         "acquireTime": _micro_time(lease.acquire_time) if lease.acquire_time else None,
                         "renewTime": _micro_time(lease.renew_time) if lease.renew_time else None,
                         "leaseTransitions": lease.transitions}}
        return lease_from_json(self._mutate("update lease", f"{lease.namespace}/{lease.name}", "PUT",
                                            f"{leases(lease.namespace)}/{lease.name}", body=body,
                                            dry_run=dry_run, quiet=True))

    # --- Events (events.k8s.io/v1) ---------------------------------------------------
    def create_kube_event(self, namespace: str, body: Json) -> None:
        """Create the Event `body` (an events.k8s.io/v1 Event with its metadata.name) in
        `namespace`; Conflict when one of its name exists. ValueError, before any call, for
        a body over `EVENT_BODY_CAP` bytes of JSON."""
        size = len(json.dumps(body).encode())
        if size > EVENT_BODY_CAP:
            raise ValueError(f"an Event of {size} bytes is over the {EVENT_BODY_CAP}-byte cap")
        name = body.get("metadata", {}).get("name", "?")
        self._mutate("create event", f"{namespace}/{name}", "POST", kube_events_in(namespace), body=body,
                     dry_run=False, retry_too_many=False, quiet=True, timeout=EVENT_CALL_TIMEOUT)

    def patch_kube_event_series(self, namespace: str, name: str, *, count: int, last_observed: dt.datetime) -> None:
        """Count a repeat of an Event: its series (`count` occurrences, the last at
        `last_observed`), nothing else (the rest of an Event cannot change). NotFound when
        it is gone (expired, deleted)."""
        body = {"series": {"count": count, "lastObservedTime": _micro_time(last_observed)}}
        self._mutate("patch event", f"{namespace}/{name}", "PATCH", f"{kube_events_in(namespace)}/{name}", body=body,
                     dry_run=False, content_type="application/merge-patch+json", retry_too_many=False, quiet=True,
                     timeout=EVENT_CALL_TIMEOUT)
