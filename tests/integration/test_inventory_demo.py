"""The fleet inventory of the demo fleet, read from a real control plane, and the
status commands and command line on top of it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from bot.render_text import render_text
from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from storage.step_params import GpuCheckParams
from testenv.install import wait_until
from workflows.engine import check_pod
from workflows.kube.errors import Forbidden, TooManyRequests
from workflows.kube.gateway import KubeGateway

from tests.integration.desk import grant_bot_rbac, revoke_bot_rbac
from tests.integration.inventory_helpers import CONFIG, ROOT, _codes, _now, wait_fleet

# --- the demo fleet ------------------------------------------------------------------------


def test_the_demo_fleet_has_a_driver_owner_and_evidence_for_every_special_node(demo_fleet, fleet_cache):
    cache = fleet_cache()
    # The real operator reports its policy notReady (on its next pass after the driver
    # DaemonSet's pod on training-a-10 began to crash-loop beside the host driver).
    fleet = wait_fleet(cache, lambda f: f.cluster.cluster_policy_state == "notReady",
                       "the operator to report its ClusterPolicy notReady")

    assert fleet.cluster.operator_version == "v26.7.0"
    assert "cluster-policy-not-ready" in _codes(fleet, "cluster")
    assert fleet.cluster.cluster_policy_owner == "#gpu-platform (platform team)"
    assert [(p.name, p.kind, p.nodes_total) for p in fleet.pools] == [
        ("inference-mig", "serving", 6), ("serving-a", "serving", 8), ("training-a", "training", 10)]

    host = fleet.nodes["training-a-09"]
    assert host.driver.owner == "host"
    assert "label nvidia.com/gpu.deploy.driver=pre-installed" in host.driver.evidence

    conflict = fleet.nodes["training-a-10"]
    assert conflict.driver.owner == "conflict"
    assert any("came from the host" in e for e in conflict.driver.evidence)
    assert "driver-conflict" in _codes(fleet, "training-a-10")

    short = fleet.nodes["serving-a-05"]
    assert (short.advertised_gpus, short.expected_advertised, short.physical_gpus) == (7, 8, 8)
    assert "advertised-mismatch" in _codes(fleet, "serving-a-05")

    assert fleet.nodes["training-a-03"].cordoned and fleet.nodes["training-a-03"].cordoned_by is None
    assert fleet.nodes["serving-a-02"].requested_gpus == 8
    assert fleet.nodes["serving-a-01"].driver.owner == "operator"

    mig = fleet.nodes["inference-mig-01"]
    assert [(r.resource, r.expected, r.capacity) for r in mig.resources] == [("nvidia.com/mig-1g.10gb", 56, 56)]
    assert mig.mig.config == "all-1g.10gb" and mig.mig.config_state == "success"

    training = fleet.pool("training-a")
    assert training.mixed_driver_versions
    assert "mixed-driver-versions" in _codes(fleet, "training-a")
    # Nothing else is wrong with the demo fleet.
    assert {f.subject for f in fleet.findings} == {"serving-a-05", "training-a-10", "training-a", "cluster"}


def test_status_puts_findings_first_and_names_the_closest_pool_or_node(demo_fleet, fleet_cache):
    cache = fleet_cache()
    services = Services(config=CONFIG, fleet=cache)
    viewer = CONFIG.actor("U0DAVE")

    reply = dispatch("status", actor=viewer, services=services, now=_now())
    text = render_text(reply)
    assert reply.ok
    assert text.index("Findings") < text.index("Pools")
    assert "[CRITICAL] training-a-10 has two driver sources" in text
    assert "570.172.08 (2) + 580.95.05 (8) MIXED" in text

    pool = dispatch("status serving-a", actor=viewer, services=services, now=_now())
    assert pool.ok
    rows = {row[0]: row for row in pool.sections[-1].table.rows}
    assert set(rows) == {f"serving-a-0{i}" for i in range(1, 9)}
    assert rows["serving-a-05"][3] == "7/8"
    # The demo's one ClusterPolicy sets the driver of every pool: a serving pool's version
    # cannot change alone.
    facts = {f.label: f.value for f in pool.sections[0].facts}
    assert facts["Driver version set by"] == (
        "ClusterPolicy cluster-policy (580.95.05), shared with inference-mig, training-a: a version change there "
        "reaches those pools too, on each driver pod's next restart (autoUpgrade off)")

    missing = dispatch("status serving-b", actor=viewer, services=services, now=_now())
    assert not missing.ok and "`serving-a`" in missing.summary

    node = dispatch("node serving-a-5", actor=viewer, services=services, now=_now())
    assert not node.ok and "`serving-a-05`" in node.summary

    detail = render_text(dispatch("node training-a-09", actor=viewer, services=services, now=_now()))
    assert "Driver owner: host" in detail and "pre-installed" in detail

    nobody = dispatch("status", actor=CONFIG.actor("U0STRANGER"), services=services, now=_now())
    assert not nobody.ok and "needs the viewer role" in nobody.summary


def test_the_gpuops_command_line_answers_and_fails_clearly(demo_fleet):
    base = [sys.executable, "-m", "bot.cli", "--kubeconfig", str(demo_fleet.kubeconfig),
            "--config", str(ROOT / "deploy" / "config.example.yaml")]
    status = subprocess.run([*base, "status"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "24/24 GPU nodes Ready" in status.stdout

    unknown = subprocess.run([*base, "node", "nope-01"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert unknown.returncode == 1
    assert "No GPU node named `nope-01`" in unknown.stdout

    bad = subprocess.run([sys.executable, "-m", "bot.cli", "--kubeconfig", str(demo_fleet.kubeconfig),
                          "--context", "nosuch", "status"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert bad.returncode == 3 and "no context 'nosuch'" in bad.stderr


def test_the_command_line_previews_an_upgrade_plan_and_stores_nothing(demo_fleet, tmp_path):
    config = yaml.safe_load((ROOT / "deploy" / "config.example.yaml").read_text())
    config["access"]["cli_roles"] = ["operator"]
    config["database"] = str(tmp_path / "gpuops.db")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    base = [sys.executable, "-m", "bot.cli", "--kubeconfig", str(demo_fleet.kubeconfig),
            "--config", str(tmp_path / "config.yaml"), "upgrade"]

    def cli(*words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *words], capture_output=True, text=True, cwd=ROOT, timeout=60)

    asked = cli("inference-mig", "to", "580.105.08")
    assert asked.returncode == 1 and "only previews an upgrade (add --dry-run)" in asked.stderr
    # The demo's ClusterPolicy drives every pool: refused with the rule, as in Slack.
    shared = cli("inference-mig", "to", "580.105.08", "--dry-run")
    assert shared.returncode == 1, shared.stderr
    assert "Upgrade refused (shared-cluster-policy)" in shared.stdout
    assert "upgrades.cluster_policy_scope: all-pools" in shared.stdout

    config["upgrades"]["cluster_policy_scope"] = "all-pools"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    planned = cli("inference-mig", "to", "580.105.08", "--dry-run")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "Driver upgrade plan (dry run) · inference-mig" in planned.stdout
    assert "nothing stored" in planned.stdout and "also drives" in planned.stdout
    with open_database(tmp_path / "gpuops.db") as db:
        assert db.execute("SELECT count(*) FROM requests").fetchone()[0] == 0


CHECK_PARAMS = {"namespace": "gpuops", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                "command": ["nvidia-smi"], "resource": "nvidia.com/gpu", "timeout_s": 60}


def test_the_bots_service_account_reads_the_fleet_with_only_its_cluster_role(demo_fleet, fleet_cache, request):
    installer = demo_fleet.installer()
    request.addfinalizer(lambda: revoke_bot_rbac(installer))
    grant_bot_rbac(installer)
    bot = KubeGateway.connect(kubeconfig=demo_fleet.kubeconfig, context="bot")

    def readable() -> bool:
        try:
            bot.list("/api/v1/nodes")
            return True
        except Forbidden:
            return False

    wait_until(readable, timeout=30, what="the ClusterRoleBinding to take effect")
    fleet = fleet_cache(user="bot").fleet(_now())
    assert fleet.nodes["training-a-10"].driver.owner == "conflict"
    # A drain preview reads every pod on a node and the PDBs that apply...
    (budget,) = bot.list_disruption_budgets("serving")
    assert (budget.ref, budget.disruptions_allowed) == ("serving/llm-serving", 0)
    assert {p.name.rsplit("-", 2)[0] for p in bot.list_pods_bound_to("serving-a-02")} >= {"llm-serving"}
    # What a run does is allowed (here as dry runs: nothing changes)...
    node = bot.get_node("serving-a-03")
    bot.cordon_node("serving-a-03", annotations={"gpuops.io/cordoned-by": "{}"},
                    resource_version=node.resource_version, dry_run=True)
    replica = next(p for p in installer.list("Pod", namespace="serving"))
    with pytest.raises(TooManyRequests):  # allowed, and refused by the PDB, as it should be
        bot.evict_pod("serving", replica["metadata"]["name"], uid=replica["metadata"]["uid"], dry_run=True)
    bot.create_lease("gpuops", "rbac-probe", holder="probe", duration_seconds=15, at=_now(), dry_run=True)
    check = check_pod.manifest(check_pod.CheckSpec.from_params(GpuCheckParams.from_json(CHECK_PARAMS, kind="gpu-check")), name="rbac-probe",  # type: ignore[arg-type]
                               node="serving-a-03", run_id="run-probe")
    bot.create_pod("gpuops", check, dry_run=True)  # the upgrade's check pod, in its own namespace
    assert not installer.get({"kind": "Node", "metadata": {"name": "serving-a-03"}})["spec"].get("unschedulable")
    # ...and nothing more: no Secrets, no changing workloads, no Leases elsewhere.
    with pytest.raises(Forbidden):
        bot.list("/api/v1/secrets")
    with pytest.raises(Forbidden):
        bot.request("DELETE", "/apis/apps/v1/namespaces/serving/deployments/llm-serving")
    with pytest.raises(Forbidden):
        bot.create_lease("kube-system", "rbac-probe", holder="probe", duration_seconds=15, at=_now(), dry_run=True)
    with pytest.raises(Forbidden):  # pods are created in the check namespace only
        bot.create_pod("serving", {**check, "metadata": {**check["metadata"], "namespace": "serving"}}, dry_run=True)


def test_the_handover_checklist_on_the_demo_fleet_lists_each_special_node(demo_fleet, fleet_cache, tmp_path):
    from commands.handover import render_checklist
    from storage.database import open_database
    from workflows.handover.service import HandoverService

    now = _now()
    rotation = CONFIG.rotations[0]
    service = HandoverService(open_database(tmp_path / "gpuops.db"), CONFIG)
    checklist = service.checklist(rotation, rotation.current_shift(now), fleet=fleet_cache().fleet(now), now=now)
    text = render_text(render_checklist(checklist, rotation.checklist_template))

    action = " ".join(item.text for item in checklist.needs_action)
    for node in ("serving-a-05", "training-a-10"):  # fewer GPUs; two driver sources
        assert node in action, node
    assert "training-a-03" in text  # cordoned by a person
    assert "training-a" in action or "training-a" in " ".join(i.text for i in checklist.for_information)
    assert "v26.7.0" in text and "#gpu-platform" in text
    # Items needing action come before everything else.
    assert text.index("serving-a-05") < text.index("training-a-03")
