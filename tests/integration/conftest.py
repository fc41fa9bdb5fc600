"""Fixtures for the integration tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from storage.database import open_database
from tests.integration.inventory_helpers import CONFIG
from workflows.fleet.watchcache import FleetCache
from workflows.kube.gateway import KubeGateway


@pytest.fixture
def db(tmp_path: Path):
    database = open_database(tmp_path / "gpuops.db")
    yield database
    database.close()


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
