"""A drained node is given back only when the GPU Operator says it is healthy: against
the real control plane, with the simulator playing a device plugin that marks a GPU
unhealthy (capacity 8, allocatable 7) and a validator whose CUDA validation fails. Each
such node fails validation and stays cordoned, with the reason in the run."""

from __future__ import annotations

from testenv import fleet as fl
from tests.integration import engine_harness as h
from tests.integration.test_drain_control_plane import (  # noqa: F401 (runtime: the fixture)
    _ready_fleet,
    _step_state,
    ask_approve_start,
    gpu,
    runtime,
)


def test_a_drained_node_whose_device_plugin_marks_a_gpu_unhealthy_fails_validation_and_stays_cordoned(
        fleet, cluster, runtime):  # noqa: F811
    fleet(fl.FleetSpec(name="short", system_nodes=0, pools=(fl.PoolSpec(name="short", kind="serving", nodes=2),),
                       special_nodes=(fl.SpecialNode(node="short-01", unhealthy_gpus=1),)))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["short-01", "short-02"])

    _, request, run = ask_approve_start(runtime, '/gpu drain short-01 for 1m "kernel patch"')
    gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}")  # the hold ends as soon as it starts
    with h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools):
        finished = h.wait_run(runtime.database.get(), run.id)

    assert finished.state == "failed"
    reason = finished.halted_reason or ""
    assert "short-01: validate failed" in reason and "Left cordoned by this run: short-01" in reason, reason
    assert h.unschedulable(installer, "short-01") and h.cordon_mark(installer, "short-01") is not None
    assert _step_state(runtime, run.id, "short-01", "uncordon") == "skipped"


def test_a_drained_node_whose_validator_fails_fails_validation_and_stays_cordoned(fleet, cluster, runtime):  # noqa: F811
    fleet(fl.FleetSpec(name="short", system_nodes=0, pools=(fl.PoolSpec(name="short", kind="serving", nodes=2),),
                       special_nodes=(fl.SpecialNode(node="short-01", validator_fails=True),)))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["short-01", "short-02"])

    _, request, run = ask_approve_start(runtime, '/gpu drain short-01 for 1m "kernel patch"')
    gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}")
    with h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools):
        finished = h.wait_run(runtime.database.get(), run.id)

    assert finished.state == "failed"
    reason = finished.halted_reason or ""
    assert "short-01: validate failed" in reason and "validator" in reason, reason
    assert "Left cordoned by this run: short-01" in reason
    assert h.unschedulable(installer, "short-01") and h.cordon_mark(installer, "short-01") is not None
    assert _step_state(runtime, run.id, "short-01", "uncordon") == "skipped"
