"""The proof that a kind of change is one package and one registry line: "set a node
label inside a window" lives only in tests/kinds/node_label (its registry line, plan,
service, commands module and `set-label` step logic), put in force the way a process's
composition root does, and goes through what every kind goes through on the real control
plane: `/gpu label` asked by alice, approved by bob and carol (the two-person rule of a
serving pool, from the kind's own default approvals), run inside the pool's window as the
bot's ServiceAccount, the engine killed after each commit in turn and restarted (the
label patched once, the audit saying so once), and a halted run rolled back."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest

from commands.services import Services
from storage import audit
from storage.database import open_database
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.integration import engine_harness as h
from tests.integration.desk import ACCESS, Desk, grant_bot_rbac, revoke_bot_rbac
from tests.kinds.node_label import KIND, in_force
from tests.kinds.node_label.service import LabelService
from tests.kinds.node_label.step_logic import REFUSE
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunService
from workflows.fleet.watchcache import FleetCache
from workflows.kube.gateway import KubeGateway
from workflows.pools.windows import DAY_NAMES

POOL, NODES = "lbl", ("lbl-01", "lbl-02")
FLEET = fl.FleetSpec(name=POOL, system_nodes=0, pools=(fl.PoolSpec(name=POOL, kind="serving", nodes=2),))
LABEL = "tests.gpuops.dev/tier"
ENGINE = "tests.kinds.node_label.engine_process"


def _config(now: dt.datetime) -> GpuopsConfig:
    """A serving pool whose window opened an hour ago and stays open three more."""
    opened = now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)
    window = {"days": list(DAY_NAMES), "start": f"{opened:%H:%M}",
              "end": f"{opened + dt.timedelta(hours=4):%H:%M}", "timezone": "UTC"}
    return GpuopsConfig.model_validate({
        "pools": {POOL: {"kind": "serving", "windows": [window], "max_unavailable": 1}}, "access": ACCESS})


class _Desk(Desk):
    def ask(self, text: str) -> str:
        asked = self.say("U0ALICE", text)
        assert asked.ok, asked.summary
        (request,) = self.services.requests.open_requests(POOL)  # type: ignore[union-attr]
        return request.id

    def approve(self, request_id: str):
        """Bob approves (not enough on a serving pool), then carol; the run starts as the
        scheduler starts it."""
        view = self.services.requests.get(request_id)  # type: ignore[union-attr]
        assert view.approvals_required == 2
        first = self.say("U0BOB", f"approve {view.id} {view.short_hash}")
        assert first.ok, first.summary
        assert self.services.requests.get(request_id).state == "pending"  # type: ignore[union-attr]
        second = self.say("U0CAROL", f"approve {view.id} {view.short_hash}")
        assert second.ok, second.summary
        assert self.services.requests.get(request_id).state == "approved"  # type: ignore[union-attr]
        return RunService(self.db, requests=self.services.requests).start(view.id, dry_run=False, now=h.now(),
                                                                          plan_hash=view.plan_hash)


@pytest.fixture
def desk(fleet, cluster, tmp_path):
    with in_force() as kinds:
        fleet(FLEET)
        installer = cluster.installer()
        wait_until(lambda: all(advertised(h.node(installer, n)) == 8 for n in NODES), timeout=60,
                   what="the label fleet to advertise its GPUs")
        grant_bot_rbac(installer)
        # The database as a composition root opens it: reference rows from the registry in force.
        stored = kinds.storage_kinds()
        db = open_database(tmp_path / "gpuops.db", request_kinds=stored.request_kinds, step_kinds=stored.step_kinds)
        config = _config(h.now())
        gateway = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context="bot")
        cache = FleetCache(gateway, settings=config.inventory_settings()).start()
        # Its service comes from its registry line, as every kind's does.
        services = Services.on_database(config=config, fleet=cache, database=db)
        assert isinstance(services.changes[KIND.name], LabelService)
        try:
            yield _Desk(cluster, db, services, config)
        finally:
            cache.stop()
            db.close()
            revoke_bot_rbac(installer)


def _labels(installer, node: str) -> str | None:
    return h.node(installer, node)["metadata"]["labels"].get(LABEL)


def _set_by_hand(installer, node: str, *, labels=None, annotations=None) -> None:
    installer.call("PATCH", f"/api/v1/nodes/{node}",
                   body={"metadata": {"labels": labels or {}, "annotations": annotations or {}}},
                   content_type="application/merge-patch+json")


def test_a_kind_from_its_own_package_is_asked_for_approved_by_two_and_run_with_a_kill_after_every_commit(
        desk, tmp_path):
    installer = desk.cluster.installer()
    boundaries = 0
    for crash_after in range(1, 40):
        value = f"round-{crash_after}"
        request = desk.ask(f"label {POOL} {LABEL}={value} gold tier for round {crash_after}")
        run = desk.approve(request)
        logs = [tmp_path / f"round-{crash_after}-first.log", tmp_path / f"round-{crash_after}-second.log"]
        killed = h.crash_and_resume(desk.cluster.kubeconfig, desk.db.path, crash_after=crash_after, logs=logs,
                                    identity="engine-0", lease_name="label-crash", context="bot", module=ENGINE)
        where = f"crash after commit {crash_after}"
        finished = h.wait_run(desk.db, run.id, timeout=5)
        assert finished.state == "succeeded", (where, finished.halted_reason)
        calls = Counter(" ".join(m.split()[:3]) for log in logs if log.exists()
                        for m in h.mutations(log.read_text()))
        assert calls == Counter({f"label node {n}": 1 for n in NODES}), (where, calls)
        rows = audit.for_run(desk.db, run.id)
        assert Counter(r.target for r in rows if r.action == "node.label") == Counter(
            {f"node {n}": 1 for n in NODES}), where
        assert {r.detail["value"] for r in rows if r.action == "node.label"} == {value}, where
        assert all(_labels(installer, n) == value for n in NODES), where
        if not killed:
            break
        boundaries += 1
    else:
        pytest.fail("the first engine never finished the run by itself")
    assert boundaries >= 6
    assert audit.verify(desk.db).ok


def test_a_halted_run_of_a_kind_from_its_own_package_is_rolled_back(desk):
    installer = desk.cluster.installer()
    _set_by_hand(installer, "lbl-01", labels={LABEL: "silver"})
    _set_by_hand(installer, "lbl-02", annotations={REFUSE: "true"})

    request = desk.ask(f"label {POOL} {LABEL}=gold gold tier")
    run = desk.approve(request)
    with h.EngineThread(desk.cluster.kubeconfig, desk.db.path, user="bot"):
        halted = h.wait_run(desk.db, run.id)

    assert halted.state == "failed"
    assert halted.halted_reason is not None and "lbl-02 refuses label" in halted.halted_reason
    assert (_labels(installer, "lbl-01"), _labels(installer, "lbl-02")) == ("gold", None)

    # Someone fixed the node; the rollback asks for each label the run touched back.
    _set_by_hand(installer, "lbl-02", annotations={REFUSE: None})
    asked = desk.say("U0ALICE", f"rollback {halted.id}")
    assert asked.ok, asked.summary
    assert asked.title.startswith("Node label request")
    back_request = desk.rollback_request(halted.id, POOL)
    back = desk.approve(back_request)
    with h.EngineThread(desk.cluster.kubeconfig, desk.db.path, user="bot"):
        finished = h.wait_run(desk.db, back.id)

    assert finished.state == "succeeded", finished.halted_reason
    assert (_labels(installer, "lbl-01"), _labels(installer, "lbl-02")) == ("silver", None)
