"""A step that cannot do its work fails the run and never counts as done (an API that
refuses the change), and a node a finished run left cordoned is no other run's any more.
The real engine over the in-memory cluster, pass by pass (the harness of
test_safety_rules.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from test_safety_rules import (NODES, NOW, PlannedRun, cluster, hand_cordon, node_steps,  # noqa: F401
                               people_config, pool_config)

from storage import audit
from storage import runs as stored_runs
from workflows.engine.runs import RunAccessDenied, RunRefused, RunService, UnknownRun
from workflows.kube.errors import Forbidden
from workflows.plans import NodeStep


def _halted(run: PlannedRun) -> tuple[str, str]:
    stored = stored_runs.get(run.db, id=run.run_id)
    assert stored is not None
    return stored.state, stored.halted_reason or ""


def _step_state(run: PlannedRun, kind: str) -> str:
    return next(s.state for s in RunService(run.db).get(run.run_id).steps if s.kind == kind)


def test_a_change_the_api_refuses_fails_the_run_and_never_counts_as_done(db, cluster):  # noqa: F811
    def refuse(name, **_):
        raise Forbidden(f'nodes "{name}" is forbidden: User "gpuops" cannot patch resource "nodes"')

    cluster.cordon_node = refuse  # the bot's identity lost its grant to patch nodes
    run = PlannedRun(db, cluster, [("gpu-01",)])

    run.drive(lambda: run.state() in ("failed", "succeeded"))

    state, reason = _halted(run)
    assert state == "failed" and "forbidden" in reason, reason
    assert _step_state(run, "cordon") == "failed"
    assert not any(cluster.node(n).unschedulable for n in NODES)


def test_a_node_an_aborted_run_left_cordoned_can_be_drained_again_by_the_next_run(db, cluster):  # noqa: F811
    first = PlannedRun(db, cluster, [("gpu-01",)], steps=lambda n: node_steps(n, hold_s=3600))
    first.drive(lambda: first.cordoned() == ["gpu-01"])
    RunService(db).abort(first.cfg.actor("U0ADA"), first.run_id, now=first.now)
    assert cluster.node("gpu-01").unschedulable  # the abort leaves it out, marked by the first run

    second = PlannedRun(db, cluster, [("gpu-01",)])
    second.drive(lambda: second.state() in ("failed", "succeeded"))

    assert second.state() == "succeeded", _halted(second)
    assert _step_state(second, "cordon") == "done"
    assert cluster.node("gpu-01").unschedulable  # given back as the second run found it


def _audit_actions(run: PlannedRun) -> list[str]:
    return [e.action for e in audit.for_run(run.db, run_id=run.run_id)]


def test_a_wave_still_waiting_for_room_when_the_window_ends_halts_the_run_and_never_starts(db, cluster):  # noqa: F811
    hand_cordon(cluster, "gpu-05")  # the pool allows one node out, and a person took one
    run = PlannedRun(db, cluster, [("gpu-01",)], cfg=pool_config(max_unavailable=1), gated=True,
                     window_end=NOW + dt.timedelta(minutes=2))

    run.drive(lambda: run.state() == "failed")

    run.passes(5)
    assert "run.wave" not in _audit_actions(run)
    assert run.cordoned() == [] and not cluster.node("gpu-01").unschedulable


def test_a_dry_run_whose_wave_would_wait_for_room_says_so_and_goes_on(db, cluster):  # noqa: F811
    hand_cordon(cluster, "gpu-05")
    run = PlannedRun(db, cluster, [("gpu-01",)], cfg=pool_config(max_unavailable=1), gated=True, dry_run=True)

    run.drive(lambda: run.state() in ("failed", "succeeded"))

    assert run.state() == "succeeded"
    assert "run.waiting" in _audit_actions(run)  # the thread heard that a real run would wait
    assert not cluster.node("gpu-01").unschedulable


@pytest.mark.parametrize("kind", ["host-driver-removed", "host-driver-installed"])
def test_a_person_confirms_the_host_driver_step_the_node_waits_on(db, cluster, kind):  # noqa: F811
    cfg = people_config()
    run = PlannedRun(db, cluster, [("gpu-01",)], cfg=cfg, steps=lambda node: (
        NodeStep("cordon", node, {}), NodeStep(kind, node, {})))  # type: ignore[arg-type]
    run.drive(lambda: _step_state(run, kind) == "running")

    RunService(db).confirm_host_driver(cfg.actor("U0BOB"), run.run_id, now=run.now)

    waiting = next(s for s in RunService(db).get(run.run_id).steps if s.kind == kind)
    assert waiting.detail["params"]["confirmed_by"] == "U0BOB"
    assert f"run.{kind}" in _audit_actions(run)


def test_a_host_driver_confirmed_twice_is_recorded_and_told_once(db, cluster):  # noqa: F811
    # As when the delivery of the first word is run again: its replica died before answering.
    cfg = people_config()
    run = PlannedRun(db, cluster, [("gpu-01",)], cfg=cfg, steps=lambda node: (
        NodeStep("cordon", node, {}), NodeStep("host-driver-removed", node, {})))  # type: ignore[arg-type]
    run.drive(lambda: _step_state(run, "host-driver-removed") == "running")
    RunService(db).confirm_host_driver(cfg.actor("U0BOB"), run.run_id, now=run.now)

    with pytest.raises(RunRefused):
        RunService(db).confirm_host_driver(cfg.actor("U0BOB"), run.run_id, now=run.now + dt.timedelta(seconds=15))

    assert _audit_actions(run).count("run.host-driver-removed") == 1


def test_only_an_operator_of_the_pool_confirms_the_host_driver_and_only_on_a_run_that_waits(db, cluster):  # noqa: F811
    cfg = people_config()
    run = PlannedRun(db, cluster, [("gpu-01",)], cfg=cfg, steps=lambda node: (
        NodeStep("cordon", node, {}), NodeStep("host-driver-removed", node, {})))  # type: ignore[arg-type]
    run.drive(lambda: _step_state(run, "host-driver-removed") == "running")
    runs = RunService(db)

    with pytest.raises(RunAccessDenied, match="Only an operator of pool train-a or an admin"):
        runs.confirm_host_driver(cfg.actor("U0EVE"), run.run_id, now=run.now)
    with pytest.raises(UnknownRun):
        runs.confirm_host_driver(cfg.actor("U0BOB"), "run-nope", now=run.now)
    runs.abort(cfg.actor("U0ADA"), run.run_id, now=run.now)
    with pytest.raises(RunRefused, match=f"Run {run.run_id} is aborted: it waits for nothing"):
        runs.confirm_host_driver(cfg.actor("U0BOB"), run.run_id, now=run.now)

    assert not any(e.action == "run.host-driver-removed" for e in audit.for_run(db, run.run_id))


def test_a_word_for_one_node_is_not_a_word_for_all_when_several_wait_for_a_person(db, cluster):  # noqa: F811
    cfg = people_config()
    run = PlannedRun(db, cluster, [("gpu-01", "gpu-02")], cfg=cfg, steps=lambda node: (
        NodeStep("cordon", node, {}), NodeStep("host-driver-removed", node, {})))  # type: ignore[arg-type]
    run.drive(lambda: [s.state for s in RunService(db).get(run.run_id).steps
                       if s.kind == "host-driver-removed"] == ["running", "running"])

    with pytest.raises(RunRefused, match=r"waits for a person at 2 nodes \(gpu-01, gpu-02\): name the one"):
        RunService(db).confirm_host_driver(cfg.actor("U0BOB"), run.run_id, now=run.now)

    assert not any("confirmed_by" in s.detail["params"] for s in RunService(db).get(run.run_id).steps)


def test_drain_done_is_refused_for_a_run_with_no_hold_left_and_for_a_request_with_no_run(db, cluster):  # noqa: F811
    cfg = people_config()
    run = PlannedRun(db, cluster, [("gpu-01",)], cfg=cfg, steps=lambda node: (
        NodeStep("cordon", node, {}), NodeStep("host-driver-removed", node, {})))  # type: ignore[arg-type]
    run.drive(lambda: _step_state(run, "host-driver-removed") == "running")
    request_id = RunService(db).get(run.run_id).request_id

    with pytest.raises(RunRefused, match=f"Run {run.run_id} has no hold left to end"):
        RunService(db).release_hold(cfg.actor("U0BOB"), request_id, now=run.now)
    RunService(db).abort(cfg.actor("U0ADA"), run.run_id, now=run.now)
    with pytest.raises(RunRefused, match=f"{request_id} has no run yet"):
        RunService(db).release_hold(cfg.actor("U0BOB"), request_id, now=run.now)

    assert "run.released" not in _audit_actions(run)
