"""A drain from `/gpu drain` to the last uncordon, against the real control plane and the
real engine: alice asks, bob approves, the run starts, `/gpu drain done` ends the hold,
and the nodes are validated before they are uncordoned. A node that comes back with fewer
GPUs than it has halts the run with the node left cordoned; an engine restarted during the
hold carries on where the other stopped. Each test builds a small fleet of its own."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.wiring import Runtime, build_runtime
from commands.catalog import dispatch
from commands.reply import Reply
from storage import audit
from storage import requests as stored_requests
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from workflows.config import GpuopsConfig
from workflows.requests import RequestView
from workflows.runs import RunView

pytestmark = pytest.mark.controlplane

CHANNEL = "C0GPUOPS"
POOLS = ("serve", "short", "restart")


def drain_config() -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        "pools": {name: {"kind": "serving", "approvers": ["U0BOB"], "windows": "always", "max_unavailable": 2,
                         "min_ready_gpus": 0, "drain_timeout": "20s", "validate_timeout": "5s"}
                  for name in POOLS},
        "access": {"users": {"U0ALICE": ["operator"], "U0BOB": ["approver"]},
                   "names": {"U0ALICE": "alice", "U0BOB": "bob"}},
    })


@pytest.fixture
def runtime(cluster, tmp_path: Path) -> Iterator[Runtime]:
    runtime = build_runtime(drain_config(), kubeconfig=str(cluster.kubeconfig), context="admin",
                            database=tmp_path / "gpuops.db")
    yield runtime
    runtime.close()


def gpu(runtime: Runtime, who: str, text: str) -> Reply:
    return dispatch(text, actor=runtime.config.actor(who), services=runtime.services(), now=h.now(),
                    channel=CHANNEL)


def _texts(reply: Reply) -> str:
    parts = [reply.title or "", reply.summary or ""]
    for section in reply.sections:
        parts += [section.title or "", section.text or "", *(section.bullets or ())]
        parts += [f"{fact.label}: {fact.value}" for fact in section.facts or ()]
        if section.table is not None:
            parts += [" | ".join(row) for row in section.table.rows]
    return "\n".join(parts)


def _ready_fleet(runtime: Runtime, installer, nodes: list[str]) -> None:
    wait_until(lambda: all(advertised(h.node(installer, n)) > 0 for n in nodes), timeout=60,
               what=f"{', '.join(nodes)} to advertise their GPUs")
    wait_until(lambda: all((inv := runtime.fleet.fleet(h.now()).nodes.get(n)) is not None  # type: ignore[attr-defined]
                           and inv.advertised_gpus > 0 for n in nodes),
               timeout=60, what="the bot's fleet cache to see the nodes")


def _ready_pod(installer, namespace: str, app: str) -> dict:
    wait_until(lambda: any(h.running_ready(p) for p in h.workload_pods(installer, namespace, app)), timeout=60,
               what=f"{namespace}/{app} to run")
    return next(p for p in h.workload_pods(installer, namespace, app) if h.running_ready(p))


def ask_approve_start(runtime: Runtime, text: str) -> tuple[Reply, RequestView, RunView]:
    asked = gpu(runtime, "U0ALICE", text)
    assert asked.ok, _texts(asked)
    services = runtime.services()
    assert services.requests is not None and services.runs is not None
    request = services.requests.get(asked.title.split()[1])
    approved = gpu(runtime, "U0BOB", f"/gpu approve {request.id} {request.short_hash}")
    assert approved.ok and (approved.summary or "").startswith("approved"), _texts(approved)
    run = services.runs.start(request.id, dry_run=False, now=h.now(), actor=runtime.config.actor("U0ALICE"))
    return asked, request, run


def _step_state(runtime: Runtime, run_id: str, node: str, kind: str) -> str:
    runs = runtime.services().runs
    assert runs is not None
    return next(s.state for s in runs.get(run_id).steps if (s.node, s.kind) == (node, kind))


def test_a_drain_asked_for_in_slack_is_approved_held_until_drain_done_then_validated_and_uncordoned(
        fleet, cluster, runtime, caplog):
    fleet(fl.FleetSpec(name="serve", system_nodes=0, pools=(fl.PoolSpec(name="serve", kind="serving", nodes=2),),
                       workloads=(fl.WorkloadSpec(name="llm", namespace="serve", node="serve-01"),
                                  fl.WorkloadSpec(name="embed", namespace="serve", node="serve-02"))))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["serve-01", "serve-02"])
    llm, embed = _ready_pod(installer, "serve", "llm"), _ready_pod(installer, "serve", "embed")

    asked, request, run = ask_approve_start(runtime, '/gpu drain serve-01 serve-02 for 1m "kernel patch"')
    shown = _texts(asked)
    assert "serve-01, serve-02" in shown  # one wave: max_unavailable 2
    assert f"serve/{llm['metadata']['name']}" in shown and f"serve/{embed['metadata']['name']}" in shown
    assert request.reason == "kernel patch" and list(request.targets) == ["serve-01", "serve-02"]

    with caplog.at_level(logging.INFO, logger="gpuops.kube"), h.EngineThread(cluster.kubeconfig, runtime.database.get().path):
        wait_until(lambda: all(_step_state(runtime, run.id, n, "hold") == "running" for n in ("serve-01", "serve-02")),
                   timeout=60, what="both nodes to be held")
        assert h.unschedulable(installer, "serve-01") and h.unschedulable(installer, "serve-02")
        done = gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}")
        assert done.ok, _texts(done)
        finished = h.wait_run(runtime.database.get(), run.id)

    assert finished.state == "succeeded", finished.halted_reason
    assert stored_requests.get(runtime.database.get(), id=request.id).state == "done"  # type: ignore[union-attr]
    assert not h.unschedulable(installer, "serve-01") and not h.unschedulable(installer, "serve-02")
    assert h.cordon_mark(installer, "serve-01") is None and h.cordon_mark(installer, "serve-02") is None
    left = {p["metadata"]["uid"] for p in h.workload_pods(installer, "serve", "llm") + h.workload_pods(installer, "serve", "embed")}
    assert llm["metadata"]["uid"] not in left and embed["metadata"]["uid"] not in left
    # Each node: cordoned, evicted, held, validated, and only then uncordoned.
    writes = h.mutations(caplog.text)
    for node in ("serve-01", "serve-02"):
        assert writes.count(f"cordon node {node}") == 1 and writes.count(f"uncordon node {node}") == 1
        assert writes.index(f"cordon node {node}") < writes.index(f"uncordon node {node}")
    rows = audit.for_run(runtime.database.get(), run.id)
    done_steps = [(r.target, r.detail["kind"]) for r in rows if r.action == "step.done"]
    for node in ("serve-01", "serve-02"):
        order = [kind for target, kind in done_steps if target == node]
        assert order == ["cordon", "evict", "hold", "validate", "uncordon"]
    assert {r.target for r in rows if r.action == "pod.evict"} == {
        f"serve/{llm['metadata']['name']}", f"serve/{embed['metadata']['name']}"}
    assert audit.verify(runtime.database.get()).ok


def test_a_node_that_comes_back_with_fewer_gpus_fails_validation_and_stays_cordoned_with_the_reason_in_the_thread(
        fleet, cluster, runtime):
    fleet(fl.FleetSpec(name="short", system_nodes=0, pools=(fl.PoolSpec(name="short", kind="serving", nodes=2),),
                       special_nodes=(fl.SpecialNode(node="short-01", advertise_gpus=7),)))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["short-01", "short-02"])

    _, request, run = ask_approve_start(runtime, '/gpu drain short-01 for 1m "kernel patch"')
    gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}")  # the hold ends as soon as it starts
    with h.EngineThread(cluster.kubeconfig, runtime.database.get().path):
        finished = h.wait_run(runtime.database.get(), run.id)

    assert finished.state == "failed"
    reason = finished.halted_reason or ""
    assert "short-01: validate failed" in reason and "7/8 GPUs advertised" in reason, reason
    assert "Left cordoned by this run: short-01" in reason
    assert h.unschedulable(installer, "short-01") and h.cordon_mark(installer, "short-01") is not None
    assert not h.unschedulable(installer, "short-02")
    assert _step_state(runtime, run.id, "short-01", "uncordon") == "skipped"
    failed = [m for m in h.thread_messages(runtime.database.get()) if m["event"] == "run.failed"]
    assert len(failed) == 1 and failed[0]["text"] == reason and failed[0]["request_id"] == request.id
    assert audit.verify(runtime.database.get()).ok


def test_an_engine_restarted_during_the_hold_carries_on_without_cordoning_again_and_finishes_after_drain_done(
        fleet, cluster, runtime, caplog):
    fleet(fl.FleetSpec(name="restart", system_nodes=0,
                       pools=(fl.PoolSpec(name="restart", kind="serving", nodes=2),)))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["restart-01", "restart-02"])
    _, request, run = ask_approve_start(runtime, '/gpu drain restart-01 restart-02 for 1m "kernel patch"')
    db_path = runtime.database.get().path

    with caplog.at_level(logging.INFO, logger="gpuops.kube"):
        with h.EngineThread(cluster.kubeconfig, db_path, identity="engine-a"):
            wait_until(lambda: all(_step_state(runtime, run.id, n, "hold") == "running"
                                   for n in ("restart-01", "restart-02")), timeout=60, what="both nodes to be held")
        assert h.unschedulable(installer, "restart-01") and h.unschedulable(installer, "restart-02")
        with h.EngineThread(cluster.kubeconfig, db_path, identity="engine-b") as second:
            second.passes_after(3)
            assert runtime.services().runs.get(run.id).state == "running"  # type: ignore[union-attr]
            assert gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}").ok
            finished = h.wait_run(runtime.database.get(), run.id)

    assert finished.state == "succeeded", finished.halted_reason
    writes = h.mutations(caplog.text)
    for node in ("restart-01", "restart-02"):
        assert writes.count(f"cordon node {node}") == 1 and writes.count(f"uncordon node {node}") == 1
        assert not h.unschedulable(installer, node)
    actions = [r.action for r in audit.for_run(runtime.database.get(), run.id)]
    assert "step.resumed" in actions
    assert audit.verify(runtime.database.get()).ok
