"""Safety rules a one-line change could break with the rest of the suite still green:
each test here fails when its rule is broken. The real engine runs over the in-memory
cluster (tests/unit/fake_cluster.py), pass by pass, on a clock the test moves.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_engine_safety import Drain, mark

from storage import freezes as stored_freezes
from storage import runs as stored_runs
from storage.database import Database, open_database
from workflows.config import GpuopsConfig
from workflows.engine.lease import AlwaysHeld
from workflows.engine.loop import Engine
from workflows.engine.runs import RunService
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.requests.service import RequestService

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_database(tmp_path / "gpuops.db")
    yield database
    database.close()


@pytest.fixture
def cluster(fake_cluster, make):
    """Ten nodes of train-a, each with its operand pods (gpu-01 ... gpu-10)."""
    for number in range(1, 11):
        node = f"gpu-{number:02d}"
        fake_cluster.add_node(make.node(node, pool="train-a"))
        for index, pod in enumerate(make.operands(node)):
            fake_cluster.add_pod(pod, uid=f"uid-{pod.name}-{index}")
    return fake_cluster


# ------------------------------------------------------------------ validation before giving a node back


def test_a_drained_node_whose_device_plugin_marks_a_gpu_unhealthy_is_not_given_back(db, cluster):
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")
    drain.drive(lambda: drain.step("gpu-01", "cordon") == "done")
    # The device plugin marks one GPU unhealthy: capacity still 8, allocatable 7.
    node = cluster.node("gpu-01")
    cluster.nodes["gpu-01"] = dataclasses.replace(node, allocatable={**node.allocatable, "nvidia.com/gpu": "7"})

    drain.drive(drain.finished)

    assert drain.run().state == "failed"
    assert drain.step("gpu-01", "validate") == "failed" and drain.step("gpu-01", "uncordon") == "skipped"
    assert ("uncordon", "gpu-01") not in cluster.did()
    assert cluster.node("gpu-01").unschedulable and mark(cluster, "gpu-01")["run"] == drain.run_id  # type: ignore[index]


def test_a_drained_node_whose_validator_is_not_ready_is_not_given_back(db, cluster, make):
    drain = Drain(db, cluster, "wait", words="gpu-01 for 10m rack move")
    drain.drive(lambda: drain.step("gpu-01", "cordon") == "done")
    # The operator validator's CUDA check fails: its pod is no longer Ready.
    (uid,) = [u for u, p in cluster.pods.items()
              if p.pod.node_name == "gpu-01" and p.pod.name.startswith("nvidia-operator-validator")]
    cluster.terminate(uid)
    cluster.add_pod(make.validator_pod("gpu-01", ready=False), uid="uid-validator-failing")

    drain.drive(drain.finished)

    assert drain.run().state == "failed"
    assert "validator" in (drain.run().halted_reason or "")
    assert drain.step("gpu-01", "validate") == "failed" and drain.step("gpu-01", "uncordon") == "skipped"
    assert ("uncordon", "gpu-01") not in cluster.did()
    assert cluster.node("gpu-01").unschedulable
