"""`/gpu upgrade` through the one dispatcher, on a real SQLite request service and a fleet
built from plain values (one NVIDIADriver per pool, autoUpgrade off): the plan an operator
is shown, what is stored for the approvers, and each refusal."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from freezegun import freeze_time

from commands.catalog import dispatch
from commands.reply import Reply
from commands.services import Services
from storage.database import open_database
from workflows.config import GpuopsConfig
from workflows.plans import plan_from_json
from tests.unit.static_fleet import StaticFleet

UTC = dt.timezone.utc
NOW_TEXT = "2026-12-02 10:00:00"  # a Wednesday, 11:00 in Berlin
NEW = "580.105.08"
ACCESS = {
    "users": {"U0ALICE": ["operator"], "U0BOB": ["approver"], "U0CAROL": ["approver"], "U0DAVE": ["viewer"]},
    "names": {"U0ALICE": "alice", "U0BOB": "bob", "U0CAROL": "carol", "U0DAVE": "dave"},
}
CONFIG = GpuopsConfig.model_validate({
    "pools": {
        "serve-a": {"kind": "serving", "windows": "always", "max_unavailable": "50%", "upgrade_soak": "15m"},
        "train-a": {"kind": "training", "max_unavailable": 1, "windows": [
            {"days": ["sat"], "start": "02:00", "end": "06:00", "timezone": "Europe/Berlin"}]},
    },
    "access": ACCESS})


@pytest.fixture
def now():
    with freeze_time(NOW_TEXT, ignore=["kubernetes"]):
        yield dt.datetime.now(UTC)


@pytest.fixture
def services(make, tmp_path: Path):
    nodes = [make.node(f"s{i}", pool="serve-a") for i in range(1, 5)]
    nodes += [make.node(f"t{i}", pool="train-a") for i in range(1, 3)]
    pods = [p for n in nodes for p in make.operands(n.name)]
    # Workloads (the builder's default image is a device plugin's: a finding on the node).
    pods += [make.pod(node=n, namespace="serve", gpu_requests={"nvidia.com/gpu": 8}, image="registry.example/app:1")
             for n in ("s1", "s2", "s4")]
    policy = make.cluster_policy(driver={"useNvidiaDriverCRD": True})
    drivers = [make.nvidia_driver("serve-driver", node_selector={"gpuops.io/pool": "serve-a"}, auto_upgrade=False),
               make.nvidia_driver("train-driver", node_selector={"gpuops.io/pool": "train-a"}, auto_upgrade=False)]
    fleet = make.fleet(nodes, pods, policies=[policy], nvidia_drivers=drivers)
    built = Services.on_database(config=CONFIG, fleet=StaticFleet(fleet), database=open_database(tmp_path / "g.db"))
    yield built
    built.database.close()  # type: ignore[union-attr]


def run(services: Services, who: str, text: str, now: dt.datetime) -> Reply:
    return dispatch(text, actor=services.config.actor(who), services=services, now=now, channel="C0OPS")


def test_an_upgrade_request_shows_canary_then_waves_and_waits_for_two_approvers(services, now):
    reply = run(services, "U0ALICE", f"upgrade serve-a to {NEW} CVE fix", now)

    assert reply.ok, reply.summary
    facts = {f.label: f.value for f in reply.sections[0].facts}
    assert facts["Driver set by"] == "NVIDIADriver serve-driver (autoUpgrade off: gpuops drives)"
    assert facts["Versions"] == f"580.95.05 (4) -> {NEW}"
    assert facts["Canary"] == "s3"  # the only node without GPU pods
    waves = reply.sections[1].table.rows
    # 50% of 4 is 2 at once: the canary alone, then waves of two.
    assert [row[1] for row in waves] == ["s3", "s1, s2", "s4"]
    assert "NVIDIADriver serve-driver is set to 580.105.08 at the canary's first step" in reply.sections[1].bullets[0]
    assert "the pool then waits 15m before the next wave" in reply.sections[1].bullets[1]
    assert reply.summary.startswith("pending · 0 of 2 approvals")

    (stored,) = services.requests.open_requests("serve-a")  # type: ignore[union-attr]
    assert (stored.kind, stored.reason, stored.requester) == ("upgrade", "CVE fix", "U0ALICE")
    plan = plan_from_json(services.database.query(  # type: ignore[union-attr]
        "SELECT plan FROM requests WHERE id = ?", [stored.id])[0]["plan"])
    canary = [(s.kind, dict(s.params)) for s in plan.waves[0].steps]
    assert canary[0] == ("driver-version", {"object": "NVIDIADriver", "name": "serve-driver", "version": NEW})
    assert [k for k, _ in canary] == ["driver-version", "cordon", "evict", "driver", "validate", "uncordon", "hold",
                                      "driver-version"]
    assert canary[3][1]["version"] == NEW and canary[-2][1] == {"seconds": 900}
    # Only if the canary fails: the NVIDIADriver set back (the plan says so).
    assert canary[-1][1] == {"object": "NVIDIADriver", "name": "serve-driver", "version": NEW, "set_back": True,
                             "on_failure": True}
    assert any("if the canary fails, NVIDIADriver serve-driver is set back to 580.95.05" in b
               for b in reply.sections[1].bullets)
    assert [s.kind for s in plan.waves[1].steps if s.node == "s1"] == [
        "cordon", "evict", "driver", "validate", "uncordon"]
    assert plan.summary.target_driver_version == NEW


def test_an_upgrade_outside_the_window_is_planned_for_the_next_one(services, now):
    reply = run(services, "U0ALICE", f"upgrade train-a to {NEW} kernel", now)
    assert reply.ok, reply.summary
    window = {f.label: f.value for f in reply.sections[0].facts}["Window"]
    assert window.startswith("Sat 2026-12-05 02:00") and "06:00" in window


@pytest.mark.parametrize(("words", "starts", "reason"), [
    # Saturday's window in Berlin, an hour in; the run must start before it ends.
    ("at sat 03:00 kernel", "Sat 2026-12-05 03:00", "kernel"),
    ("at 2026-12-12 04:30 Europe/Berlin new branch", "Sat 2026-12-12 04:30", "new branch"),
    ("next-window kernel", "Sat 2026-12-05 02:00", "kernel"),
    ("in the next window kernel", "Sat 2026-12-05 02:00", "kernel"),
])
def test_an_upgrade_may_start_at_a_time_inside_a_window_or_in_the_next_window(services, now, words, starts, reason):
    reply = run(services, "U0ALICE", f"upgrade train-a to {NEW} {words}", now)
    assert reply.ok, reply.summary
    window = {f.label: f.value for f in reply.sections[0].facts}["Window"]
    assert window.startswith(starts) and window.endswith("06:00 CET"), window
    # After the plan and its pre-flight: the request's own facts.
    assert {f.label: f.value for f in reply.sections[-1].facts}["Reason"] == reason


@pytest.mark.parametrize(("text", "title", "words"), [
    (f"upgrade train-a to {NEW} at wed 12:00", "Upgrade refused (outside-window)",
     "is outside pool train-a's maintenance windows; the next one starts Sat 2026-12-05 02:00"),
    (f"upgrade train-a to {NEW} at 2026-12-01 03:00", "Upgrade refused (past-start)", "is in the past"),
    (f"upgrade train-a to {NEW} at noonish", "Upgrade refused (bad-time)", "noonish"),
    ("upgrade serve-a to 58.1", "Upgrade refused (malformed-version)", "is not a driver version"),
    ("upgrade serve-a to 580.95.05", "Upgrade refused (same-version)", "nothing to do"),
    ("upgrade serve-a to 570.172.08 rollback", "Upgrade refused (downgrade)", "--downgrade"),
    ("upgrade serve-x to 580.105.08", "Upgrade refused (unknown-pool)", "did you mean serve-a"),
])
def test_a_refused_upgrade_says_why_and_stores_nothing(services, now, text, title, words):
    reply = run(services, "U0ALICE", text, now)
    assert not reply.ok and reply.title == title and words in reply.summary, reply.summary
    assert services.requests.open_requests("serve-a") == []  # type: ignore[union-attr]


def test_bad_words_answer_with_usage_and_a_viewer_may_not_ask(services, now):
    usage = run(services, "U0ALICE", "upgrade serve-a 580.105.08", now)
    assert not usage.ok and "upgrade <pool> to <driver-version>" in usage.summary
    denied = run(services, "U0DAVE", f"upgrade serve-a to {NEW} because", now)
    assert not denied.ok and "`/gpu upgrade` needs the operator role; dave has viewer" in denied.summary
    assert services.requests.open_requests("serve-a") == []  # type: ignore[union-attr]


def test_a_downgrade_asked_for_on_purpose_is_planned_and_says_so(services, now):
    reply = run(services, "U0ALICE", "upgrade serve-a to 570.172.08 --downgrade regression in 580", now)
    assert reply.ok, reply.summary
    assert any("a downgrade to 570.172.08, asked for on purpose" in b for b in reply.sections[1].bullets)


def _run_view(kind: str, state: str, steps: list[tuple[str, str, str, dict]]):
    from storage.ids import RequestId, RunId, StepId
    from storage.runs import Run
    from storage.steps import Step
    from workflows.engine.runs import RunView

    at = dt.datetime(2026, 12, 1, tzinfo=UTC)
    run = Run(id=RunId("run-4b1d9e"), request_id=RequestId("req-1"), state=state, dry_run=False,  # type: ignore[arg-type]
              current_wave=0, created_at=at, started_at=at, ended_at=at, halted_reason=None)
    stored = tuple(Step(id=StepId(i), run_id=run.id, wave=0, node=node, seq=i, kind=step_kind,  # type: ignore[arg-type]
                        state=step_state, attempt=1, started_at=at, ended_at=at,  # type: ignore[arg-type]
                        detail={"intent": intent}, error=None)
                   for i, (node, step_kind, step_state, intent) in enumerate(steps))
    return RunView(run=run, request_id=run.request_id, pool="serve-a", kind=kind, steps=stored, left_cordoned=())


@pytest.mark.parametrize(("kind", "state", "steps", "code"), [
    ("drain", "failed", [], "not-an-upgrade"),
    ("upgrade", "running", [], "run-unfinished"),
    ("upgrade", "failed", [("s3", "driver-version", "failed", {"prior_version": "580.95.05"})], "nothing-to-roll-back"),
])
def test_a_rollback_of_a_run_that_is_not_a_finished_upgrade_that_changed_a_driver_is_refused(
        services, now, kind, state, steps, code):
    from workflows.upgrade.scope import UpgradeRefused

    with pytest.raises(UpgradeRefused) as refused:
        services.changes["upgrade"].rollback(services.config.actor("U0ALICE"), _run_view(kind, state, steps),  # type: ignore[attr-defined]
                                   fleet=services.fleet.fleet(now), now=now)
    assert refused.value.code == code


def test_a_rollback_plans_the_replaced_version_for_the_nodes_the_run_changed_failed_node_first(services, now):
    view = _run_view("upgrade", "failed", [
        ("s3", "driver-version", "done", {"prior_version": "570.172.08"}),
        ("s3", "driver", "done", {}), ("s1", "driver", "failed", {}), ("s2", "driver", "pending", {})])

    done = services.changes["upgrade"].rollback(services.config.actor("U0ALICE"), view,  # type: ignore[attr-defined]
                                      fleet=services.fleet.fleet(now), now=now)

    plan = done.planned.plan
    assert plan.summary.target_driver_version == "570.172.08"
    assert [w.nodes for w in plan.waves] == [("s1",), ("s3",)]  # s2 was never touched
    cordons = [dict(s.params) for s in plan.waves[0].steps if s.kind == "cordon"]
    assert cordons == [{"was_cordoned": False, "takes_over": "run-4b1d9e"}]
    assert done.view.reason == "rollback of run-4b1d9e" and done.view.approvals_required == 2



def test_the_configured_allowed_versions_limit_what_an_upgrade_may_ask_for(make, tmp_path, now):
    from pydantic import ValidationError

    cfg = CONFIG.model_copy(update={"upgrades": CONFIG.upgrades.model_validate({"allowed_versions": ["580.126.09"]})})
    nodes = [make.node("s1", pool="serve-a"), make.node("s2", pool="serve-a")]
    pods = [p for n in nodes for p in make.operands(n.name)]
    fleet = make.fleet(nodes, pods, policies=[make.cluster_policy(driver={"useNvidiaDriverCRD": True})],
                       nvidia_drivers=[make.nvidia_driver("serve-driver", node_selector={"gpuops.io/pool": "serve-a"},
                                                          auto_upgrade=False)])
    services = Services.on_database(config=cfg, fleet=StaticFleet(fleet), database=open_database(tmp_path / "a.db"))
    try:
        refused = run(services, "U0ALICE", f"upgrade serve-a to {NEW} fix", now)
        assert refused.title == "Upgrade refused (version-not-allowed)"
        assert f"driver {NEW} is not in upgrades.allowed_versions (580.126.09)" in refused.summary
        assert run(services, "U0ALICE", "upgrade serve-a to 580.126.09 fix", now).ok
    finally:
        services.database.close()  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="`latest` is not a driver version"):
        GpuopsConfig.model_validate({"upgrades": {"allowed_versions": ["latest"]}})


def test_the_cluster_policy_scope_and_the_engines_parallelism_are_checked_when_the_configuration_loads():
    from pydantic import ValidationError

    loaded = GpuopsConfig.model_validate({"upgrades": {"cluster_policy_scope": "all-pools"},
                                          "engine": {"max_parallel_nodes": 20}})
    assert (loaded.upgrades.cluster_policy_scope, loaded.engine.max_parallel_nodes) == ("all-pools", 20)
    assert GpuopsConfig().upgrades.cluster_policy_scope == "pool" and GpuopsConfig().engine.max_parallel_nodes == 4
    with pytest.raises(ValidationError, match="cluster_policy_scope"):
        GpuopsConfig.model_validate({"upgrades": {"cluster_policy_scope": "everything"}})
    with pytest.raises(ValidationError, match="max_parallel_nodes"):
        GpuopsConfig.model_validate({"engine": {"max_parallel_nodes": 0}})


def test_a_pools_status_names_its_unfinished_run_and_where_it_is(services, now):
    from workflows.engine.runs import RunService

    assert run(services, "U0ALICE", f"upgrade serve-a to {NEW} kernel", now).ok
    (request,) = services.requests.open_requests("serve-a")  # type: ignore[union-attr]
    for approver in ("U0BOB", "U0CAROL"):
        assert run(services, approver, f"approve {request.id} {request.short_hash}", now).ok
    started = RunService(services.database, requests=services.requests).start(  # type: ignore[arg-type]
        request.id, dry_run=False, now=now, plan_hash=request.plan_hash)

    status = run(services, "U0DAVE", "status serve-a", now)
    facts = {f.label: f.value for f in status.sections[0].facts}
    assert facts["Running"] == f"upgrade run {started.id} (pending, not started): /gpu request {request.id}"
    assert "Running" not in {f.label for f in run(services, "U0DAVE", "status train-a", now).sections[0].facts}


def test_the_command_lines_words_are_read_as_given_so_a_quote_in_a_reason_is_just_a_quote(services, now):
    # `gpuops upgrade serve-a to 580.105.08 it's the CVE fix --dry-run`: argv's words are
    # the dispatcher's words, never one line split again (which stopped at the apostrophe).
    from bot.cli import one_command

    alice = services.config.actor("U0ALICE")
    preview = one_command(["upgrade", "serve-a", "to", NEW, "it's", "the", "CVE", "fix", "--dry-run"],
                          actor=alice, services=services, now=now)

    assert preview.ok, preview.summary
    assert preview.title == run(services, "U0ALICE", f"upgrade serve-a to {NEW} CVE fix --dry-run", now).title
    assert services.requests.open_requests("serve-a") == []  # type: ignore[union-attr]
    # A word holding a space or an option is one word: a node's name, not a cluster choice.
    node = one_command(["node", "s1 --cluster west"], actor=alice, services=services, now=now)
    assert not node.ok and node.summary.startswith("No GPU node named `s1 --cluster west`"), node


def test_the_command_lines_dry_run_works_for_a_reader_takes_the_commands_options_and_stores_nothing(services, now):
    from bot.cli import parser
    from commands.registry import Call
    from commands.upgrade import preview_upgrade

    dave = services.config.actor("U0DAVE")  # a viewer: the command line's shipped role
    assert not run(services, "U0DAVE", f"upgrade serve-a to {NEW} --dry-run", now).ok  # Slack asks the operator role

    reply = preview_upgrade(Call(actor=dave, now=now, services=services), ["serve-a", "to", NEW, "--also", "train-a"])

    assert reply.ok, reply.summary
    assert reply.title.startswith("Driver upgrade plan (dry run)"), reply.title
    assert services.requests.open_requests() == []  # type: ignore[union-attr]
    args = parser().parse_args(["upgrade", "serve-a", "to", NEW, "--also", "train-a", "--dry-run"])
    assert (args.words, args.also) == (["serve-a", "to", NEW], ["train-a"])
