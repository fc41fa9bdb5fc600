"""What only the integration tests use: watch caches on the control plane, stopped after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.integration.inventory_helpers import CONFIG
from workflows.fleet.watchcache import FleetCache
from workflows.kube.gateway import KubeGateway


@pytest.fixture
def fleet_cache(cluster) -> Iterator[Callable[..., FleetCache]]:
    caches: list[FleetCache] = []

    def start(*, user: str = "admin", config=CONFIG, **kwargs) -> FleetCache:
        gateway = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context=user)
        cache = FleetCache(gateway, settings=config.inventory_settings(), **kwargs).start()
        caches.append(cache)
        return cache

    yield start
    for cache in caches:
        cache.stop()
