"""Driver upgrade runs on the real GPU Operator, as the bot's ServiceAccount.

"gpuops drives" (autoUpgrade off, one NVIDIADriver per pool): the run sets the version on
the pool's NVIDIADriver once (audited, with the version it found), then canary first,
wave by wave, restarts each node's driver pod into the new version; the other pool is
untouched. A canary whose new driver crash-loops halts the run before the next wave.

"gpuops gates the operator" (autoUpgrade on, the ClusterPolicy): the operator's own
upgrade controller upgrades each node, one wave at a time, because gpuops holds the others
back with its skip label; the operator's upgrade-failed halts the run and a rollback puts
the old version back.

The first two plans are written by hand (as the engine tests do); the others ask with
`/gpu upgrade`, are approved by two people and started as the scheduler starts them."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from bot.render_text import render_text
from commands.services import Services
from storage import audit
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunService
from workflows.pools.config import GpuCheck
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration import observe
from tests.integration.desk import ACCESS, Desk, bot_granted_for_the_test
from tests.integration.inventory_helpers import _codes, wait_fleet
from workflows.fleet.canaries import LastCanaries
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave


OLD, NEW = "580.95.05", "580.105.08"


def _fleet(**faults) -> fl.FleetSpec:
    return fl.FleetSpec(
        name="upg", system_nodes=0, operator=fl.OperatorSpec(use_nvidia_driver_crd=True),
        pools=(fl.PoolSpec(name="upg", nodes=2, driver_version=OLD, auto_upgrade=False),
               fl.PoolSpec(name="other", nodes=1, driver_version=OLD, auto_upgrade=False)),
        **faults)


NODE_STEPS = [("cordon", {}), ("evict", {}), ("driver", {"version": NEW, "timeout_s": 120}),
              ("wait-for", {"timeout_s": 120}), ("uncordon", {})]


def _upgrade_plan() -> Plan:
    """Canary upg-01 (the version set first), then upg-02."""
    set_version = ("driver-version", {"object": "NVIDIADriver", "name": "upg-driver", "version": NEW})
    waves = [(["upg-01"], [set_version, *NODE_STEPS]), (["upg-02"], NODE_STEPS)]
    return Plan(kind="upgrade", pool="upg", created_for=h.ALICE.user_id, summary=PlanSummary(), waves=tuple(
        Wave(index, tuple(NodeName(n) for n in nodes), tuple(NodeStep(k, NodeName(n), p) for n in nodes for k, p in steps))
        for index, (nodes, steps) in enumerate(waves)))


@pytest.fixture
def as_bot(cluster):
    yield from bot_granted_for_the_test(cluster)


def _driver_version(installer, name: str) -> str:
    return installer.get({"kind": "NVIDIADriver", "metadata": {"name": name}})["spec"]["version"]


def _gfd_version(installer, node: str) -> str | None:
    return observe.node(installer, node)["metadata"]["labels"].get("nvidia.com/cuda.driver-version.full")


def _check_pods(installer) -> list[dict]:
    return installer.list("Pod", namespace="gpuops", selector="gpuops.io/gpu-check=true")


def _converged(installer, nodes) -> None:
    wait_until(lambda: all(advertised(observe.node(installer, n)) == 8 for n in nodes), timeout=120,
               what="every node to advertise its GPUs")


def test_the_run_sets_the_pools_nvidia_driver_once_and_moves_the_pool_node_by_node(fleet, cluster, db, as_bot):
    fleet(_fleet())
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02", "other-01"])
    (other_pod,) = observe.driver_pods(installer, "other-01")

    run = h.start_run(db, _upgrade_plan())
    with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
        finished = h.wait_run(db, run.id, timeout=240)

    assert finished.state == "succeeded", finished.halted_reason
    assert _driver_version(installer, "upg-driver") == NEW
    assert _driver_version(installer, "other-driver") == OLD
    for node in ("upg-01", "upg-02"):
        assert _gfd_version(installer, node) == NEW
        assert not h.unschedulable(installer, node)
    # The other pool's NVIDIADriver and driver pod were left alone.
    assert _gfd_version(installer, "other-01") == OLD
    (still,) = observe.driver_pods(installer, "other-01")
    assert still["metadata"]["uid"] == other_pod["metadata"]["uid"]
    # One audited patch, with the version it replaced.
    patches = [r for r in audit.for_run(db, run.id) if r.action == "driver-version.set"]
    assert [(r.target, r.detail["from"], r.detail["to"]) for r in patches] == [("NVIDIADriver upg-driver", OLD, NEW)]
    assert audit.verify(db).ok


def test_a_canary_whose_new_driver_crash_loops_halts_the_run_before_the_next_wave(fleet, cluster, db, as_bot):
    fleet(_fleet(crashloop_driver_versions=(NEW,)))
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])

    run = h.start_run(db, _upgrade_plan())
    with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
        finished = h.wait_run(db, run.id, timeout=240)

    assert finished.state == "failed"
    assert "upg-01" in (finished.halted_reason or "") and "CrashLoopBackOff" in (finished.halted_reason or "")
    # The canary stays cordoned for a person; the next wave never started.
    assert h.unschedulable(installer, "upg-01")
    assert not h.unschedulable(installer, "upg-02") and _gfd_version(installer, "upg-02") == OLD


UPG_CONFIG = GpuopsConfig.model_validate({
    "pools": {"upg": {"kind": "serving", "windows": "always", "max_unavailable": 1, "upgrade_soak": "1s"}},
    "access": ACCESS,
})


# Every upgraded node runs nvidia-smi in a pod (in the bot's namespace, as deploy/rbac.yaml allows).
CHECKED_CONFIG = UPG_CONFIG.model_copy(update={"upgrades": UPG_CONFIG.upgrades.model_copy(update={
    "gpu_check": GpuCheck(timeout=dt.timedelta(seconds=60))})})


def _Desk(cluster, db, fleet_cache, as_bot: str, config: GpuopsConfig = UPG_CONFIG, **cache) -> Desk:
    services = Services.on_database(config=config, fleet=fleet_cache(user=as_bot, **cache), database=db)
    return Desk(cluster, db, services, config, user=as_bot)


def test_an_upgrade_asked_for_and_approved_by_two_people_moves_the_pool_canary_first(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(_fleet())
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])
    desk = _Desk(cluster, db, fleet_cache, as_bot)
    services, say = desk.services, desk.say

    asked = say("U0ALICE", f"upgrade upg to {NEW} driver CVE")
    assert asked.ok, asked.summary
    (request,) = services.requests.open_requests("upg")  # type: ignore[union-attr]
    # Approvals name the exact plan (its hash); the requester cannot approve.
    assert not say("U0ALICE", f"approve {request.id} {request.short_hash}").ok
    for approver in ("U0BOB", "U0CAROL"):
        answer = say(approver, f"approve {request.id} {request.short_hash}")
        assert answer.ok, answer.summary
    run = RunService(db, requests=services.requests).start(request.id, dry_run=False, now=h.now(),
                                                           plan_hash=request.plan_hash)

    with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
        finished = h.wait_run(db, run.id, timeout=240)

    assert finished.state == "succeeded", finished.halted_reason
    assert _driver_version(installer, "upg-driver") == NEW
    assert _driver_version(installer, "other-driver") == OLD
    assert {_gfd_version(installer, n) for n in ("upg-01", "upg-02")} == {NEW}
    assert _gfd_version(installer, "other-01") == OLD


def test_a_halted_upgrade_rolled_back_puts_the_old_version_back_and_gives_the_canary_back(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(_fleet(crashloop_driver_versions=(NEW,)))
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])
    desk = _Desk(cluster, db, fleet_cache, as_bot)
    services, say = desk.services, desk.say

    assert say("U0ALICE", f"upgrade upg to {NEW} driver CVE").ok
    (request,) = services.requests.open_requests("upg")  # type: ignore[union-attr]
    halted = desk.approve_and_run(request.id)
    assert halted.state == "failed" and h.unschedulable(installer, "upg-01")
    # The failed canary's NVIDIADriver was set back at once; upg-01 waits for the rollback.
    assert _driver_version(installer, "upg-driver") == OLD
    assert [(r.detail["from"], r.detail["to"]) for r in audit.for_run(db, halted.id)
            if r.action == "driver-version.set-back"] == [(NEW, OLD)]

    # The halted request's card offers Roll back; the click asks for it as the command would.
    card = say("U0ALICE", f"request {request.id}")
    (button,) = [i for i in card.intents if i.action == "rollback"]
    asked = desk.click(button)
    assert asked.ok, asked.summary
    assert any(f"a rollback of run {halted.id}: upg-01 goes back to {OLD}" in b for b in asked.sections[1].bullets)
    assert [row[1] for row in asked.sections[1].table.rows] == ["upg-01"]  # only what the run changed
    again = desk.click(button)
    assert not again.ok and f"a rollback of run {halted.id} is already asked for" in again.summary
    rollback = desk.rollback_request(halted.id, "upg")
    assert services.requests.get(rollback).channel == "C0OPS"  # type: ignore[union-attr]  # the halted one's
    back = desk.approve_and_run(rollback)

    assert back.state == "succeeded", back.halted_reason
    assert _driver_version(installer, "upg-driver") == OLD
    assert _gfd_version(installer, "upg-01") == OLD
    assert not h.unschedulable(installer, "upg-01")  # taken over from the halted run, and given back
    # The object already named OLD again: the rollback only moved the node.
    assert [r.detail["to"] for r in audit.for_run(db, back.id) if r.action == "driver-version.set"] == []
    # A request for a new upgrade is still refused while a node shows two driver sources;
    # none does now.
    assert fleet_cache(user=as_bot).fleet(h.now()).nodes["upg-01"].driver.owner == "operator"


def test_a_rollback_starts_with_the_node_that_halted_in_its_check_and_never_waits_on_that_cordon(
        fleet, cluster, db, as_bot, fleet_cache):
    # The canary upgraded and was given back; the node of the next wave loaded the new
    # driver, then failed its check pod and halted the run, cordoned. With
    # max_unavailable 1, a rollback that took the canary first would wait on that cordon
    # for ever (windows: always), its two approvals spent.
    fleet(_fleet(check_failing_driver_versions=(NEW,)))
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])
    check = ("gpu-check", {"namespace": "gpuops", "image": GpuCheck().image, "command": ["nvidia-smi"],
                           "resource": "nvidia.com/gpu", "timeout_s": 60})
    set_version = ("driver-version", {"object": "NVIDIADriver", "name": "upg-driver", "version": NEW})
    waves = [(["upg-01"], [set_version, *NODE_STEPS]), (["upg-02"], [*NODE_STEPS[:-1], check, NODE_STEPS[-1]])]
    plan = Plan(kind="upgrade", pool="upg", created_for=h.ALICE.user_id, summary=PlanSummary(), waves=tuple(
        Wave(i, tuple(NodeName(n) for n in nodes), tuple(NodeStep(k, NodeName(n), p) for n in nodes for k, p in steps))
        for i, (nodes, steps) in enumerate(waves)))
    run = h.start_run(db, plan)
    with h.EngineThread(cluster.kubeconfig, db.path, user=as_bot):
        halted = h.wait_run(db, run.id, timeout=240)
    assert halted.state == "failed" and "the check pod on upg-02 failed" in (halted.halted_reason or "")
    assert h.unschedulable(installer, "upg-02") and not h.unschedulable(installer, "upg-01")
    desk = _Desk(cluster, db, fleet_cache, as_bot)

    asked = desk.say("U0ALICE", f"rollback {halted.id}")

    assert asked.ok, asked.summary
    assert [row[1] for row in asked.sections[1].table.rows] == ["upg-02", "upg-01"]  # the halted node first
    back = desk.approve_and_run(desk.rollback_request(halted.id, "upg"))
    assert back.state == "succeeded", back.halted_reason
    for node in ("upg-01", "upg-02"):
        assert _gfd_version(installer, node) == OLD and not h.unschedulable(installer, node)
    assert not [r for r in audit.for_run(db, back.id) if r.action == "run.waiting"]  # never waited on a cordon


def test_each_upgraded_node_runs_the_check_pod_and_only_a_passing_node_is_given_back(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(_fleet())
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])
    desk = _Desk(cluster, db, fleet_cache, as_bot, CHECKED_CONFIG)
    services, say = desk.services, desk.say

    asked = say("U0ALICE", f"upgrade upg to {NEW} driver CVE")
    assert asked.ok, asked.summary
    assert any("a check pod in gpuops runs `nvidia-smi`" in b for b in asked.sections[1].bullets)
    (request,) = services.requests.open_requests("upg")  # type: ignore[union-attr]
    finished = desk.approve_and_run(request.id)

    assert finished.state == "succeeded", finished.halted_reason
    rows = audit.for_run(db, finished.id)
    assert [r.detail["node"] for r in rows if r.action == "gpu-check.start"] == ["upg-01", "upg-02"]
    assert [r.detail["node"] for r in rows if r.action == "gpu-check.passed"] == ["upg-01", "upg-02"]
    assert _check_pods(installer) == []  # a passed check leaves nothing behind
    for node in ("upg-01", "upg-02"):
        assert _gfd_version(installer, node) == NEW and not h.unschedulable(installer, node)


def test_a_driver_that_loads_but_fails_the_check_pod_halts_on_the_canary_and_a_rollback_passes_it(
        fleet, cluster, db, as_bot, fleet_cache):
    # The new driver comes up Ready and advertises every GPU: only the check pod sees it is broken.
    fleet(_fleet(check_failing_driver_versions=(NEW,)))
    installer = cluster.installer()
    _converged(installer, ["upg-01", "upg-02"])
    # The fleet reads each node's last check-pod verdict from gpuops' records, as the bot does.
    desk = _Desk(cluster, db, fleet_cache, as_bot, CHECKED_CONFIG, canaries=LastCanaries(lambda: db))
    services, say = desk.services, desk.say

    assert say("U0ALICE", f"upgrade upg to {NEW} driver CVE").ok
    (request,) = services.requests.open_requests("upg")  # type: ignore[union-attr]
    halted = desk.approve_and_run(request.id)

    assert halted.state == "failed"
    reason = halted.halted_reason or ""
    assert "the check pod on upg-01 failed: `nvidia-smi` exited 18" in reason, reason
    assert "Driver/library version mismatch" in reason
    assert _gfd_version(installer, "upg-01") == NEW and advertised(observe.node(installer, "upg-01")) == 8
    assert h.unschedulable(installer, "upg-01")  # stays out, for a person
    assert not h.unschedulable(installer, "upg-02") and _gfd_version(installer, "upg-02") == OLD
    (kept,) = _check_pods(installer)  # kept for its logs
    assert kept["spec"]["nodeName"] == "upg-01" and kept["status"]["phase"] == "Failed"
    # Its device plugin is Ready and advertises every GPU: only the canary's verdict says
    # a container cannot use them, and `/gpu findings` and `/gpu node` say so.
    view = wait_fleet(services.fleet, lambda v: "canary-failed" in _codes(v, "upg-01"), "the canary finding")
    (found,) = [f for f in view.findings_about("upg-01") if f.code == "canary-failed"]
    assert found.severity == "warning"  # cordoned: no new pod lands there
    assert "device plugin on upg-01 is Ready and advertises 8 GPUs" in found.message, found.message
    assert f"run {halted.id}: exited 18" in found.message and "Driver/library version mismatch" in found.message
    assert "canary-failed" not in _codes(view, "upg-02")  # never checked
    assert "check pod there failed" in render_text(say("U0ALICE", "findings upg"))
    node = render_text(say("U0ALICE", "node upg-01"))
    assert "check pod there failed" in node and "Last GPU check" in node, node

    asked = say("U0ALICE", f"rollback {halted.id}")
    assert asked.ok, asked.summary
    back = desk.approve_and_run(desk.rollback_request(halted.id, "upg"))

    assert back.state == "succeeded", back.halted_reason
    assert _gfd_version(installer, "upg-01") == OLD and not h.unschedulable(installer, "upg-01")
    assert [r.detail["node"] for r in audit.for_run(db, back.id) if r.action == "gpu-check.passed"] == ["upg-01"]
    # A check pod passed since: the finding is gone.
    view = wait_fleet(services.fleet, lambda v: "canary-failed" not in _codes(v, "upg-01"),
                      "the canary finding to clear")
    assert view.canaries["upg-01"].passed
    assert "check pod there failed" not in render_text(say("U0ALICE", "node upg-01"))


# ---- gpuops gates the operator (autoUpgrade on)

GATED = fl.FleetSpec(
    # The operator's upgrade controller looks again every 2 minutes; the nudge wakes it
    # when a driver pod turns Ready or starts crash-looping, as its next look would.
    name="upg", system_nodes=1, nudge_upgrade_controller=True,
    operator=fl.OperatorSpec(auto_upgrade=True, driver_version=OLD),
    pools=(fl.PoolSpec(name="upg", nodes=3),),
)
GATED_NODES = ("upg-01", "upg-02", "upg-03")
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
HELD_BY = "gpuops.io/driver-upgrade-held-by"
BUSY = ("cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
        "pod-restart-required", "validation-required", "uncordon-required")


def _policy_version(installer) -> str:
    name = GATED.operator.cluster_policy_name
    return installer.get({"kind": "ClusterPolicy", "metadata": {"name": name}})["spec"]["driver"]["version"]


def _node_row(reply, node: str) -> tuple[str, ...]:
    return next(row for row in reply.sections[-1].table.rows if row[0] == node)


class _Watcher:
    """The upgrade state of every node, as a poll sees it: which nodes the operator had
    in hand at once, and in what order it took them up."""

    def __init__(self, installer) -> None:
        self.installer, self.busy_together, self.started = installer, 0, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self.stop.wait(0.2):
            busy = [n for n in GATED_NODES if observe.node(self.installer, n)["metadata"]["labels"].get(
                "nvidia.com/gpu-driver-upgrade-state") in BUSY]
            self.busy_together = max(self.busy_together, len(busy))
            self.started += [n for n in busy if n not in self.started]

    def __enter__(self) -> _Watcher:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def test_with_auto_upgrade_on_the_operator_upgrades_the_pool_one_approved_wave_at_a_time(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(GATED)
    installer = cluster.installer()
    _converged(installer, GATED_NODES)
    desk = _Desk(cluster, db, fleet_cache, as_bot, CHECKED_CONFIG)
    services, say = desk.services, desk.say

    asked = say("U0ALICE", f"upgrade upg to {NEW} driver CVE")
    assert asked.ok, asked.summary
    facts = {f.label: f.value for f in asked.sections[0].facts}
    assert "autoUpgrade on: gpuops gates the operator" in facts["Driver set by"]
    assert [row[1] for row in asked.sections[1].table.rows] == ["upg-01", "upg-02", "upg-03"]
    (request,) = services.requests.open_requests("upg")  # type: ignore[union-attr]
    with _Watcher(installer) as watched:
        finished = desk.approve_and_run(request.id, timeout=420)

    assert finished.state == "succeeded", finished.halted_reason
    assert _policy_version(installer) == NEW
    for node in GATED_NODES:
        seen = observe.node(installer, node)
        assert _gfd_version(installer, node) == NEW
        assert not seen["spec"].get("unschedulable")
        assert seen["metadata"]["labels"].get("nvidia.com/gpu-driver-upgrade-state") == "upgrade-done"
        assert SKIP not in seen["metadata"]["labels"] and HELD_BY not in seen["metadata"].get("annotations", {})
    # The operator had one node in hand at a time, in the plan's order: the others were held.
    assert watched.busy_together == 1 and watched.started == list(GATED_NODES), watched.started
    actions = [(r.action, r.target) for r in audit.for_run(db, finished.id)
               if r.action.startswith(("driver-upgrade.", "driver-version."))]
    assert actions[:2] == [("driver-upgrade.hold", "3 node(s)"),
                           ("driver-version.set", f"ClusterPolicy {GATED.operator.cluster_policy_name}")]
    assert [t for a, t in actions if a == "driver-upgrade.let-go"] == [f"node {n}" for n in GATED_NODES]
    # Each node passed its check pod (after the operator's upgrade) before it was given back.
    assert [r.detail["node"] for r in audit.for_run(db, finished.id) if r.action == "gpu-check.passed"] == list(
        GATED_NODES)
    assert _check_pods(installer) == []


def test_the_operators_upgrade_failed_halts_the_gated_run_and_a_rollback_puts_the_old_driver_back(
        fleet, cluster, db, as_bot, fleet_cache):
    fleet(GATED.model_copy(update={"crashloop_driver_versions": (NEW,)}))
    installer = cluster.installer()
    _converged(installer, GATED_NODES)
    desk = _Desk(cluster, db, fleet_cache, as_bot)
    services, say = desk.services, desk.say
    before = {n: observe.driver_pods(installer, n)[0]["metadata"]["uid"] for n in ("upg-02", "upg-03")}

    assert say("U0ALICE", f"upgrade upg to {NEW} driver CVE").ok
    (request,) = services.requests.open_requests("upg")  # type: ignore[union-attr]
    halted = desk.approve_and_run(request.id, timeout=420)

    assert halted.state == "failed"
    assert "the GPU Operator marked upg-01 upgrade-failed" in (halted.halted_reason or ""), halted.halted_reason
    assert h.unschedulable(installer, "upg-01")
    assert _policy_version(installer) == OLD  # set back: no restart anywhere takes the failed version
    for node in ("upg-02", "upg-03"):  # still held back, never touched
        seen = observe.node(installer, node)
        assert seen["metadata"]["labels"].get(SKIP) == "true"
        assert seen["metadata"]["annotations"].get(HELD_BY) == halted.id
        assert observe.driver_pods(installer, node)[0]["metadata"]["uid"] == before[node]
        assert not seen["spec"].get("unschedulable") and _gfd_version(installer, node) == OLD
    # /gpu status says who holds them (once the watch cache has seen the labels).
    wait_until(lambda: _node_row(say("U0ALICE", "status upg"), "upg-02")[-1].endswith(
        f"held from the operator's upgrade by {halted.id}"), timeout=30, what="status to show the hold")

    asked = say("U0ALICE", f"rollback {halted.id}")
    assert asked.ok, asked.summary
    assert [row[1] for row in asked.sections[1].table.rows] == ["upg-01"]
    back = desk.approve_and_run(desk.rollback_request(halted.id, "upg"), timeout=420)

    assert back.state == "succeeded", back.halted_reason
    assert _policy_version(installer) == OLD
    assert _gfd_version(installer, "upg-01") == OLD and not h.unschedulable(installer, "upg-01")
    for node in GATED_NODES:
        seen = observe.node(installer, node)
        assert SKIP not in seen["metadata"]["labels"] and HELD_BY not in seen["metadata"].get("annotations", {})
    # The nodes that never moved kept their driver pods: the old version is theirs again.
    for node in ("upg-02", "upg-03"):
        assert observe.driver_pods(installer, node)[0]["metadata"]["uid"] == before[node]
    # The halted run had set the ClusterPolicy back already: the rollback only moved upg-01.
    assert [r.detail["to"] for r in audit.for_run(db, halted.id) if r.action == "driver-version.set-back"] == [OLD]
    assert [r.detail["to"] for r in audit.for_run(db, back.id) if r.action == "driver-version.set"] == []
