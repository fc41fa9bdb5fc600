"""The watch cache over time: real bookmarks from the API server, watches that time out
and resume, and an API server that goes away and comes back. The log stays quiet while
all is well and says once per resource that the API is lost, and once that it is back."""

from __future__ import annotations

import datetime as dt
import logging
from urllib.parse import urlparse

import pytest

from testenv.install import wait_until
from tests.integration.forwarder import Forwarder, kubeconfig_through
from tests.integration.inventory_helpers import CONFIG
from workflows.fleet.watchcache import FleetCache
from workflows.kube.gateway import KubeGateway


RESOURCES = ("nodes", "pods", "deployments", "daemonsets", "toolkits", "clusterpolicies", "nvidiadrivers")


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_watches_stay_open_across_real_bookmarks_without_a_failure(gpu_operator_crds, caplog):
    caplog.set_level(logging.INFO)
    gateway = KubeGateway.connect(kubeconfig=gpu_operator_crds.kubeconfig, context="admin")
    # The API server sends a bookmark a minute into a watch and another two seconds
    # before it times out (kube-apiserver v1.37: none in a watch shorter than a minute).
    cache = FleetCache(gateway, settings=CONFIG.inventory_settings(), watch_timeout=65).start()
    try:
        # Pods first: a pod BOOKMARK says `"containers": null`, which broke the watch once.
        wait_until(lambda: cache.bookmarks("pods") >= 2 and cache.watches("pods") >= 2,
                   timeout=300, what="two pod bookmarks and a resumed pod watch")
        _a_new_node_arrives_by_watch(gpu_operator_crds, cache, "after-bookmarks", when="after the bookmarks")
    finally:
        gpu_operator_crds.installer().delete({"kind": "Node", "metadata": {"name": "after-bookmarks"}})
        cache.stop()

    assert _lines(caplog, logging.WARNING) == []
    assert [cache.relists(r) for r in RESOURCES] == [0] * len(RESOURCES)


def _a_new_node_arrives_by_watch(cluster, cache: FleetCache, name: str, *, when: str) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}}}
    cluster.installer().create(node)
    wait_until(lambda: name in cache.fleet(dt.datetime.now(dt.timezone.utc), max_age=dt.timedelta(0)).nodes,
               timeout=30, what=f"a node made {when} to arrive by watch")


def test_a_lost_api_is_logged_once_per_resource_and_once_more_when_it_is_back(gpu_operator_crds, caplog,
                                                                             tmp_path):
    server = urlparse(gpu_operator_crds.plane.server)
    forwarder = Forwarder((server.hostname, server.port)).start()
    kubeconfig = kubeconfig_through(gpu_operator_crds.kubeconfig, forwarder, tmp_path)
    cache = FleetCache(KubeGateway.connect(kubeconfig=kubeconfig, context="admin"),
                       settings=CONFIG.inventory_settings(), watch_timeout=30).start()
    try:
        caplog.clear()
        caplog.set_level(logging.DEBUG, logger="gpuops")
        forwarder.cut()
        # Several tries per resource (backoff 0.5 s, 1 s, 2 s, ...) while it is away.
        wait_until(lambda: sum("failed again" in m for m in _lines(caplog, logging.DEBUG)) >= 2 * len(RESOURCES),
                   timeout=30, what="the cache to try again while the API is away")
        lost = _lines(caplog, logging.WARNING)
        forwarder.restore()
        wait_until(lambda: sum("answers again" in m for m in _lines(caplog, logging.INFO)) == len(RESOURCES),
                   timeout=60, what="every resource to reach the API again")
        # Still watching: a change made now arrives by watch.
        _a_new_node_arrives_by_watch(gpu_operator_crds, cache, "after-loss", when="after the API came back")
    finally:
        cache.stop()
        forwarder.cut()
        gpu_operator_crds.installer().delete({"kind": "Node", "metadata": {"name": "after-loss"}})

    assert sorted(m.split(" of ", 1)[1].split(" failed")[0] for m in lost) == sorted(RESOURCES)
    assert all("trying again with backoff" in m for m in lost)
    assert not any(r.name.startswith("urllib3") and r.levelno >= logging.WARNING for r in caplog.records)
