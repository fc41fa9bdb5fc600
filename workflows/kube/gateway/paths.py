"""Where the collections gpuops reads, watches and writes live in the API: the gateway
and the watch cache name them from here, nobody above builds a path."""

from __future__ import annotations

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
DEPLOYMENTS = "/apis/apps/v1/deployments"
DAEMONSETS = "/apis/apps/v1/daemonsets"
CLUSTER_POLICIES = "/apis/nvidia.com/v1/clusterpolicies"
NVIDIA_DRIVERS = "/apis/nvidia.com/v1alpha1/nvidiadrivers"
RESOURCE_QUOTAS = "/api/v1/resourcequotas"


def leases(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def kube_events_in(namespace: str) -> str:
    """Events (events.k8s.io/v1) of one namespace."""
    return f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
