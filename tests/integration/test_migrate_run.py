"""Moving a pool from host drivers to the GPU Operator on the real operator, as the bot's
ServiceAccount: asked for with `/gpu migrate`, approved by two people, run one node at a
time. The test plays the person at the node: it removes the host driver through the
simulator's knob and says so with the Host driver removed button (or the command). A test
pod that fails halts the run and a rollback restores the node's labels in one step,
leaving it cordoned; a node nobody frees halts the run at its time limit; the way back
turns the operator's driver off before asking for the host's."""

from __future__ import annotations

import pytest

from commands.services import Services
from storage import audit
from testenv import fleet as fl
from testenv.install import wait_until
from tests.integration import engine_harness as h
from tests.integration import observe
from tests.integration.desk import ACCESS, Desk, grant_bot_rbac, revoke_bot_rbac
from workflows.config import GpuopsConfig
from workflows.engine.runs import PERSON_STEPS, RunService
from workflows.fleet.watchcache import FleetCache
from workflows.kube.gateway import KubeGateway


NODES = ("mv-01", "mv-02")
HOST = "570.172.08"
OPERATOR = "580.95.05"
DEPLOY = "nvidia.com/gpu.deploy.driver"


def _fleet(**faults) -> fl.FleetSpec:
    return fl.FleetSpec(name="mv", system_nodes=0, operator=fl.OperatorSpec(driver_version=OPERATOR),
                        pools=(fl.PoolSpec(name="mv", kind="serving", nodes=2),),
                        special_nodes=tuple(fl.SpecialNode(node=n, host_driver=HOST, driver_deploy="pre-installed")
                                            for n in NODES), **faults)


def _config(**pool) -> GpuopsConfig:
    return GpuopsConfig.model_validate({
        "pools": {"mv": {"kind": "serving", "windows": "always", "max_unavailable": 2, "validate_timeout": "90s",
                         **pool}},
        "upgrades": {"gpu_check": {"timeout": "60s"}},
        "access": ACCESS,
    })


class _Desk(Desk):
    def __init__(self, cluster, db, config: GpuopsConfig) -> None:
        gateway = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context="bot")
        self.cache = FleetCache(gateway, settings=config.inventory_settings()).start()
        services = Services.on_database(config=config, fleet=self.cache, database=db, readers=(gateway,))
        super().__init__(cluster, db, services, config)
        self.installer = cluster.installer()

    def approved_run(self, text: str) -> str:
        asked = self.say("U0ALICE", text)
        assert asked.ok, asked.summary
        (view,) = self.services.requests.open_requests("mv")  # type: ignore[union-attr]
        for approver in ("U0BOB", "U0CAROL"):
            assert self.say(approver, f"approve {view.id} {view.short_hash}").ok
        return RunService(self.db, requests=self.services.requests).start(
            view.id, dry_run=False, now=h.now(), plan_hash=view.plan_hash).id

    def waiting_on(self, run_id: str) -> str | None:
        run = RunService(self.db).get(run_id)
        return next((s.node for s in run.steps if s.kind in PERSON_STEPS and s.state == "running"), None)

    def free(self, node: str) -> None:
        """The person at the node removes the host driver (the simulator's knob)."""
        self.installer.call("PATCH", f"/api/v1/nodes/{node}", content_type="application/merge-patch+json",
                            body={"metadata": {"annotations": {fl.ANN_HOST_DRIVER: None}}})


def _host_driver_works(inv) -> bool:
    return (inv is not None and not inv.driver_pod.present and inv.validator_pod.condition == "healthy"
            and inv.advertised_gpus == inv.expected_advertised)


@pytest.fixture
def desk(fleet, cluster, db):
    def make(spec: fl.FleetSpec, config: GpuopsConfig) -> _Desk:
        fleet(spec)
        installer = cluster.installer()
        grant_bot_rbac(installer)
        wait_until(lambda: all(h.node(installer, n)["status"].get("capacity", {}).get("nvidia.com/gpu") == "8"
                               for n in NODES), timeout=120, what="the host-driver nodes to advertise their GPUs")
        made.append(_Desk(cluster, db, config))
        if hosts := [s.node for s in spec.special_nodes if s.host_driver]:
            # The host-driver step notes at its start whether the node's driver works; a run
            # started before the validator is Ready reads "no working host driver" instead.
            wait_until(lambda: all(_host_driver_works(made[-1].cache.fleet(h.now()).nodes.get(n)) for n in hosts),
                       timeout=120, what="the inventory to see the host drivers working")
        return made[-1]

    made: list[_Desk] = []
    yield make
    for one in made:
        one.cache.stop()
    if made:  # a later test on this worker's control plane finds the bot with no rights again
        revoke_bot_rbac(cluster.installer())


def test_a_pool_moves_from_host_drivers_to_the_operator_one_node_at_a_time_with_a_person_at_each(desk):
    d = desk(_fleet(), _config())
    preview = d.say("U0ALICE", "migrate mv to operator --dry-run")
    assert preview.ok, preview.summary
    notes = preview.sections[1].bullets
    assert any(n.startswith("mv-01: driver owner host") and "nvidia.com/gpu.deploy.driver: pre-installed -> true" in n
               for n in notes), notes
    assert [row[1] for row in preview.sections[1].table.rows] == ["mv-01", "mv-02"]  # one at a time
    assert not d.say("U0ALICE", "migrate mv to host").ok

    run_id = d.approved_run("migrate mv to operator one driver source")
    with h.EngineThread(d.cluster.kubeconfig, d.db.path, user="bot"):
        wait_until(lambda: d.waiting_on(run_id) == "mv-01", timeout=120, what="the run to wait for mv-01's person")
        assert h.unschedulable(d.installer, "mv-01") and not h.unschedulable(d.installer, "mv-02")
        assert not d.say("U0ALICE", f"migrate confirm {run_id} mv-02").ok  # not the node it waits on
        d.free("mv-01")
        # The request's card offers the button; bob (an approver, not an operator) may not press it.
        card = d.say("U0ALICE", f"request {RunService(d.db).get(run_id).run.request_id}")
        (button,) = [i for i in card.intents if i.action == "host-driver-removed"]
        assert button.label == "Host driver removed: mv-01"
        assert not d.click(button, who="U0BOB").ok
        assert d.click(button, who="U0ALICE").ok
        wait_until(lambda: d.waiting_on(run_id) == "mv-02", timeout=180, what="the run to move on to mv-02")
        d.free("mv-02")
        assert d.say("U0ALICE", f"migrate confirm {run_id}").ok
        finished = h.wait_run(d.db, run_id, timeout=180)

    assert finished.state == "succeeded", finished.halted_reason
    for node in NODES:
        seen = h.node(d.installer, node)
        assert seen["metadata"]["labels"][DEPLOY] == "true" and not h.unschedulable(d.installer, node)
        (pod,) = observe.driver_pods(d.installer, node)
        assert observe.pod_ready(pod)
    wait_until(lambda: {d.cache.fleet(h.now()).nodes[n].driver.owner for n in NODES} == {"operator"}, timeout=30,
               what="the inventory to see the operator own both drivers")
    rows = audit.for_run(d.db, run_id)
    assert [(r.actor, r.detail["nodes"]) for r in rows if r.action == "run.host-driver-removed"] == [
        ("U0ALICE", ["mv-01"]), ("U0ALICE", ["mv-02"])]
    assert [r.detail["node"] for r in rows if r.action == "gpu-check.passed"] == list(NODES)


def test_a_failing_test_pod_halts_the_move_and_a_rollback_restores_the_node_in_one_step(desk):
    d = desk(_fleet(check_failing_driver_versions=(OPERATOR,)), _config())
    run_id = d.approved_run("migrate mv-01 to operator try one node")
    with h.EngineThread(d.cluster.kubeconfig, d.db.path, user="bot"):
        wait_until(lambda: d.waiting_on(run_id) == "mv-01", timeout=120, what="the run to wait for mv-01's person")
        d.free("mv-01")
        assert d.say("U0ALICE", f"migrate confirm {run_id}").ok
        halted = h.wait_run(d.db, run_id, timeout=180)

    assert halted.state == "failed"
    assert "the check pod on mv-01 failed" in (halted.halted_reason or ""), halted.halted_reason
    assert h.node(d.installer, "mv-01")["metadata"]["labels"][DEPLOY] == "true"
    asked = d.say("U0ALICE", f"rollback {halted.id}")
    assert asked.ok, asked.summary
    back = d.approve_and_run(d.rollback_request(halted.id, "mv"), timeout=120)

    assert back.state == "succeeded", back.halted_reason
    seen = h.node(d.installer, "mv-01")
    assert seen["metadata"]["labels"][DEPLOY] == "pre-installed"  # as the snapshot had it
    assert h.unschedulable(d.installer, "mv-01")  # for the host driver to go back on
    assert [r.action for r in audit.for_run(d.db, back.id) if r.action == "node.restore"] == ["node.restore"]
    wait_until(lambda: not observe.driver_pods(d.installer, "mv-01"), timeout=60,
               what="the operator to take its driver pod off mv-01")


def test_a_node_nobody_frees_halts_the_move_at_its_time_limit_with_the_node_cordoned(desk):
    d = desk(_fleet(), _config(host_driver_timeout="20s"))
    run_id = d.approved_run("migrate mv-02 to operator nobody will come")
    with h.EngineThread(d.cluster.kubeconfig, d.db.path, user="bot"):
        halted = h.wait_run(d.db, run_id, timeout=120)

    assert halted.state == "failed"
    reason = halted.halted_reason or ""
    assert reason.startswith("mv-02: host-driver-removed failed: timed out after 20s"), reason
    assert "waiting for a person to remove the host driver from mv-02" in reason
    assert h.unschedulable(d.installer, "mv-02")
    assert h.node(d.installer, "mv-02")["metadata"]["labels"][DEPLOY] == "pre-installed"  # never changed


def test_the_way_back_turns_the_operators_driver_off_then_waits_for_the_host_driver_to_be_installed(desk):
    d = desk(fl.FleetSpec(name="mv", system_nodes=0, operator=fl.OperatorSpec(driver_version=OPERATOR),
                          pools=(fl.PoolSpec(name="mv", kind="serving", nodes=2),)), _config())
    (before,) = observe.driver_pods(d.installer, "mv-02")
    run_id = d.approved_run("migrate mv-02 to host vendor kernel module needed")
    with h.EngineThread(d.cluster.kubeconfig, d.db.path, user="bot"):
        wait_until(lambda: d.waiting_on(run_id) == "mv-02", timeout=120, what="the run to wait for mv-02's person")
        # The operator took its driver off before anyone was asked to install the host's.
        assert observe.driver_pods(d.installer, "mv-02") == []
        card = d.say("U0ALICE", f"request {RunService(d.db).get(run_id).run.request_id}")
        (button,) = [i for i in card.intents if i.action == "host-driver-removed"]
        assert button.label == "Host driver installed: mv-02"
        d.installer.call("PATCH", "/api/v1/nodes/mv-02", content_type="application/merge-patch+json",
                         body={"metadata": {"annotations": {fl.ANN_HOST_DRIVER: HOST}}})
        assert d.click(button, who="U0ALICE").ok
        finished = h.wait_run(d.db, run_id, timeout=180)

    assert finished.state == "succeeded", finished.halted_reason
    assert h.node(d.installer, "mv-02")["metadata"]["labels"][DEPLOY] == "pre-installed"
    assert not h.unschedulable(d.installer, "mv-02")
    assert [(r.actor, r.detail["nodes"]) for r in audit.for_run(d.db, run_id)
            if r.action == "run.host-driver-installed"] == [("U0ALICE", ["mv-02"])]
    wait_until(lambda: d.cache.fleet(h.now()).nodes["mv-02"].driver.owner == "host", timeout=30,
               what="the inventory to see the host own mv-02's driver")
    assert d.cache.fleet(h.now()).nodes["mv-01"].driver.owner == "operator"  # the other node was left alone


def test_labels_a_person_set_are_removed_for_gfd_and_put_back_by_a_rollback_and_the_nodes_evidence_stands_in(desk):
    """The pool takes the node's evidence (host_driver_evidence): removing the host driver
    is enough, nobody presses a button. A hand-set product label goes with the move (GFD
    publishes the real one) and comes back with the rollback."""
    d = desk(_fleet(check_failing_driver_versions=(OPERATOR,)), _config(host_driver_evidence=True))
    discovered = h.node(d.installer, "mv-01")["metadata"]["labels"]["nvidia.com/gpu.product"]
    # What `kubectl label --overwrite node mv-01 nvidia.com/gpu.product=...` sends.
    d.installer.call("PATCH", "/api/v1/nodes/mv-01", query=[("fieldManager", "kubectl-label")],
                     content_type="application/merge-patch+json",
                     body={"metadata": {"labels": {"nvidia.com/gpu.product": "A100-80G-by-hand"}}})
    preview = d.say("U0ALICE", "migrate mv to operator --dry-run")
    assert preview.ok, preview.summary
    (note,) = [n for n in preview.sections[1].bullets if n.startswith("mv-01: ")]
    assert note.endswith("nvidia.com/gpu.product=A100-80G-by-hand (set by kubectl-label)"), note
    assert not any("hand-set" in n for n in preview.sections[1].bullets if n.startswith("mv-02: "))

    run_id = d.approved_run("migrate mv-01 to operator with its evidence")
    with h.EngineThread(d.cluster.kubeconfig, d.db.path, user="bot"):
        wait_until(lambda: d.waiting_on(run_id) == "mv-01", timeout=120, what="the run to wait for mv-01's driver")
        d.free("mv-01")  # and nobody confirms
        halted = h.wait_run(d.db, run_id, timeout=180)

    assert "the check pod on mv-01 failed" in (halted.halted_reason or ""), halted.halted_reason  # after the labels
    (removed,) = [r for r in audit.for_run(d.db, run_id) if r.action == "run.host-driver-removed"]
    assert (removed.actor, removed.detail["by"]) == (audit.GPUOPS_ACTOR, "evidence")
    assert "no longer has a working driver" in removed.detail["evidence"]
    wait_until(lambda: h.node(d.installer, "mv-01")["metadata"]["labels"].get("nvidia.com/gpu.product") == discovered,
               timeout=30, what="GFD to publish the discovered product on mv-01")

    assert d.say("U0ALICE", f"rollback {halted.id}").ok
    back = d.approve_and_run(d.rollback_request(halted.id, "mv"), timeout=120)
    assert back.state == "succeeded", back.halted_reason
    labels = h.node(d.installer, "mv-01")["metadata"]["labels"]
    assert (labels["nvidia.com/gpu.product"], labels[DEPLOY]) == ("A100-80G-by-hand", "pre-installed")


def test_a_pool_that_moves_two_nodes_at_once_after_the_first_takes_each_persons_word_for_their_node_only(desk):
    nodes = ("mv-01", "mv-02", "mv-03")
    spec = fl.FleetSpec(name="mv", system_nodes=0, operator=fl.OperatorSpec(driver_version=OPERATOR),
                        pools=(fl.PoolSpec(name="mv", kind="serving", nodes=3),),
                        special_nodes=tuple(fl.SpecialNode(node=n, host_driver=HOST, driver_deploy="pre-installed")
                                            for n in nodes))
    d = desk(spec, _config(migrate_at_once=2))
    run_id = d.approved_run("migrate mv to operator two at a time")

    def waiting() -> set[str]:
        return {s.node for s in RunService(d.db).get(run_id).steps if s.kind in PERSON_STEPS and s.state == "running"}

    with h.EngineThread(d.cluster.kubeconfig, d.db.path, user="bot"):
        wait_until(lambda: waiting() == {"mv-01"}, timeout=120, what="the first node to wait alone")
        d.free("mv-01")
        assert d.say("U0ALICE", f"migrate confirm {run_id}").ok
        wait_until(lambda: waiting() == {"mv-02", "mv-03"}, timeout=180, what="two nodes to wait at once")
        refused = d.say("U0ALICE", f"migrate confirm {run_id}")
        assert not refused.ok and "name the one whose host driver you changed" in refused.summary, refused.summary
        card = d.say("U0ALICE", f"request {RunService(d.db).get(run_id).run.request_id}")
        buttons = {i.label: i for i in card.intents if i.action == "host-driver-removed"}
        assert set(buttons) == {"Host driver removed: mv-02", "Host driver removed: mv-03"}
        d.free("mv-03")
        assert d.click(buttons["Host driver removed: mv-03"]).ok
        wait_until(lambda: waiting() == {"mv-02"}, timeout=30, what="only mv-02 to wait")
        d.free("mv-02")
        assert d.say("U0ALICE", f"migrate confirm {run_id} mv-02").ok
        finished = h.wait_run(d.db, run_id, timeout=180)

    assert finished.state == "succeeded", finished.halted_reason
    assert [(r.actor, r.detail["nodes"]) for r in audit.for_run(d.db, run_id) if r.action == "run.host-driver-removed"
            ] == [("U0ALICE", ["mv-01"]), ("U0ALICE", ["mv-03"]), ("U0ALICE", ["mv-02"])]
