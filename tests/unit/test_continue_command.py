"""`/gpu continue <run> [--skip <node>]`: a halted run picked up where it stopped, as a new
request under the pool's approval rule, through the console dispatcher. The run's steps
are moved as the engine moves them (storage), the cluster is a fleet built from values."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from freezegun import freeze_time

from commands.catalog import dispatch
from commands.reply import Reply
from commands.services import Services
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.database import open_database
from tests.unit.static_fleet import StaticFleet
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunService
from workflows.engine.steps.cordoning import CordonMark
from workflows.kube.labels import ANNOTATION_CORDONED_BY

UTC = dt.timezone.utc
NOW_TEXT = "2026-12-02 10:00:00"
NEW = "580.105.08"
CONFIG = GpuopsConfig.model_validate({
    "pools": {"serve-a": {"kind": "serving", "windows": "always", "max_unavailable": "50%", "upgrade_soak": "15m"}},
    "access": {"users": {"U0ALICE": ["operator"], "U0BOB": ["approver"], "U0CAROL": ["approver"],
                         "U0DAVE": ["viewer"]},
               "names": {"U0ALICE": "alice", "U0BOB": "bob", "U0CAROL": "carol", "U0DAVE": "dave"}}})


@pytest.fixture
def now():
    with freeze_time(NOW_TEXT, ignore=["kubernetes"]):
        yield dt.datetime.now(UTC)


class Pool:
    """serve-a's four nodes (s3 the canary: the only one without GPU pods); `cordoned`
    are those a run's cordon mark names."""

    def __init__(self, make) -> None:
        self.make = make

    def fleet(self, cordoned: dict[str, str] | None = None, *, other: bool = False):
        make = self.make
        cordoned = cordoned or {}
        nodes = [make.node(f"s{i}", pool="serve-a", unschedulable=f"s{i}" in cordoned,
                           annotations={ANNOTATION_CORDONED_BY: CordonMark(
                               run=cordoned[f"s{i}"], by="gpuops", prior_unschedulable=False,
                               at="2026-12-02T09:00:00Z").to_text()} if f"s{i}" in cordoned else None)
                 for i in range(1, 5)]
        if other:
            nodes.append(make.node("t1", pool="train-a"))
        pods = [p for n in nodes for p in make.operands(n.name)]
        # Workloads (the builder's default image is a device plugin's: a finding on the node).
        pods += [make.pod(node=n, namespace="serve", gpu_requests={"nvidia.com/gpu": 8},
                          image="registry.example/app:1") for n in ("s1", "s2", "s4")]
        return make.fleet(nodes, pods, policies=[make.cluster_policy(driver={"useNvidiaDriverCRD": True})],
                          nvidia_drivers=[make.nvidia_driver("serve-driver", node_selector={"gpuops.io/pool": "serve-a"},
                                                             auto_upgrade=False)])


@pytest.fixture
def pool(make):
    return Pool(make)


@pytest.fixture
def services(pool, tmp_path: Path):
    built = Services.on_database(config=CONFIG, fleet=StaticFleet(pool.fleet()),
                                 database=open_database(tmp_path / "g.db"))
    yield built
    built.database.close()  # type: ignore[union-attr]


def say(services: Services, who: str, text: str, now: dt.datetime) -> Reply:
    return dispatch(text, actor=services.config.actor(who), services=services, now=now, channel="C0OPS")


def approve(services: Services, request_id: str, now: dt.datetime) -> None:
    view = services.requests.get(request_id)  # type: ignore[union-attr]
    for approver in ("U0BOB", "U0CAROL"):
        answer = say(services, approver, f"approve {view.id} {view.short_hash}", now)
        assert answer.ok, answer.summary


def halted_upgrade(services: Services, pool: Pool, now: dt.datetime, *, halt: bool = True,
                   set_back: str = "done") -> str:
    """An upgrade of serve-a (waves s3 | s1, s2 | s4) whose run halted on s1's validation:
    the canary s3 done, s1 done up to its driver, s2 cordoned and evicted (its driver step
    stopped with the run), s4 never reached. Its run id."""
    assert say(services, "U0ALICE", f"upgrade serve-a to {NEW} CVE fix", now).ok
    (request,) = services.requests.open_requests("serve-a")  # type: ignore[union-attr]
    approve(services, request.id, now)
    db = services.database
    run = RunService(db, requests=services.requests).start(  # type: ignore[arg-type]
        request.id, dry_run=False, now=now, plan_hash=request.plan_hash)
    assert stored_runs.transition(db, id=run.id, expected="pending", new="running", at=now)  # type: ignore[arg-type]
    moved = {("s1", "validate"): "failed", ("s2", "driver"): "failed"}
    for step in stored_steps.for_run(db, run_id=run.id):  # type: ignore[arg-type]
        state = "done" if step.node == "s3" else moved.get((step.node, step.kind))
        if step.node == "s3" and isinstance(step.detail, dict) and step.detail.get("params", {}).get("on_failure"):
            state = set_back  # the canary wave ended well: the engine marks it skipped
        if step.node in ("s1", "s2") and state is None and step.kind in ("cordon", "evict", "driver"):
            state = "done"
        if state is not None and halt:
            detail = {**step.detail, "intent": {"prior_version": "570.172.08"}}  # type: ignore[dict-item]
            stored_steps.transition(db, id=step.id, expected="pending", new=state, at=now,  # type: ignore[arg-type]
                                    detail=detail if step.kind == "driver-version" else None)
    if halt:
        stored_steps.stop_unfinished(db, stored_steps.for_run(db, run_id=run.id), at=now, error="halted")  # type: ignore[arg-type]
        assert stored_runs.transition(db, id=run.id, expected="running", new="failed", at=now,  # type: ignore[arg-type]
                                      halted_reason="s1: validate failed")
        assert stored_requests.transition(db, id=request.id, expected="running", new="failed", at=now)  # type: ignore[arg-type]
    # The halted run's cordons are on s1 and s2.
    services.fleet.value = pool.fleet({"s1": run.id, "s2": run.id})  # type: ignore[attr-defined]
    return run.id


def continuation(services: Services, run_id: str):
    found = services.requests.continuation_of(run_id, pool="serve-a")  # type: ignore[union-attr]
    assert found is not None
    return found


def test_a_halted_upgrade_continues_with_what_it_did_not_finish_halted_node_first(services, pool, now):
    run_id = halted_upgrade(services, pool, now)

    reply = say(services, "U0ALICE", f"continue {run_id}", now)

    assert reply.ok, reply.summary
    assert reply.summary.startswith("pending · 0 of 2 approvals")  # the pool's rule for upgrades
    view = continuation(services, run_id)
    plan = view.plan
    # The canary is done: not in it. s1 (halted) first, s2 beside it, then s4, all of it.
    assert [w.nodes for w in plan.waves] == [("s1", "s2"), ("s4",)]
    assert [(s.kind, s.params.get("takes_over")) for s in plan.waves[0].steps if s.node == "s1"] == [
        ("cordon", run_id), ("validate", None), ("uncordon", None)]
    assert [s.kind for s in plan.waves[0].steps if s.node == "s2"] == ["cordon", "driver", "validate", "uncordon"]
    assert [s.kind for s in plan.waves[1].steps] == ["cordon", "evict", "driver", "validate", "uncordon"]
    assert plan.summary.target_driver_version == NEW
    notes = " | ".join(plan.summary.notes)
    assert f"done in run {run_id}, not touched again (no cordon, no eviction): s3" in notes
    assert "s1 stays cordoned (its cordon taken over from the halted run) and repeats its steps from `validate`" in notes
    halted = services.requests.get(services.runs.get(run_id).request_id)  # type: ignore[union-attr]
    assert view.plan_hash != halted.plan_hash and view.reason == f"continuation of {run_id}: CVE fix"


def test_a_node_a_person_uncordoned_since_goes_through_its_steps_again_from_the_cordon(services, pool, now):
    run_id = halted_upgrade(services, pool, now)
    services.fleet.value = pool.fleet({"s2": run_id})  # type: ignore[attr-defined]  # s1 given back by hand

    assert say(services, "U0ALICE", f"continue {run_id}", now).ok

    plan = continuation(services, run_id).plan
    assert [s.kind for s in plan.waves[0].steps if s.node == "s1"] == [
        "cordon", "evict", "driver", "validate", "uncordon"]


def test_a_skipped_node_is_left_out_and_left_cordoned_for_a_person(services, pool, now):
    run_id = halted_upgrade(services, pool, now)

    reply = say(services, "U0ALICE", f"continue {run_id} --skip s1", now)

    assert reply.ok, reply.summary
    plan = continuation(services, run_id).plan
    assert plan.nodes == ("s2", "s4")
    assert f"s1 is left out (--skip) and left cordoned for a person (run {run_id}'s cordon)" in plan.summary.notes
    # The thread hears it too: the request's first message gives its reason.
    view = continuation(services, run_id)
    assert view.reason == f"continuation of {run_id} without s1 (left cordoned for a person): CVE fix"
    (created,) = [r for r in services.database.query(  # type: ignore[union-attr]
        "SELECT payload FROM outbox WHERE dedupe_key = ?", [f"{view.id}/created"])]
    assert "without s1 (left cordoned for a person)" in created["payload"]


@pytest.mark.parametrize(("words", "code", "says"), [
    ("--skip s9", "unknown-node", "no GPU node s9"),
    ("--skip s", "unknown-node", "no GPU node s; did you mean"),
    ("--skip s3", "node-finished", "s3 has nothing left in run"),
])
def test_a_skip_that_names_no_node_left_in_the_run_is_refused_and_stores_nothing(services, pool, now, words, code,
                                                                                  says):
    run_id = halted_upgrade(services, pool, now)

    reply = say(services, "U0ALICE", f"continue {run_id} {words}", now)

    assert not reply.ok and reply.title == f"Continue refused ({code})", reply.title
    assert says in reply.summary, reply.summary
    assert services.requests.continuation_of(run_id, pool="serve-a") is None  # type: ignore[union-attr]


def test_a_skip_of_a_node_of_another_pool_says_which_nodes_the_run_changes(services, pool, now):
    run_id = halted_upgrade(services, pool, now)
    services.fleet.value = pool.fleet({"s1": run_id, "s2": run_id}, other=True)  # type: ignore[attr-defined]

    reply = say(services, "U0ALICE", f"continue {run_id} --skip t1", now)

    assert not reply.ok and reply.title == "Continue refused (node-not-in-run)", reply.title
    assert f"t1 is not in run {run_id}, which changes s3, s1, s2 and s4" in reply.summary, reply.summary


def test_a_run_that_has_not_halted_is_not_continued(services, pool, now):
    run_id = halted_upgrade(services, pool, now, halt=False)

    reply = say(services, "U0ALICE", f"continue {run_id}", now)

    assert not reply.ok and reply.title == "Continue refused (not-halted)"
    assert f"run {run_id} is running: it has not stopped" in reply.summary


def test_a_paused_run_is_resumed_not_continued(services, pool, now):
    run_id = halted_upgrade(services, pool, now, halt=False)
    assert say(services, "U0ALICE", f"pause {run_id}", now).ok

    reply = say(services, "U0ALICE", f"continue {run_id}", now)

    assert not reply.ok and f"resume it with `/gpu resume {run_id}` instead" in reply.summary


def test_a_run_continued_once_is_not_continued_again_nor_rolled_back_while_its_continuation_is_open(
        services, pool, now):
    run_id = halted_upgrade(services, pool, now)
    assert say(services, "U0ALICE", f"continue {run_id}", now).ok
    asked = continuation(services, run_id)

    again = say(services, "U0ALICE", f"continue {run_id} --skip s1", now)
    assert not again.ok and again.title == "Continue refused (already-continued)"
    assert f"run {run_id} is being continued already by {asked.id}" in again.summary

    rollback = say(services, "U0ALICE", f"rollback {run_id}", now)
    assert not rollback.ok and f"run {run_id} is being continued by {asked.id}" in rollback.summary
    # The continuation's cordon takes over the halted run's, yet it is no rollback.
    assert services.requests.rollback_asked(run_id, pool="serve-a") is None  # type: ignore[union-attr]

    # Cancelled, the run may be continued again.
    assert say(services, "U0ALICE", f"cancel {asked.id}", now).ok
    assert say(services, "U0ALICE", f"continue {run_id}", now).ok


def test_a_run_with_a_rollback_asked_for_is_not_continued(services, pool, now):
    run_id = halted_upgrade(services, pool, now)
    assert say(services, "U0ALICE", f"rollback {run_id}", now).ok

    reply = say(services, "U0ALICE", f"continue {run_id}", now)

    assert not reply.ok and reply.title == "Continue refused (rollback-asked)", reply.title
    assert f"a rollback of run {run_id} is asked for" in reply.summary


def test_a_continuation_that_does_not_fit_the_pool_now_is_refused_with_the_rule(services, pool, now):
    run_id = halted_upgrade(services, pool, now)
    # s3 and s4 cordoned by someone since: with s1 and s2 out too, 4 of 4 would be out (50% allows 2).
    fleet = pool.fleet({"s1": run_id, "s2": run_id, "s3": "run-other", "s4": "run-other"})
    services.fleet.value = fleet  # type: ignore[attr-defined]

    reply = say(services, "U0ALICE", f"continue {run_id}", now)

    assert not reply.ok and reply.title == "Continue refused (max_unavailable)", reply.title
    assert f"continuing run {run_id}: wave 1 (s1 and s2) does not fit the pool now" in reply.summary


def test_continue_needs_the_operator_role_a_run_and_at_most_one_skip(services, pool, now):
    run_id = halted_upgrade(services, pool, now)
    assert not say(services, "U0DAVE", f"continue {run_id}", now).ok
    assert "No run run-nope" in say(services, "U0ALICE", "continue run-nope", now).summary
    for words in ("continue", f"continue {run_id} --skip", f"continue {run_id} --skip s1 --skip s2",
                  f"continue {run_id} s1"):
        assert not say(services, "U0ALICE", words, now).ok, words
    assert services.requests.continuation_of(run_id, pool="serve-a") is None  # type: ignore[union-attr]
    rows = say(services, "U0ALICE", "help", now).sections[0].table.rows
    assert any(row[0] == "/gpu continue" for row in rows)
    assert "continue <run> [--skip <node>]" in say(services, "U0ALICE", "help continue", now).title


def test_the_halted_requests_card_offers_continue_and_the_click_asks_as_the_command_would(services, pool, now):
    from bot.clicks import Click, press

    run_id = halted_upgrade(services, pool, now)
    halted = services.runs.get(run_id).request_id  # type: ignore[union-attr]
    card = say(services, "U0ALICE", f"request {halted}", now)
    (button,) = [i for i in card.intents if i.action == "continue"]

    asked = press(Click(action=button.action, value=button.value, actor=services.config.actor("U0ALICE"), now=now),
                  services).notice

    assert asked.ok, asked.summary
    view = continuation(services, run_id)
    assert view.channel == "C0OPS" and view.plan.nodes == ("s1", "s2", "s4")  # in the halted request's channel
    again = press(Click(action=button.action, value=button.value, actor=services.config.actor("U0ALICE"), now=now),
                  services).notice
    assert not again.ok and f"run {run_id} is being continued already by {view.id}" in again.summary
    # A viewer's click is refused like the command.
    viewer = press(Click(action=button.action, value=button.value, actor=services.config.actor("U0DAVE"), now=now),
                   services).notice
    assert not viewer.ok


def _canary_failed_and_set_back(services, pool, now, *, git: bool = False) -> str:
    """An upgrade whose canary s3 failed its validation and whose run set the NVIDIADriver
    back (or, Git keeping it, said what to set back in Git) before it halted."""
    run_id = halted_upgrade(services, pool, now, halt=False)
    db = services.database
    for step in stored_steps.for_run(db, run_id=run_id):  # type: ignore[arg-type]
        if step.node != "s3":
            continue
        params = step.detail.get("params", {}) if isinstance(step.detail, dict) else {}
        if step.kind == "driver-version" and params.get("set_back"):
            state, result = "done", {"from": NEW, "to": "570.172.08", **({"git": "Argo CD"} if git else {})}
        elif step.kind in ("driver-version", "cordon", "evict", "driver"):
            state, result = "done", None
        elif step.kind == "validate":
            state, result = "failed", None
        else:
            continue
        detail = {**step.detail, "intent": {"prior_version": "570.172.08"}}  # type: ignore[dict-item]
        if result is not None:
            detail["result"] = result
        stored_steps.transition(db, id=step.id, expected="pending", new=state, at=now, detail=detail)  # type: ignore[arg-type]
    stored_steps.stop_unfinished(db, stored_steps.for_run(db, run_id=run_id), at=now, error="halted")  # type: ignore[arg-type]
    assert stored_runs.transition(db, id=run_id, expected="running", new="failed", at=now,  # type: ignore[arg-type]
                                  halted_reason="s3: validate failed")
    request_id = stored_runs.get(db, id=run_id).request_id  # type: ignore[arg-type, union-attr]
    assert stored_requests.transition(db, id=request_id, expected="running", new="failed", at=now)  # type: ignore[arg-type]
    services.fleet.value = pool.fleet({"s3": run_id})  # type: ignore[attr-defined]
    return run_id


def test_a_continuation_after_a_failed_canary_set_its_object_back_sets_the_version_again_first(services, pool, now):
    run_id = _canary_failed_and_set_back(services, pool, now)

    reply = say(services, "U0ALICE", f"continue {run_id}", now)

    assert reply.ok, reply.summary
    plan = continuation(services, run_id).plan
    first = plan.waves[0]
    assert first.nodes[0] == "s3"
    s3 = [(s.kind, bool(s.params.get("set_back"))) for s in first.steps if s.node == "s3"]
    assert s3[0] == ("driver-version", False) and s3[-1] == ("driver-version", True), s3
    assert sum(1 for kind, back in s3 if kind == "driver-version" and back) == 1
    assert first.steps_for("s3")[0].params["version"] == NEW
    assert any("sets it to 580.105.08 again first" in note for note in plan.summary.notes)
    # Without a set-back on record, nothing is set again (the object still names the version).
    assert not any(s.kind == "driver-version" and not s.params.get("set_back")
                   for w in plan.waves[1:] for s in w.steps)


def test_a_canary_done_whose_set_back_step_was_skipped_is_not_continued(services, pool, now):
    # The canary wave ended well, so its on-failure set-back step was skipped, not done:
    # the canary is finished all the same, and the continuation leaves it alone.
    run_id = halted_upgrade(services, pool, now, set_back="skipped")

    assert say(services, "U0ALICE", f"continue {run_id}", now).ok

    plan = continuation(services, run_id).plan
    assert "s3" not in plan.nodes
    assert not any(s.kind == "driver-version" for w in plan.waves for s in w.steps)


def test_a_continuation_after_a_failed_canary_of_a_git_kept_object_does_not_set_the_version_again(
        services, pool, now):
    # The run only said what to set back in Git: the object still names the new version.
    run_id = _canary_failed_and_set_back(services, pool, now, git=True)

    assert say(services, "U0ALICE", f"continue {run_id}", now).ok

    plan = continuation(services, run_id).plan
    assert not any(s.kind == "driver-version" and not s.params.get("set_back") for w in plan.waves for s in w.steps)
    assert not any("again first" in note for note in plan.summary.notes)


@pytest.mark.parametrize("action", ["continue", "rollback"])
def test_a_run_id_carrying_more_words_cannot_make_a_click_ask_for_something_else(services, pool, now, action):
    # A button's value is checked before it gets here; behind that check the run id is
    # still only ever a run id (a line written for the dispatcher read "--skip s1" as an
    # option: the continuation left s1 out).
    from bot.clicks import Click, _rollback

    run_id = halted_upgrade(services, pool, now)
    alice = services.config.actor("U0ALICE")
    for hostile in (f"{run_id} --skip s1", f'{run_id} "s1', f"{run_id}; rollback {run_id}", f"{run_id}\nabort"):
        asked = _rollback(Click(action=action, value=None, actor=alice, now=now), hostile, services,
                          command=action).notice
        assert not asked.ok and asked.summary.startswith(f"No run {hostile}"), (hostile, asked)
    assert services.requests.continuation_of(run_id, pool="serve-a") is None  # type: ignore[union-attr]
    assert services.requests.open_requests("serve-a") == []  # type: ignore[union-attr]


@pytest.mark.parametrize("action", ["continue", "rollback"])
def test_the_halted_cards_buttons_ask_as_the_command_and_are_refused_to_a_viewer(services, pool, now, action):
    from bot.clicks import Click, press

    run_id = halted_upgrade(services, pool, now)
    card = say(services, "U0ALICE", f"request {services.runs.get(run_id).request_id}", now)  # type: ignore[union-attr]
    (button,) = [i for i in card.intents if i.action == action]

    viewer = press(Click(action=action, value=button.value, actor=services.config.actor("U0DAVE"), now=now),
                   services).notice
    assert not viewer.ok and viewer.summary == f"`/gpu {action}` needs the operator role; dave has viewer."
    assert services.requests.open_requests("serve-a") == []  # type: ignore[union-attr]

    asked = press(Click(action=action, value=button.value, actor=services.config.actor("U0ALICE"), now=now),
                  services).notice
    assert asked.ok, asked.summary
    (opened,) = services.requests.open_requests("serve-a")  # type: ignore[union-attr]
    assert opened.channel == "C0OPS" and opened.requester == "U0ALICE"
