"""The watch cache backs off while the API does not answer, and starts over once a watch
opens: a quiet resource whose connection drops now and then is watched again at once,
not after the longest backoff.

Found by tests/reliability/controlplane/test_api_faults.py: with connections cut every few seconds,
a resource with no events between cuts (ClusterPolicies, Deployments, between runs the
pods) waited longer after each cut, up to 30 s, and fell a minute behind the API."""

from __future__ import annotations

import threading
import time
from typing import Any

from workflows.fleet.settings import InventorySettings
from workflows.fleet.watchcache import FleetCache
from workflows.kube.errors import Unavailable
from workflows.kube.gateway.paths import NVIDIA_DRIVERS
from workflows.kube.gateway.reading import ListResult


class _Opened:
    status = 200

    def shutdown(self) -> None:
        pass


class _Gateway:
    """Every list is empty; NVIDIADrivers' watch is refused `refusals` times (the API
    away), then opens and drops at once (a cut connection); every other watch waits."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.calls: list[float] = []
        self.stopped = threading.Event()

    def list(self, path: str, **_: Any) -> ListResult:
        return ListResult(items=[], resource_version="1")

    def server_version(self) -> str:
        return "v1.37.2"

    def watch(self, path: str, *, on_open: Any = None, **_: Any):
        if path != NVIDIA_DRIVERS:
            self.stopped.wait()
            return
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.refusals:
            raise Unavailable("connection refused")
        on_open(_Opened())
        raise Unavailable("connection reset by peer")
        yield  # a generator, as the gateway's watch is

    def close_idle_connections(self) -> None:
        pass


def test_a_watch_that_opened_and_dropped_is_tried_again_at_once_whatever_came_before():
    gateway = _Gateway(refusals=3)  # waits of 0.5, 1 and 2 s: the next would be 4 s
    cache = FleetCache(gateway, settings=InventorySettings()).start()  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 15
        while len(gateway.calls) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        gateway.stopped.set()
        cache.stop()
    assert len(gateway.calls) >= 6, gateway.calls
    gaps = [b - a for a, b in zip(gateway.calls, gateway.calls[1:])]
    assert gaps[2] >= 1.9  # still backing off while the API does not answer
    # Each drop after an open waits the shortest backoff, not 4, 8, 16 s.
    assert all(gap < 1.0 for gap in gaps[3:5]), gaps
