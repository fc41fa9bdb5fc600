"""A drain from `/gpu drain` to the last uncordon, against the real control plane and the
real engine: alice asks, bob approves, the run starts, `/gpu drain done` ends the hold,
and the nodes are validated before they are uncordoned. A node that comes back with fewer
GPUs than it has halts the run with the node left cordoned; an engine restarted during the
hold carries on where the other stopped; a PodDisruptionBudget that allows one disruption
makes the second eviction wait (and the thread hears why); at the pool's drain_timeout a
budget that still blocks halts the run with the node cordoned (`wait`), leaves the node
out and gives it back (`skip`), or deletes each blocked pod exactly once, even when the
engine is killed mid-run (`delete`). Each test builds a small fleet of its own."""

from __future__ import annotations

import datetime as dt
import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.scheduler import clear_stale_marks, start_window_runs
from bot.wiring import Runtime, build_runtime
from commands.catalog import dispatch
from commands.messages import WAITS_LABEL
from commands.reply import Reply
from storage import audit
from storage import requests as stored_requests
from storage import runs as stored_runs
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import desk
from tests.integration import engine_harness as h
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunView
from workflows.requests.views import RequestView


CHANNEL = "C0GPUOPS"
POOLS = ("serve", "short", "restart", "budget", "skip", "gates", "floor", "open", "recheck", "wait", "delete",
         "later")
WEEKENDS = [{"days": ["sat", "sun"], "start": "02:00", "end": "06:00", "timezone": "Europe/Berlin"}]
# The skip pool gives a blocked eviction 4 seconds, then leaves the node out; gates and
# floor drain only at weekends, one node at a time (gates), never below 16 GPUs (floor).
POLICY_CHANGES = {"skip": {"drain_timeout": "4s", "pdb_timeout_action": "skip"},
                  "wait": {"drain_timeout": "4s", "pdb_timeout_action": "wait"},
                  "delete": {"drain_timeout": "4s", "allow_delete": True, "pdb_timeout_action": "delete"},
                  "budget": {"drain_timeout": "120s"},
                  "gates": {"windows": WEEKENDS, "max_unavailable": 1},
                  "floor": {"windows": WEEKENDS, "min_ready_gpus": 16},
                  "later": {"max_unavailable": 1}}


def drain_config(*, bob: str = "approver") -> GpuopsConfig:
    """Every pool serving, bob its approver (unless `bob` says he is something else now)."""
    return GpuopsConfig.model_validate({
        "pools": {name: {"kind": "serving", "approvers": ["U0BOB"] if bob == "approver" else [], "windows": "always",
                         "max_unavailable": 2,
                         "min_ready_gpus": 0, "drain_timeout": "20s", "validate_timeout": "5s",
                         **POLICY_CHANGES.get(name, {})}
                  for name in POOLS},
        "access": {"users": {"U0ALICE": ["operator"], "U0BOB": [bob]},
                   "names": {"U0ALICE": "alice", "U0BOB": "bob"}},
        "rotations": [{"name": "gpu-oncall", "team": "GPU platform", "channel": CHANNEL, "timezone": "UTC",
                       "shifts": [{"name": "day", "starts": "0 8 * * *", "members": ["U0ALICE"]},
                                  {"name": "night", "starts": "0 20 * * *", "members": ["U0BOB"]}]}],
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
        parts += [notice.text for notice in section.notices or ()]
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


def ask_and_approve(runtime: Runtime, text: str) -> tuple[Reply, RequestView]:
    asked = gpu(runtime, "U0ALICE", text)
    assert asked.ok, _texts(asked)
    services = runtime.services()
    assert services.requests is not None
    request = services.requests.get(asked.title.split()[1])
    approved = gpu(runtime, "U0BOB", f"/gpu approve {request.id} {request.short_hash}")
    assert approved.ok and (approved.summary or "").startswith("approved"), _texts(approved)
    return asked, request


def ask_approve_start(runtime: Runtime, text: str) -> tuple[Reply, RequestView, RunView]:
    asked, request = ask_and_approve(runtime, text)
    runs = runtime.services().runs
    assert runs is not None
    run = runs.start(request.id, dry_run=False, now=h.now(), actor=runtime.config.actor("U0ALICE"))
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

    with caplog.at_level(logging.INFO, logger="gpuops.kube"), h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools):
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


def test_a_drain_without_an_end_holds_its_node_until_drain_done(fleet, cluster, runtime):
    fleet(fl.FleetSpec(name="open", system_nodes=0, pools=(fl.PoolSpec(name="open", kind="serving", nodes=2),)))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["open-01", "open-02"])

    asked, request, run = ask_approve_start(runtime, '/gpu drain open-01 "disk swap"')  # always pool, no `for`
    assert "until someone says `drain done`" in _texts(asked)
    assert request.window_end is None
    with h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools) as engine:
        wait_until(lambda: _step_state(runtime, run.id, "open-01", "hold") == "running", timeout=60,
                   what="open-01 to be held")
        engine.passes_after(10)  # the engine keeps looking; nothing ends the hold but `drain done`
        assert _step_state(runtime, run.id, "open-01", "hold") == "running"
        assert h.unschedulable(installer, "open-01")
        assert "holding until someone says `drain done`" in _texts(gpu(runtime, "U0ALICE", f"/gpu request {request.id}"))
        assert gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}").ok
        finished = h.wait_run(runtime.database.get(), run.id)

    assert finished.state == "succeeded", finished.halted_reason
    assert not h.unschedulable(installer, "open-01") and h.cordon_mark(installer, "open-01") is None


def test_a_drain_asked_for_after_a_running_drain_ends_is_not_refused_for_that_drains_cordon(fleet, cluster, runtime):
    fleet(fl.FleetSpec(name="later", system_nodes=0, pools=(fl.PoolSpec(name="later", kind="serving", nodes=2),)))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["later-01", "later-02"])
    _, first, run = ask_approve_start(runtime, '/gpu drain later-01 for 30m "fan swap"')  # max_unavailable 1
    assert first.window_end is not None
    with h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools):
        wait_until(lambda: _step_state(runtime, run.id, "later-01", "hold") == "running", timeout=60,
                   what="later-01 to be held")
        wait_until(lambda: runtime.fleet.fleet(h.now()).nodes["later-01"].cordon_run == run.id,  # type: ignore[attr-defined]
                   timeout=30, what="the bot to see later-01 cordoned by the run")

        # While the first drain holds later-01, the pool has no room for a second node...
        now = gpu(runtime, "U0ALICE", '/gpu drain later-02 for 20m "bios"')
        assert not now.ok and "max_unavailable" in _texts(now), _texts(now)
        # ...but after its window ends it does: later-01's cordon is gone by then.
        after = (first.window_end + dt.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M")
        later = gpu(runtime, "U0ALICE", f'/gpu drain later-02 at {after} UTC for 20m "bios"')
        assert later.ok, _texts(later)
        # One that would start while the first still holds its node is refused as before.
        during = (h.now() + dt.timedelta(minutes=5)).strftime("%Y-%m-%d %H:%M")
        overlap = gpu(runtime, "U0ALICE", f'/gpu drain later-02 at {during} UTC for 10m "bios"')
        assert not overlap.ok and "max_unavailable" in _texts(overlap), _texts(overlap)

        assert gpu(runtime, "U0ALICE", f"/gpu drain done {first.id}").ok
        finished = h.wait_run(runtime.database.get(), run.id)
    assert finished.state == "succeeded", finished.halted_reason


def test_an_approved_drain_whose_approver_lost_the_role_does_not_start_and_goes_back_to_pending(
        fleet, cluster, runtime, tmp_path):
    fleet(fl.FleetSpec(name="serve", system_nodes=0, pools=(fl.PoolSpec(name="serve", kind="serving", nodes=1),)))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["serve-01"])
    _, request = ask_and_approve(runtime, '/gpu drain serve-01 for 10m "psu swap"')
    # Bob leaves the approvers before the scheduler starts the run (the bot restarted
    # with the new configuration, on the same database).
    later = build_runtime(drain_config(bob="viewer"), kubeconfig=str(cluster.kubeconfig), context="admin",
                          database=runtime.database.get().path)
    try:
        start_window_runs(later, h.now())
        view = later.services().requests.get(request.id)  # type: ignore[union-attr]
    finally:
        later.close()

    assert view.state == "pending" and view.approvals_counted == 0
    assert stored_runs.for_request(runtime.database.get(), request_id=request.id) == []
    assert not h.unschedulable(installer, "serve-01")
    (said,) = [r for r in audit.recent(runtime.database.get(), 50) if r.action == "request.reopened"]
    assert said.detail["no_longer_approvers"] == ["U0BOB"]


def test_a_node_that_comes_back_with_fewer_gpus_fails_validation_and_stays_cordoned_with_the_reason_in_the_thread(
        fleet, cluster, runtime):
    fleet(fl.FleetSpec(name="short", system_nodes=0, pools=(fl.PoolSpec(name="short", kind="serving", nodes=2),),
                       special_nodes=(fl.SpecialNode(node="short-01", advertise_gpus=7),)))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["short-01", "short-02"])

    _, request, run = ask_approve_start(runtime, '/gpu drain short-01 for 1m "kernel patch"')
    gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}")  # the hold ends as soon as it starts
    with h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools):
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


def test_drains_the_pool_policy_forbids_are_refused_naming_the_rule_and_store_nothing(fleet, cluster, runtime):
    fleet(fl.FleetSpec(name="gates", system_nodes=0, pools=(fl.PoolSpec(name="gates", kind="serving", nodes=3),
                                                            fl.PoolSpec(name="floor", kind="serving", nodes=2))))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["gates-01", "gates-02", "gates-03", "floor-01", "floor-02"])
    requests = runtime.services().requests
    assert requests is not None

    outside = gpu(runtime, "U0ALICE", '/gpu drain gates-01 at wed 10:00 for 1h "fan swap"')
    assert not outside.ok and outside.title == "Drain refused (outside-window)", _texts(outside)
    assert "outside pool gates's maintenance windows (sat,sun 02:00-06:00 Europe/Berlin)" in _texts(outside)
    assert "The first time it fits is" in _texts(outside) and "ask with `at " in _texts(outside)

    # 16 GPUs must stay Ready in floor; it has 16, every one of them on a Ready node.
    floor = gpu(runtime, "U0ALICE", '/gpu drain floor-01 next-window for 1h "fan swap"')
    assert not floor.ok and floor.title == "Drain refused (min_ready_gpus)", _texts(floor)
    assert "would leave 8 Ready GPUs in pool floor (of 16 now), below its floor of 16" in _texts(floor)
    assert requests.open_requests("floor") == [] and requests.open_requests("gates") == []

    _, first = ask_and_approve(runtime, '/gpu drain gates-01 next-window for 1h "fan swap"')
    second = gpu(runtime, "U0ALICE", '/gpu drain gates-02 next-window for 1h "fan swap"')
    assert not second.ok and second.title == "Drain refused (max_unavailable)", _texts(second)
    assert f"held by overlapping request {first.id}" in _texts(second)
    assert [r.id for r in requests.open_requests("gates")] == [first.id]
    assert not any(h.unschedulable(installer, n) for n in ("gates-01", "gates-02", "floor-01"))


def _pinned_deployment(namespace: str, name: str, node: str, *, replicas: int = 1) -> dict:
    """One replica set of a service spread over nodes by hand: its pods run on `node`
    only and do not tolerate the cordon, so an evicted pod's replacement stays Pending."""
    labels = {"app": name, "tier": "llm"}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": {fl.FLEET_LABEL: "budget"}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                                           "terminationGracePeriodSeconds": 1,
                                           "containers": [{"name": "main", "image": "registry.example/llm:1.0",
                                                           "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def _evicted(caplog_text: str, pods: dict[str, dict]) -> list[str]:
    return [node for node, pod in pods.items()
            if any(w.startswith(f"evict pod llm/{pod['metadata']['name']} ") for w in h.mutations(caplog_text))]


def _gone(installer, pods: dict[str, dict]) -> list[str]:
    """The nodes whose original pod is gone or terminating (evicted)."""
    return [node for node, pod in pods.items()
            if pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in h.workload_pods(
                installer, "llm", pod["metadata"]["labels"]["app"])}]


def test_a_pdb_that_allows_one_disruption_makes_the_second_eviction_wait_and_the_thread_hears_why(
        fleet, cluster, runtime, caplog):
    fleet(fl.FleetSpec(name="budget", system_nodes=0,
                       pools=(fl.PoolSpec(name="budget", kind="serving", nodes=3),)))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["budget-01", "budget-02", "budget-03"])
    installer.create({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": "llm", "labels": {fl.FLEET_LABEL: "budget"}}})
    for index in (1, 2, 3):
        installer.create(_pinned_deployment("llm", f"llm-{index}", f"budget-0{index}"))
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "llm", "namespace": "llm"},
           "spec": {"minAvailable": 2, "selector": {"matchLabels": {"tier": "llm"}}}}
    installer.create(pdb)
    pods = {f"budget-0{i}": _ready_pod(installer, "llm", f"llm-{i}") for i in (1, 2)}
    wait_until(lambda: installer.get(pdb).get("status", {}).get("disruptionsAllowed") == 1, timeout=30,
               what="the PDB to allow one disruption (3 healthy, 2 must stay)")

    asked, request, run = ask_approve_start(runtime, '/gpu drain budget-01 budget-02 for 10m "rack move"')
    assert "PDB llm/llm allows 1 disruption now but a wave evicts 2 of its pods" in _texts(asked)
    db = runtime.database.get()
    with caplog.at_level(logging.INFO, logger="gpuops.kube"), h.EngineThread(cluster.kubeconfig, db.path):
        # Both nodes are cordoned at once (one wave); the budget lets one pod go.
        wait_until(lambda: any(m["event"] == "step.pdb-blocked" for m in h.thread_messages(db)) or None,
                   timeout=60, what="the thread to hear that a PDB blocks the second eviction")
        # Read from the cluster: the log cannot tell an eviction still in flight (a retry of
        # the refused one) from one that was done.
        first = _gone(installer, pods)
        assert len(first) == 1, first
        waiting = "budget-02" if first == ["budget-01"] else "budget-01"
        assert _step_state(runtime, run.id, waiting, "evict") == "running"
        # The node whose pod went moves on to its hold; until it holds, the two views read
        # below may each see it at a different step.
        other = "budget-01" if waiting == "budget-02" else "budget-02"
        wait_until(lambda: _step_state(runtime, run.id, other, "hold") == "running" or None, timeout=60,
                   what=f"{other} to reach its hold")
        # The request's card says what the step waits for, not only the thread.
        shown = _texts(gpu(runtime, "U0ALICE", f"/gpu request {request.id}"))
        assert f"{waiting} | evict | running | eviction of llm/{pods[waiting]['metadata']['name']}" in shown, shown
        assert "is blocked by a PodDisruptionBudget" in shown
        # Why the run waits, in one sentence: on the request view and on App Home alike.
        (said,) = [line.split(f"{WAITS_LABEL}: ", 1)[1] for line in shown.splitlines() if line.startswith(WAITS_LABEL)]
        assert said.startswith(f"Waits on {waiting} (evict)"), said  # the other node's hold waits as planned
        assert (f": eviction of llm/{pods[waiting]['metadata']['name']} is blocked by a PodDisruptionBudget"
                in said), said
        home = desk.app_home(runtime, "U0BOB", "bob")
        assert any(request.id in line and line.endswith(said) for line in home.splitlines()), home
        assert [p["metadata"]["uid"] for p in h.workload_pods(installer, "llm", f"llm-{waiting[-1]}")] == [
            pods[waiting]["metadata"]["uid"]]  # still running: the budget held
        # Someone does what the thread says: scales the service up on a node not drained.
        installer.call("PATCH", "/apis/apps/v1/namespaces/llm/deployments/llm-3",
                       body={"spec": {"replicas": 2}}, content_type="application/merge-patch+json")
        wait_until(lambda: _step_state(runtime, run.id, waiting, "evict") == "done", timeout=60,
                   what="the second eviction once the budget allows it")
        wait_until(lambda: all(_step_state(runtime, run.id, n, "hold") == "running" for n in pods), timeout=30,
                   what="both nodes to be held")
        assert gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}").ok
        finished = h.wait_run(db, run.id)

    assert finished.state == "succeeded", finished.halted_reason
    assert sorted(_evicted(caplog.text, pods)) == ["budget-01", "budget-02"]
    blocked = [r for r in audit.for_run(db, run.id) if r.action == "pod.evict"]
    assert len(blocked) == 2  # one intent per pod, however often the budget said no
    for node in pods:
        assert not h.unschedulable(installer, node) and h.cordon_mark(installer, node) is None
    assert audit.verify(db).ok


def _pool_with_a_protected_pod(fleet, cluster, runtime: Runtime, pool: str) -> tuple:
    """A two-node pool whose first node runs solo/solo, protected by a PDB that allows
    no disruption; the installer and the pod, once both nodes advertise their GPUs."""
    fleet(fl.FleetSpec(name=pool, system_nodes=0, pools=(fl.PoolSpec(name=pool, kind="serving", nodes=2),),
                       workloads=(fl.WorkloadSpec(name="solo", namespace="solo", node=f"{pool}-01",
                                                  pdb_min_available=1),)))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, [f"{pool}-01", f"{pool}-02"])
    return installer, _ready_pod(installer, "solo", "solo")


def test_a_pool_that_skips_blocked_nodes_leaves_one_out_gives_it_back_and_drains_the_rest(
        fleet, cluster, runtime, caplog):
    installer, solo = _pool_with_a_protected_pod(fleet, cluster, runtime, "skip")

    _, request, run = ask_approve_start(runtime, '/gpu drain skip-01 skip-02 for 10m "firmware"')
    db = runtime.database.get()
    with caplog.at_level(logging.INFO, logger="gpuops.kube"), h.EngineThread(cluster.kubeconfig, db.path):
        wait_until(lambda: _step_state(runtime, run.id, "skip-01", "uncordon") == "done", timeout=60,
                   what="skip-01 to be left out and given back")
        wait_until(lambda: _step_state(runtime, run.id, "skip-02", "hold") == "running", timeout=30,
                   what="skip-02 to be held")
        assert not h.unschedulable(installer, "skip-01") and h.unschedulable(installer, "skip-02")
        assert gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}").ok
        finished = h.wait_run(db, run.id)

    assert finished.state == "succeeded", finished.halted_reason
    steps = {(s.node, s.kind): s.state for s in runtime.services().runs.get(run.id).steps}  # type: ignore[union-attr]
    assert [steps[("skip-01", k)] for k in ("cordon", "evict", "hold", "validate", "uncordon")] == [
        "done", "skipped", "skipped", "skipped", "done"]
    assert all(steps[("skip-02", k)] == "done" for k in ("cordon", "evict", "hold", "validate", "uncordon"))
    # The pod the budget protected never moved; skip-01 is back as it was.
    assert [p["metadata"]["uid"] for p in h.workload_pods(installer, "solo", "solo")] == [solo["metadata"]["uid"]]
    assert not h.unschedulable(installer, "skip-01") and h.cordon_mark(installer, "skip-01") is None
    assert not h.unschedulable(installer, "skip-02")
    messages = h.thread_messages(db)
    told = [m["text"] for m in messages if m["event"] in ("step.pdb-blocked", "node.left_out")]
    assert len(told) == 2, told
    assert told[0].startswith("skip-01: eviction of solo/") and "then the node is left out of the run" in told[0]
    assert told[1].startswith("skip-01 is left out of this run") and "after 4s" in told[1]
    done = [m["text"] for m in messages if m["event"] == "run.succeeded"]
    assert done == [f"Run {run.id} finished without skip-01 (left out, see the thread); every other step done"]
    assert [r.target for r in audit.for_run(db, run.id) if r.action == "node.left_out"] == ["skip-01"]
    assert audit.verify(db).ok


class Thread:
    """The request threads' messages as they accumulate (reading the outbox takes them)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime, self.messages = runtime, []  # type: list[dict]

    def texts(self, event: str) -> list[str]:
        self.messages += h.thread_messages(self.runtime.database.get())
        return [str(m["text"]) for m in self.messages if m["event"] == event]


def _recheck_fleet(fleet, runtime: Runtime, installer) -> None:
    fleet(fl.FleetSpec(name="recheck", system_nodes=0,
                       pools=(fl.PoolSpec(name="recheck", kind="serving", nodes=3),)))
    _ready_fleet(runtime, installer, ["recheck-01", "recheck-02", "recheck-03"])


def test_a_node_cordoned_by_hand_after_approval_makes_the_wave_wait_until_the_pool_has_room(
        fleet, cluster, runtime, caplog):
    installer = cluster.installer()
    _recheck_fleet(fleet, runtime, installer)
    _, request = ask_and_approve(runtime, '/gpu drain recheck-01 recheck-02 for 10m "rack move"')  # max_unavailable 2
    h.cordon_by_hand(installer, "recheck-03")  # after approval: 3 of 3 would be out
    wait_until(lambda: runtime.fleet.fleet(h.now()).nodes["recheck-03"].cordoned, timeout=30,  # type: ignore[attr-defined]
               what="the bot to see recheck-03 cordoned")
    run = runtime.services().runs.start(request.id, dry_run=False, now=h.now(),  # type: ignore[union-attr]
                                        actor=runtime.config.actor("U0ALICE"))
    thread = Thread(runtime)

    with caplog.at_level(logging.INFO, logger="gpuops.engine"), \
            h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools) as engine:
        wait_until(lambda: thread.texts("run.waiting") or None, timeout=60, what="the thread to hear the wave waits")
        engine.passes_after(10)
        (waits,) = thread.texts("run.waiting")  # said once, however often the engine looks
        assert "Wave 1 waits" in waits and "max_unavailable" in waits and "recheck-03" in waits, waits
        # The request view says it too, not only the thread.
        shown = _texts(gpu(runtime, "U0ALICE", f"/gpu request {request.id}"))
        assert f"{WAITS_LABEL}: {waits}" in shown, shown
        assert not h.unschedulable(installer, "recheck-01") and not h.unschedulable(installer, "recheck-02")
        assert caplog.text.count("Wave 1 waits") == 1

        h.cordon_by_hand(installer, "recheck-03", cordoned=False)  # the pool has room again
        wait_until(lambda: all(_step_state(runtime, run.id, n, "hold") == "running"
                               for n in ("recheck-01", "recheck-02")), timeout=60, what="both nodes to be held")
        assert "wave 1 fits now" in caplog.text
        assert gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}").ok
        finished = h.wait_run(runtime.database.get(), run.id)

    assert finished.state == "succeeded", finished.halted_reason
    assert not h.unschedulable(installer, "recheck-01") and not h.unschedulable(installer, "recheck-02")
    assert [r.action for r in audit.for_run(runtime.database.get(), run.id)].count("run.waiting") == 1


def test_a_wave_that_never_fits_halts_at_the_windows_end_and_touches_no_node(fleet, cluster, runtime):
    installer = cluster.installer()
    _recheck_fleet(fleet, runtime, installer)
    _, request = ask_and_approve(runtime, '/gpu drain recheck-01 recheck-02 for 5m "rack move"')
    h.cordon_by_hand(installer, "recheck-03")
    wait_until(lambda: runtime.fleet.fleet(h.now()).nodes["recheck-03"].cordoned, timeout=30,  # type: ignore[attr-defined]
               what="the bot to see recheck-03 cordoned")
    run = runtime.services().runs.start(request.id, dry_run=False, now=h.now(),  # type: ignore[union-attr]
                                        actor=runtime.config.actor("U0ALICE"))
    thread = Thread(runtime)
    ahead = [dt.timedelta(0)]  # the engine's clock runs ahead once the wave waits

    with h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools,
                        clock=lambda: h.now() + ahead[0]):
        wait_until(lambda: thread.texts("run.waiting") or None, timeout=60, what="the thread to hear the wave waits")
        ahead[0] = dt.timedelta(minutes=6)  # past the window's end
        finished = h.wait_run(runtime.database.get(), run.id)

    assert finished.state == "failed"
    assert "Wave 1 could not start before the window ended" in (finished.halted_reason or "")
    assert "No node is left cordoned by this run" in (finished.halted_reason or "")
    assert not h.unschedulable(installer, "recheck-01") and not h.unschedulable(installer, "recheck-02")
    assert stored_requests.get(runtime.database.get(), id=request.id).state == "failed"  # type: ignore[union-attr]
    assert "run.failed" in [r.action for r in audit.for_run(runtime.database.get(), run.id)]


def test_gpu_uncordon_gives_back_what_a_failed_run_left_cordoned_and_a_hand_uncordon_leaves_no_stale_mark(
        fleet, cluster, runtime):
    fleet(fl.FleetSpec(name="short", system_nodes=0, pools=(fl.PoolSpec(name="short", kind="serving", nodes=3),),
                       special_nodes=(fl.SpecialNode(node="short-01", advertise_gpus=7),
                                      fl.SpecialNode(node="short-02", advertise_gpus=7))))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["short-01", "short-02", "short-03"])
    _, request, run = ask_approve_start(runtime, '/gpu drain short-01 short-02 for 1m "kernel patch"')
    gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}")
    with h.EngineThread(cluster.kubeconfig, runtime.database.get().path, pools=runtime.config.pools):
        assert h.wait_run(runtime.database.get(), run.id).state == "failed"
    assert h.unschedulable(installer, "short-01") and h.unschedulable(installer, "short-02")

    # Refusals change nothing.
    not_cordoned = gpu(runtime, "U0ALICE", "/gpu uncordon short-03")
    assert not not_cordoned.ok and "short-03 is not cordoned" in _texts(not_cordoned)
    assert not gpu(runtime, "U0BOB", "/gpu uncordon short-01").ok  # an approver, not an operator
    assert "Closest: `short-01`" in _texts(gpu(runtime, "U0ALICE", "/gpu uncordon short-1"))
    assert h.unschedulable(installer, "short-01")

    given_back = gpu(runtime, "U0ALICE", "/gpu uncordon short-01")
    assert given_back.ok, _texts(given_back)
    assert not h.unschedulable(installer, "short-01") and h.cordon_mark(installer, "short-01") is None
    rows = audit.recent(runtime.database.get(), 20)
    assert [(r.actor, r.target) for r in rows if r.action == "node.uncordoned"] == [("U0ALICE", "short-01")]

    # short-02 is uncordoned by hand, as gpuops' messages advise: its mark is stale and
    # the leader removes it, so a person's later cordon is not shown as gpuops'.
    h.cordon_by_hand(installer, "short-02", cordoned=False)
    wait_until(lambda: runtime.fleet.fleet(h.now()).nodes["short-02"].stale_mark_run == run.id,  # type: ignore[attr-defined]
               timeout=30, what="the bot to see short-02's stale mark")
    clear_stale_marks(runtime, h.now())
    assert h.cordon_mark(installer, "short-02") is None
    cleared = [r for r in audit.recent(runtime.database.get(), 20) if r.action == "node.mark_cleared"]
    assert [(r.actor, r.target, r.run_id) for r in cleared] == [("gpuops", "short-02", run.id)]
    h.cordon_by_hand(installer, "short-02")
    wait_until(lambda: runtime.fleet.fleet(h.now()).nodes["short-02"].cordoned, timeout=30,  # type: ignore[attr-defined]
               what="the bot to see short-02 cordoned")
    assert "cordoned by hand" in _texts(gpu(runtime, "U0ALICE", "/gpu node short-02"))
    refused = gpu(runtime, "U0ALICE", "/gpu uncordon short-02")
    assert not refused.ok and "was not cordoned by gpuops" in _texts(refused)
    assert h.unschedulable(installer, "short-02")
    assert audit.verify(runtime.database.get()).ok


def _evict_params(request: RequestView) -> dict:
    (evict,) = [step for wave in request.plan.waves for step in wave.steps if step.kind == "evict"]
    return dict(evict.params)


def test_a_pool_that_waits_halts_the_run_at_the_timeout_with_the_blocked_node_cordoned_and_its_pod_untouched(
        fleet, cluster, runtime, caplog):
    installer, solo = _pool_with_a_protected_pod(fleet, cluster, runtime, "wait")

    _, request, run = ask_approve_start(runtime, '/gpu drain wait-01 for 10m "firmware"')
    assert _evict_params(request)["pdb_timeout_action"] == "halt"  # what the pool says (`wait`, read as halt), in the plan
    db = runtime.database.get()
    with caplog.at_level(logging.INFO, logger="gpuops.kube"), h.EngineThread(cluster.kubeconfig, db.path):
        finished = h.wait_run(db, run.id)

    assert finished.state == "failed"
    reason = finished.halted_reason or ""
    assert reason.startswith(f"wait-01: evict failed: wait-01: eviction of solo/{solo['metadata']['name']} is "
                             "blocked by a PodDisruptionBudget"), reason
    assert "gave up after 4s" in reason and "Left cordoned by this run: wait-01" in reason
    assert h.unschedulable(installer, "wait-01") and h.cordon_mark(installer, "wait-01") is not None
    assert [p["metadata"]["uid"] for p in h.workload_pods(installer, "solo", "solo")] == [solo["metadata"]["uid"]]
    writes = h.mutations(caplog.text)
    assert not any(w.startswith("delete pod") for w in h.attempts(caplog.text)), writes
    assert "uncordon node wait-01" not in writes
    messages = h.thread_messages(db)
    blocked = [m["text"] for m in messages if m["event"] == "step.pdb-blocked"]
    assert len(blocked) == 1 and "the run halts with the node cordoned, for a person to decide" in blocked[0]
    assert [m["text"] for m in messages if m["event"] == "run.failed"] == [reason]
    assert stored_requests.get(db, id=request.id).state == "failed"  # type: ignore[union-attr]
    assert audit.verify(db).ok
    # The next shift hears of it: which run, node and why, what is still cordoned, who acts.
    wait_until(lambda: runtime.fleet.fleet(h.now()).nodes["wait-01"].cordoned, timeout=30,  # type: ignore[attr-defined]
               what="the bot to see wait-01 cordoned")
    handover = gpu(runtime, "U0BOB", "/gpu handover")
    (failed,) = [n for s in handover.sections if s.title == "Gone wrong since the last handover" for n in s.notices]
    assert failed.text.startswith(f"{run.id}: drain of wait for {request.id} halted: a PodDisruptionBudget blocked "
                                  "the drain of wait-01 ("), failed.text
    assert f"eviction of solo/{solo['metadata']['name']} is blocked by a PodDisruptionBudget" in failed.text
    assert "Still cordoned: wait-01. alice (who asked) or an operator of wait acts" in failed.text, failed.text
    assert failed.severity == "warning" and failed.command == f"/gpu request {request.id}"


@pytest.mark.parametrize("crash_after", ["pod.delete", "pod.evict"])
def test_a_pool_that_deletes_deletes_each_blocked_pod_exactly_once_even_if_the_engine_is_killed_mid_run(
        fleet, cluster, runtime, tmp_path, crash_after):
    fleet(fl.FleetSpec(name="delete", system_nodes=0,
                       pools=(fl.PoolSpec(name="delete", kind="serving", nodes=2),),
                       workloads=tuple(fl.WorkloadSpec(name=name, namespace="held", node="delete-01",
                                                       pdb_min_available=1) for name in ("held-a", "held-b"))))
    installer = cluster.installer()
    _ready_fleet(runtime, installer, ["delete-01", "delete-02"])
    held = {name: _ready_pod(installer, "held", name) for name in ("held-a", "held-b")}

    _, request, run = ask_approve_start(runtime, '/gpu drain delete-01 for 10m "firmware"')
    assert _evict_params(request)["pdb_timeout_action"] == "delete"
    assert gpu(runtime, "U0ALICE", f"/gpu drain done {request.id}").ok  # the hold ends as soon as it starts
    db = runtime.database.get()
    # The first engine is SIGKILLed right after it commits the first `crash_after` intent
    # (before the call it is about to make); a second one, the same replica restarted, ends the run.
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    first = h.engine_process(cluster.kubeconfig, db.path, identity="engine-0", lease_name="delete-test",
                             log=logs[0], crash_after=crash_after)
    assert first.wait(timeout=120) == -signal.SIGKILL, logs[0].read_text()
    second = h.engine_process(cluster.kubeconfig, db.path, identity="engine-0", lease_name="delete-test",
                              log=logs[1])
    assert second.wait(timeout=120) == 0, logs[1].read_text()

    finished = h.wait_run(db, run.id, timeout=5)
    assert finished.state == "succeeded", finished.halted_reason
    sent = [w for log in logs for w in h.attempts(log.read_text()) if w.startswith("delete pod")]
    assert sorted(w.split(" uid=")[0] for w in sent) == [
        f"delete pod held/{held[name]['metadata']['name']}" for name in ("held-a", "held-b")]
    assert {w.split(" uid=")[1] for w in sent} == {p["metadata"]["uid"] for p in held.values()}
    rows = audit.for_run(db, run.id)
    assert sorted(r.target for r in rows if r.action == "pod.delete") == sorted(
        f"held/{p['metadata']['name']}" for p in held.values())
    assert [r.target for r in rows if r.action == "step.resumed"] == ["delete-01"]
    left = {p["metadata"]["uid"] for name in held for p in h.workload_pods(installer, "held", name)}
    assert not left & {p["metadata"]["uid"] for p in held.values()}
    assert not h.unschedulable(installer, "delete-01") and h.cordon_mark(installer, "delete-01") is None
    assert audit.verify(db).ok
