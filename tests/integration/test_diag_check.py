"""DCGM's diagnostics as the check, on the real GPU Operator and the simulator's hardware,
as the bot's ServiceAccount: a pool whose `gpu_check` has `diag` runs `dcgmi diag` on
every GPU of each upgraded node before giving it back (then the pool's burn-in, a second
check pod); a memory test failing on GPU 3 of
the canary halts the run there, quoting the test and the GPU, with the node cordoned;
diagnostics that never end halt it when the pod's deadline passes. The simulator plays
DCGM's report (testenv.dcgm_diag_samples) where the kubelet would run dcgmi."""

from __future__ import annotations

import pytest

from storage import audit
from testenv import fleet as fl
from tests.integration import engine_harness as h
from tests.integration.desk import ACCESS, Desk, bot_granted_for_the_test
from tests.integration.test_upgrade_run import _check_pods, _converged, _fleet, _gfd_version
from commands.services import Services
from workflows.config import GpuopsConfig

pytestmark = pytest.mark.controlplane

NEW = "580.105.08"


def _config(**check) -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        "pools": {"upg": {"kind": "serving", "windows": "always", "max_unavailable": 1, "upgrade_soak": "1s",
                          "gpu_check": {"diag": 2, "timeout": "30s", **check}}},
        "access": ACCESS,
    })


@pytest.fixture
def as_bot(cluster):
    yield from bot_granted_for_the_test(cluster)


def _annotate(installer, node: str, key: str, value: str | None) -> None:
    installer.call("PATCH", f"/api/v1/nodes/{node}", body={"metadata": {"annotations": {key: value}}},
                   content_type="application/merge-patch+json")


def _desk(cluster, db, fleet_cache, as_bot: str, config: GpuopsConfig) -> Desk:
    services = Services.on_database(config=config, fleet=fleet_cache(user=as_bot), database=db)
    return Desk(cluster, db, services, config, user=as_bot)


def _upgrade(desk: Desk):
    asked = desk.say("U0ALICE", f"upgrade upg to {NEW} driver CVE")
    assert asked.ok, asked.summary
    assert any("runs DCGM's diagnostics at level 2" in b for b in asked.sections[1].bullets), asked.sections[1]
    (request,) = desk.services.requests.open_requests("upg")  # type: ignore[union-attr]
    return desk.approve_and_run(request.id)


def test_a_memory_test_failing_on_gpu_3_of_the_canary_halts_the_run_quoting_it_with_the_node_cordoned(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(_fleet())
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])
    _annotate(installer, "upg-01", fl.ANN_DIAG, "memory:3")

    halted = _upgrade(_desk(cluster, db, fleet_cache, as_bot, _config()))

    assert halted.state == "failed"
    reason = halted.halted_reason or ""
    assert "the diagnostics on upg-01 (`dcgmi diag -r 2 -j`) failed memory on GPU 3" in reason, reason
    assert "GPU 3 had 1 memory miscompares" in reason
    assert h.unschedulable(installer, "upg-01")  # stays out, for a person
    assert not h.unschedulable(installer, "upg-02") and _gfd_version(installer, "upg-02") != NEW
    (kept,) = _check_pods(installer)  # kept for its logs, holding every GPU of the node
    (container,) = kept["spec"]["containers"]
    assert kept["spec"]["nodeName"] == "upg-01" and container["resources"]["limits"] == {"nvidia.com/gpu": "8"}


def test_diagnostics_and_the_pools_burn_in_that_pass_on_every_gpu_give_each_node_back(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(_fleet())
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])
    burn_in = {"image": "nvcr.io/nvidia/pytorch:24.05-py3", "command": ["all_reduce_perf", "-b", "8", "-e", "1G"]}

    finished = _upgrade(_desk(cluster, db, fleet_cache, as_bot, _config(burn_in=burn_in)))

    assert finished.state == "succeeded", finished.halted_reason
    rows = audit.for_run(db, finished.id)
    # Each node: the diagnostics, then the burn-in, each a pod holding its 8 GPUs.
    assert [(r.detail["node"], r.detail["command"][0], r.detail["count"]) for r in rows
            if r.action == "gpu-check.start"] == [
        ("upg-01", "/bin/sh", 8), ("upg-01", "all_reduce_perf", 8), ("upg-02", "/bin/sh", 8),
        ("upg-02", "all_reduce_perf", 8)]
    assert [r.detail["node"] for r in rows if r.action == "gpu-check.passed"] == ["upg-01", "upg-01", "upg-02", "upg-02"]
    assert _check_pods(installer) == []


def test_diagnostics_that_never_end_halt_the_run_when_the_check_pods_deadline_passes(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(_fleet())
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])
    _annotate(installer, "upg-01", fl.ANN_DIAG, "hang")

    halted = _upgrade(_desk(cluster, db, fleet_cache, as_bot, _config(timeout="10s")))

    assert halted.state == "failed"
    reason = halted.halted_reason or ""
    assert "the diagnostics on upg-01 (`dcgmi diag -r 2 -j`) gave no result gpuops can read" in reason, reason
    assert "it ran out of time (DeadlineExceeded)" in reason
    assert h.unschedulable(installer, "upg-01")
