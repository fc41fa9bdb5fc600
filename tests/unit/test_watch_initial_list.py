"""The first list keeps the operator's operand pods even when the pods arrive before the
objects that name the operator's namespace: a dcgm-exporter or feature-discovery pod
carries no label saying it is the operator's, only its namespace does, and a quiet one
dropped at the start would stay missing until its next change (days, on a calm fleet).

The gateway's stand-in answers lists only: the pods at once, the operator's Deployment
only after the pods' list returned (or 2 s), the order that lost the pods."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import msgspec

from workflows.fleet.settings import InventorySettings
from workflows.fleet.watchcache import FleetCache
from workflows.kube import wire
from workflows.kube.gateway.paths import DEPLOYMENTS, PODS
from workflows.kube.gateway.reading import ListResult

OPERATOR = "gpu-operator"


class _Gateway:
    def __init__(self) -> None:
        self.pods_listed = threading.Event()
        self.stopped = threading.Event()

    def list(self, path: str, *, on_page: Any = None, **_: Any) -> ListResult:
        items: list[Any] = []
        if path == PODS:
            items = [msgspec.convert({"metadata": {"name": "gpu-feature-discovery-x1", "namespace": OPERATOR,
                                                   "labels": {"app": "gpu-feature-discovery"}},
                                      "spec": {"nodeName": "gpu-1", "containers": [{"name": "gfd"}]}},
                                     wire.PodWire)]
        elif path == DEPLOYMENTS:
            self.pods_listed.wait(timeout=2)
            items = [msgspec.convert({"metadata": {"name": "gpu-operator", "namespace": OPERATOR,
                                                   "labels": {"app": "gpu-operator"}}}, wire.DeploymentWire)]
        if on_page is not None:
            on_page(items)
        if path == PODS:
            self.pods_listed.set()
        return ListResult(items=[] if on_page is not None else items, resource_version="1")

    def server_version(self) -> str:
        return "v1.37.2"

    def close_idle_connections(self) -> None:
        pass


def test_operand_pods_listed_before_the_operators_namespace_is_known_are_kept():
    gateway = _Gateway()
    cache = FleetCache(gateway, settings=InventorySettings()).start(watch=False)  # type: ignore[arg-type]
    snapshot = cache.snapshot(dt.datetime.now(dt.timezone.utc))

    assert snapshot.operator_namespace == OPERATOR
    assert [f"{p.namespace}/{p.name}" for p in snapshot.pods] == [f"{OPERATOR}/gpu-feature-discovery-x1"]
