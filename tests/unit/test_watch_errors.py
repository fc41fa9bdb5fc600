"""A watch the server ends with an error event (other than 410) is followed by a fresh
list, not resumed from the same version: resuming meets the same event again, forever.

Found by tests/reliability/controlplane/test_api_faults.py: after etcd compactions, an API server
without a watch cache ended the pods watch with "Internal error occurred: etcd event
received with PrevKv=nil" (a deleted pod's previous state gone to the compaction) each
time it was resumed from the same version; the cache kept three deleted pods for as long
as no later compaction turned the version into a 410, and wrote a warning a retry.

The gateway's stand-in answers only lists and watches (as the gateway hands them over);
what the real API server sends is in the API-fault suite."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import Any

import msgspec
import pytest

from testenv.install import wait_until
from workflows.fleet.settings import InventorySettings
from workflows.fleet.watchcache import FleetCache
from workflows.kube import wire
from workflows.kube.errors import WatchError
from workflows.kube.gateway.paths import NVIDIA_DRIVERS
from workflows.kube.gateway.reading import ListResult

PREV_KV = ('Internal error occurred: etcd event received with PrevKv=nil '
           '(key="/registry/nvidia.com/nvidiadrivers/b", modRevision=15, type=DELETE)')


def _driver(name: str, version: str) -> wire.CustomObjectWire:
    return msgspec.convert({"kind": "NVIDIADriver", "metadata": {"name": name, "resourceVersion": version}},
                           wire.CustomObjectWire)


class _Opened:
    status = 200

    def shutdown(self) -> None:
        pass


class _Gateway:
    """NVIDIADrivers: listed as a and b at version 10, then (b deleted) as a at 20; a
    watch from 10 opens and ends with the error event, as often as it is asked; every
    other watch waits."""

    def __init__(self) -> None:
        self.lists = 0
        self.watched_from: list[str] = []
        self.stopped = threading.Event()

    def list(self, path: str, *, on_page: Any = None, **_: Any) -> ListResult:
        """As the gateway does with `on_page`: the items go to it, none come back."""
        if path != NVIDIA_DRIVERS:
            return ListResult(items=[], resource_version="1")
        self.lists += 1
        first = self.lists == 1
        on_page([_driver("a", "5"), _driver("b", "6")] if first else [_driver("a", "5")])
        return ListResult(items=[], resource_version="10" if first else "20")

    def server_version(self) -> str:
        return "v1.37.2"

    def watch(self, path: str, *, resource_version: str, on_open: Any = None, **_: Any):
        if path != NVIDIA_DRIVERS:
            self.stopped.wait()
            return
        self.watched_from.append(resource_version)
        on_open(_Opened())
        if resource_version == "10":
            raise WatchError(f"WATCH {path}: {PREV_KV}", status=500, api_message=PREV_KV)
        self.stopped.wait()
        return
        yield  # a generator, as the gateway's watch is

    def close_idle_connections(self) -> None:
        pass


def test_a_watch_ended_by_an_error_event_lists_again_and_drops_what_was_deleted(caplog: pytest.LogCaptureFixture):
    gateway = _Gateway()
    caplog.set_level(logging.INFO, logger="gpuops")
    cache = FleetCache(gateway, settings=InventorySettings()).start()  # type: ignore[arg-type]
    try:
        wait_until(lambda: gateway.watched_from[-1:] == ["20"], timeout=10, what="the watch from the new list")
        names = [d.name for d in cache.snapshot(dt.datetime.now(dt.timezone.utc)).nvidia_drivers]
    finally:
        gateway.stopped.set()
        cache.stop()

    assert gateway.watched_from == ["10", "20"]  # once from the broken version, then from the new list's
    assert names == ["a"]  # b's deletion, which the broken watch never delivered, is seen
    assert cache.relists("nvidiadrivers") == 1
    lines = [r for r in caplog.records if "nvidiadrivers" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO], [r.getMessage() for r in lines]
    assert "broke at 10" in lines[0].getMessage() and "PrevKv=nil" in lines[0].getMessage()
