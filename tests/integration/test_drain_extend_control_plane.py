"""A running drain held longer, against the real control plane and the real engine: the
hardware work over-runs, alice says `/gpu drain extend` while the run holds its node,
and the node stays cordoned past the old end and is validated and given back only after
the new one. On a pool that needs no approval for drains it applies at once; on one
that needs two approvers, the run keeps holding to the old end until both approved the
extension's own plan hash. The new end is audited and told in the request's thread,
and the window-ending notice comes again for it. Windows are seconds long."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.wiring import Runtime, build_runtime
from commands.catalog import dispatch
from commands.reply import Reply
from storage import audit, codec
from storage.ids import RunId
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from workflows.config import GpuopsConfig


CHANNEL = "C0GPUOPS"
POLICY = {"kind": "serving", "windows": "always", "max_unavailable": 1, "min_ready_gpus": 0,
          "drain_timeout": "20s", "validate_timeout": "10s"}
# The hold outlasts the engine's start on a busy machine; the extension outlasts the old end.
WINDOW = "30s"
MORE = dt.timedelta(seconds=20)


def extend_config() -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        "pools": {"longer": {**POLICY, "approvals": {"drain": 0}},
                  "twice": {**POLICY, "approvals": {"drain": 2}}},
        "access": {"users": {"U0ALICE": ["operator"], "U0BOB": ["approver"], "U0CAROL": ["approver"]},
                   "names": {"U0ALICE": "alice", "U0BOB": "bob", "U0CAROL": "carol"}},
    })


@pytest.fixture
def runtime(cluster, tmp_path: Path) -> Iterator[Runtime]:
    runtime = build_runtime(extend_config(), kubeconfig=str(cluster.kubeconfig), context="admin",
                            database=tmp_path / "gpuops.db")
    yield runtime
    runtime.close()


def gpu(runtime: Runtime, who: str, text: str) -> Reply:
    return dispatch(text, actor=runtime.config.actor(who), services=runtime.services(), now=h.now(),
                    channel=CHANNEL)


def _pool_fleet(fleet, runtime: Runtime, installer, pool: str) -> str:
    fleet(fl.FleetSpec(name=pool, system_nodes=0, pools=(fl.PoolSpec(name=pool, kind="serving", nodes=2),)))
    node = f"{pool}-01"
    wait_until(lambda: advertised(h.node(installer, node)) > 0, timeout=60, what=f"{node} to advertise its GPUs")
    wait_until(lambda: (inv := runtime.fleet.fleet(h.now()).nodes.get(node)) is not None  # type: ignore[attr-defined]
               and inv.advertised_gpus > 0, timeout=60, what="the bot's fleet cache to see the node")
    return node


def _hold_state(runtime: Runtime, run_id: RunId) -> str:
    return next(s.state for s in runtime.services().runs.get(run_id).steps if s.kind == "hold")  # type: ignore[union-attr]


def _step_ended(runtime: Runtime, run_id: RunId, kind: str) -> dt.datetime:
    step = next(s for s in runtime.services().runs.get(run_id).steps if s.kind == kind)  # type: ignore[union-attr]
    assert step.state == "done" and step.ended_at is not None, (kind, step.state, step.error)
    return step.ended_at


def _start(runtime: Runtime, node: str, approvers: tuple[str, ...]):
    asked = gpu(runtime, "U0ALICE", f'/gpu drain {node} for {WINDOW} "NIC swap"')
    assert asked.ok, asked.summary
    services = runtime.services()
    request = services.requests.get(asked.title.split()[1])  # type: ignore[union-attr]
    for approver in approvers:
        assert gpu(runtime, approver, f"/gpu approve {request.id} {request.short_hash}").ok
    run = services.runs.start(request.id, dry_run=False, now=h.now(),  # type: ignore[union-attr]
                              actor=runtime.config.actor("U0ALICE"))
    return request, run


def _held_past_the_old_end_then_given_back(runtime: Runtime, installer, engine, node: str, run_id: RunId,
                                           old_end: dt.datetime, new_end: dt.datetime) -> None:
    wait_until(lambda: h.now() > old_end, timeout=60, what="the drain's old window end to pass")
    engine.passes_after(3)  # the engine looked at the hold after its old end
    assert _hold_state(runtime, run_id) == "running"
    assert h.unschedulable(installer, node)
    finished = h.wait_run(runtime.database.get(), run_id, timeout=120)
    assert finished.state == "succeeded", finished.halted_reason
    assert _step_ended(runtime, run_id, "hold") >= new_end
    assert _step_ended(runtime, run_id, "uncordon") >= new_end
    assert not h.unschedulable(installer, node) and h.cordon_mark(installer, node) is None


def test_a_running_drain_extended_on_a_pool_needing_no_approval_stays_cordoned_past_the_old_end(
        fleet, cluster, runtime):
    installer = cluster.installer()
    node = _pool_fleet(fleet, runtime, installer, "longer")
    request, run = _start(runtime, node, approvers=())
    assert request.state == "approved" and request.window_end is not None
    old_end, new_end = request.window_end, request.window_end + MORE

    with h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools) as engine:
        wait_until(lambda: _hold_state(runtime, run.id) == "running", timeout=60, what=f"{node} to be held")
        assert h.unschedulable(installer, node)
        reply = gpu(runtime, "U0ALICE", f"/gpu drain extend {request.id} {int(MORE.total_seconds())}s")
        assert reply.ok, reply.summary
        assert runtime.services().requests.get(request.id).window_end == new_end  # type: ignore[union-attr]
        _held_past_the_old_end_then_given_back(runtime, installer, engine, node, run.id, old_end, new_end)

    (extended,) = [r for r in audit.for_request(runtime.database.get(), request.id) if r.action == "request.extended"]
    assert extended.actor == "U0ALICE" and extended.detail["nodes"] == [node]
    assert extended.detail["old_window_end"] == codec.time_to_text(old_end) and extended.detail["window_end"] == codec.time_to_text(new_end)
    thread = h.thread_messages(runtime.database.get())
    assert [m for m in thread if m["event"] == "request.extended"], [m["event"] for m in thread]
    # The window-ending notice comes again for the new end, once.
    again = [m["text"] for m in thread if m["event"] == "step.window-ending"]
    assert len(again) == 1 and f"`/gpu drain extend {request.id} <duration>`" in again[0]
    assert audit.verify(runtime.database.get()).ok


def test_on_a_pool_needing_two_approvers_the_extension_holds_the_node_only_once_both_approved(
        fleet, cluster, runtime):
    installer = cluster.installer()
    node = _pool_fleet(fleet, runtime, installer, "twice")
    request, run = _start(runtime, node, approvers=("U0BOB", "U0CAROL"))
    assert request.window_end is not None
    old_end, new_end = request.window_end, request.window_end + MORE

    with h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools) as engine:
        wait_until(lambda: _hold_state(runtime, run.id) == "running", timeout=60, what=f"{node} to be held")
        asked = gpu(runtime, "U0ALICE", f"/gpu drain extend {request.id} {int(MORE.total_seconds())}s")
        assert asked.ok, asked.summary
        pending = runtime.services().requests.get(request.id)  # type: ignore[union-attr]
        extension = pending.extension
        assert extension is not None and pending.window_end == old_end
        engine.passes_after(3)
        (hold,) = [s for s in runtime.services().runs.get(run.id).steps if s.kind == "hold"]  # type: ignore[union-attr]
        assert "extended_until" not in (hold.detail or {}).get("params", {})
        assert gpu(runtime, "U0BOB", f"/gpu approve {request.id} {extension.short_hash}").ok
        assert runtime.services().requests.get(request.id).window_end == old_end  # type: ignore[union-attr]
        approved = gpu(runtime, "U0CAROL", f"/gpu approve {request.id} {extension.short_hash}")
        assert approved.ok, approved.summary
        assert runtime.services().requests.get(request.id).window_end == new_end  # type: ignore[union-attr]
        _held_past_the_old_end_then_given_back(runtime, installer, engine, node, run.id, old_end, new_end)

    (extended,) = [r for r in audit.for_request(runtime.database.get(), request.id) if r.action == "request.extended"]
    assert extended.detail["approvers"] == ["U0BOB", "U0CAROL"]
    told = [m["text"] for m in h.thread_messages(runtime.database.get()) if m["event"] == "request.extended"]
    assert len(told) == 1 and "approved by bob and carol" in told[0]
