"""MIG layout changes on the simulated fleet with the real GPU Operator (its own
default-mig-parted-config ConfigMap, read by the bot), as the bot's ServiceAccount:
asked for with `/gpu mig`, approved by two people, run node by node. A wedged node and a
failed layout halt the run and say where; a rollback puts the layout back; the engine
killed after any commit repeats no label patch."""

from __future__ import annotations

from collections import Counter

import pytest

from commands.services import Services
from storage.database import open_database
from testenv import fleet as fl
from testenv.install import wait_until
from tests.integration import engine_harness as h
from tests.integration.desk import ACCESS, Desk, grant_bot_rbac, revoke_bot_rbac
from workflows.config import GpuopsConfig
from workflows.fleet.watchcache import FleetCache
from workflows.kube.gateway import KubeGateway


A100 = "NVIDIA-A100-SXM4-80GB"
NODES = ("inf-01", "inf-02", "inf-03")
FLEET = fl.FleetSpec(name="inf", system_nodes=0, pools=(
    fl.PoolSpec(name="inf", kind="serving", nodes=3, product=A100, mig_config="all-1g.10gb"),))
CONFIG = GpuopsConfig.model_validate({
    "pools": {"inf": {"kind": "serving", "windows": "always", "max_unavailable": 1, "mig_timeout": "20s",
                      "validate_timeout": "60s", "workloads": {"mig": {"namespaces": ["inference"]}}}},
    "access": ACCESS,
})


@pytest.fixture
def desk(fleet, cluster, db):
    fleet(FLEET)
    installer = cluster.installer()
    grant_bot_rbac(installer)
    wait_until(lambda: all(_capacity(installer, n).get("nvidia.com/mig-1g.10gb") == "56" for n in NODES),
               timeout=120, what="every node to advertise its 56 MIG devices")
    desk = _Desk(cluster, db)
    yield desk
    desk.fleet.stop()
    revoke_bot_rbac(installer)


class _Desk(Desk):
    def __init__(self, cluster, db) -> None:
        gateway = KubeGateway.connect(kubeconfig=cluster.kubeconfig, context="bot")
        fleet = FleetCache(gateway, settings=CONFIG.inventory_settings()).start()
        services = Services.on_database(config=CONFIG, fleet=fleet, database=db, readers=(gateway,))
        super().__init__(cluster, db, services, CONFIG)
        self.installer, self.fleet = cluster.installer(), fleet

    def ask(self, text: str) -> str:
        asked = self.say("U0ALICE", text)
        assert asked.ok, asked.summary
        (request,) = [r for r in self.services.requests.open_requests("inf")]  # type: ignore[union-attr]
        return request.id


def _annotate(installer, node: str, key: str, value: str | None) -> None:
    installer.call("PATCH", f"/api/v1/nodes/{node}", body={"metadata": {"annotations": {key: value}}},
                   content_type="application/merge-patch+json")


def _capacity(installer, node: str) -> dict[str, str]:
    return {k: v for k, v in h.node(installer, node)["status"].get("capacity", {}).items()
            if k.startswith("nvidia.com/")}


def _mig(installer, node: str) -> tuple[str | None, str | None]:
    labels = h.node(installer, node)["metadata"]["labels"]
    return labels.get("nvidia.com/mig.config"), labels.get("nvidia.com/mig.config.state")


def test_a_pools_mig_change_is_planned_as_a_capacity_change_approved_and_run_node_by_node(desk):
    # A layout name that is not in the MIG manager's config is refused with what it offers.
    wrong = desk.say("U0ALICE", "mig inf all-3g.40g")
    assert not wrong.ok and "no MIG layout `all-3g.40g` in ConfigMap gpu-operator/default-mig-parted-config" in (
        wrong.sections[0].text if wrong.sections else wrong.summary) + wrong.summary
    foreign = desk.say("U0ALICE", "mig inf all-1g.5gb")  # an A100-40GB layout
    assert not foreign.ok and "cannot make" in str(foreign.sections) + foreign.summary
    assert desk.services.requests.open_requests("inf") == []  # type: ignore[union-attr]

    status = desk.say("U0ALICE", "status inf")
    assert {f.label: f.value for f in status.sections[0].facts}["Workloads"] == (
        "MIG slices for namespace inference; whole GPUs for any workload")

    preview = desk.say("U0ALICE", "mig inf all-3g.40gb --dry-run")
    assert preview.ok and preview.title == "MIG change plan (dry run) · inf"
    facts = {f.label: f.value for f in preview.sections[0].facts}
    assert facts["Pool"] == "168x nvidia.com/mig-1g.10gb -> 48x nvidia.com/mig-3g.40gb"
    assert [row[:3] for row in preview.sections[1].table.rows] == [
        (n, "56x nvidia.com/mig-1g.10gb", "16x nvidia.com/mig-3g.40gb") for n in NODES]

    finished = desk.approve_and_run(desk.ask("mig inf all-3g.40gb bigger slices for the 13B model"))

    assert finished.state == "succeeded", finished.halted_reason
    for node in NODES:
        assert _mig(desk.installer, node) == ("all-3g.40gb", "success")
        assert _capacity(desk.installer, node) == {"nvidia.com/mig-3g.40gb": "16"}
        assert not h.unschedulable(desk.installer, node)


def test_a_wedged_node_halts_the_run_naming_the_paused_operands_and_stays_cordoned(desk):
    _annotate(desk.installer, "inf-01", fl.ANN_MIG_STUCK, "true")

    halted = desk.approve_and_run(desk.ask("mig inf all-7g.80gb whole-GPU slices for the 70B model"))

    assert halted.state == "failed"
    reason = halted.halted_reason or ""
    assert reason.startswith("inf-01: mig failed: timed out after 20s"), reason
    assert "operands still paused-for-mig-change: dcgm, dcgm-exporter, device-plugin, gpu-feature-discovery" in reason
    assert "advertising no GPUs" in reason
    assert h.unschedulable(desk.installer, "inf-01")
    for node in ("inf-02", "inf-03"):  # never started
        assert _mig(desk.installer, node) == ("all-1g.10gb", "success") and not h.unschedulable(desk.installer, node)


def test_a_failed_layout_halts_the_run_and_a_rollback_puts_the_prior_layout_back(desk):
    _annotate(desk.installer, "inf-01", fl.ANN_MIG_FAILS, "true")

    halted = desk.approve_and_run(desk.ask("mig inf all-2g.20gb two-slice replicas"))

    assert halted.state == "failed"
    assert "the MIG manager on inf-01 reports failed for all-2g.20gb" in (halted.halted_reason or "")
    assert _mig(desk.installer, "inf-01") == ("all-2g.20gb", "failed") and h.unschedulable(desk.installer, "inf-01")

    # Someone fixed the node; the rollback asks for the layout it had, on the node the run changed.
    _annotate(desk.installer, "inf-01", fl.ANN_MIG_FAILS, None)
    asked = desk.say("U0ALICE", f"rollback {halted.id}")
    assert asked.ok, asked.summary
    assert [row[0] for row in asked.sections[1].table.rows] == ["inf-01"]
    back = desk.approve_and_run(desk.rollback_request(halted.id, "inf"))

    assert back.state == "succeeded", back.halted_reason
    assert _mig(desk.installer, "inf-01") == ("all-1g.10gb", "success")
    assert _capacity(desk.installer, "inf-01") == {"nvidia.com/mig-1g.10gb": "56"}
    assert not h.unschedulable(desk.installer, "inf-01")


# ---- crash safety

LAYOUTS = ("all-1g.10gb", "all-3g.40gb")
EXPECT = {"all-1g.10gb": {"nvidia.com/mig-1g.10gb": 56}, "all-3g.40gb": {"nvidia.com/mig-3g.40gb": 16}}


def test_killing_the_engine_mid_mig_change_repeats_no_label_patch_cordon_or_uncordon(fleet, cluster, tmp_path):
    fleet(fl.FleetSpec(name="mig", system_nodes=0, pools=(
        fl.PoolSpec(name="mig", nodes=1, product=A100, mig_config=LAYOUTS[0]),)))
    installer = cluster.installer()
    wait_until(lambda: _capacity(installer, "mig-01").get("nvidia.com/mig-1g.10gb") == "56", timeout=120,
               what="mig-01 to advertise its MIG devices")
    boundaries = 0
    for crash_after in range(1, 40):
        layout = LAYOUTS[crash_after % 2]  # the other one than the node runs now
        steps = (("cordon", {}), ("evict", {"scope": "gpu"}),
                 ("mig", {"config": layout, "expect": EXPECT[layout], "timeout_s": 60}),
                 ("validate", {"timeout_s": 60}), ("uncordon", {}))
        db = open_database(tmp_path / f"round-{crash_after}.db")
        try:
            run = h.start_run(db, h.plan("mig", "mig", [["mig-01"]], steps))
            logs = [tmp_path / f"round-{crash_after}-first.log", tmp_path / f"round-{crash_after}-second.log"]
            killed = h.crash_and_resume(cluster.kubeconfig, db.path, crash_after=crash_after, logs=logs,
                                        identity="engine-0", lease_name="mig-crash", timeout=120)
            where = f"crash after commit {crash_after} (to {layout})"
            finished = h.wait_run(db, run.id, timeout=5)
            assert finished.state == "succeeded", (where, finished.halted_reason)
            calls = Counter(" ".join(m.split()[:3]) for log in logs if log.exists()
                            for m in h.mutations(log.read_text()))
            assert calls == Counter({"cordon node mig-01": 1, "label node mig-01": 1, "uncordon node mig-01": 1}), (
                where, calls)
            assert _mig(installer, "mig-01") == (layout, "success"), where
            assert not h.unschedulable(installer, "mig-01"), where
        finally:
            db.close()
        if not killed:
            break
        boundaries += 1
    else:
        pytest.fail("the first engine never finished the run by itself")
    assert boundaries >= 8
