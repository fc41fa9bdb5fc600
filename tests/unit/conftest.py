"""The unit tests' own fixtures: `make` hands out the builders of tests/unit/fleet_builder.py,
`fake_cluster` an in-memory cluster for the engine's tests (tests/unit/fake_cluster.py)."""

from __future__ import annotations

import pytest
from fake_cluster import FakeCluster
from fleet_builder import FleetBuilder


@pytest.fixture
def make() -> FleetBuilder:
    return FleetBuilder()


@pytest.fixture
def fake_cluster(make: FleetBuilder) -> FakeCluster:
    return FakeCluster(make.snapshot)
