"""What people's controls of a run write and say, pinned to the word: a host driver
confirmed by hand (`/gpu migrate confirm`), `drain done`, pause, resume and abort, each
refused for the reasons it gives, or recorded in the step's params, the audit log and the
request's thread, with the engine woken. Then the helpers that read a step's detail.

A run here is a stored run of a train-a request whose steps are moved by hand, as the
engine would have moved them: nothing runs on a cluster."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from storage import audit
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.audit import AuditEntry
from storage.database import Database
from storage.ids import RequestId, RunId
from storage.requests import RequestState
from storage.runs import RunState
from storage.step_params import HandConfirmation, HoldExtension, HoldRelease, TakesOverMark
from storage.steps import Step, StepState
from tests.unit.test_engine_steps import _step as step_of
from tests.unit.test_runs import CONFIG, NOW, ada, bob, dan, eve, outbox_rows, pool_operator, runs_of, submit
from workflows.access import AccessDenied, Actor, Role, UserId
from workflows.engine import halt_messages, refusal_messages, run_messages
from workflows.engine.halt_messages import HALT_CODES
from workflows.engine.runs import (RunAccessDenied, RunRefused, RunService, RunView, UnknownRun,
                                   extended_by_control, halt_code_of, released_by_control, step_intent, step_note,
                                   step_params, taken_over_run)
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.requests.service import RequestService

LATER = NOW + dt.timedelta(minutes=5)  # when the person acts
THREAD = "1749297600.000100"
POOL = "train-a"
REMOVED, INSTALLED = "host-driver-removed", "host-driver-installed"
# What each kind of step's plan gave it (a person's step keeps its own keys when confirmed).
PLANNED: Mapping[str, dict[str, Any]] = {"hold": {"seconds": 3600}, "evict": {"scope": "all-non-daemonset"}}
OWN_PARAMS = {"timeout_s": 7200}


def plan_of(nodes: tuple[str, ...], kinds: tuple[str, ...]) -> Plan:
    steps = tuple(NodeStep(kind, NodeName(node), PLANNED.get(kind, OWN_PARAMS))
                  for node in nodes for kind in kinds)
    return Plan(kind="drain", pool=POOL, waves=(Wave(0, tuple(NodeName(n) for n in nodes), steps),),
                summary=PlanSummary(), created_for="U0ADA")


class Run:
    """A started run of a train-a request with a Slack thread, and the service the bot
    builds over it (names from the configuration; `wakes` counts the engine's wake-ups)."""

    def __init__(self, db: Database, nodes: tuple[str, ...] = ("gpu-01",),
                 kinds: tuple[str, ...] = ("cordon", REMOVED, "hold"), *, state: RunState = "running") -> None:
        self.db, self.wakes = db, 0
        self.request = submit(db, POOL, plan_of(nodes, kinds))
        assert stored_requests.set_thread(db, id=self.request.id, channel="C0OPS", thread_ts=THREAD)
        self.id = runs_of(db).start(self.request.id, dry_run=False, now=NOW, actor=ada).id
        if state != "pending":
            self.becomes(state)

    @property
    def service(self) -> RunService:
        return RunService(self.db, wake=self._woken, names=CONFIG.names, requests=RequestService(self.db, CONFIG))

    def _woken(self) -> None:
        self.wakes += 1

    def becomes(self, state: RunState) -> None:
        assert stored_runs.transition(self.db, id=self.id, expected=self.state, new=state, at=NOW)

    @property
    def state(self) -> RunState:
        run = stored_runs.get(self.db, id=self.id)
        assert run is not None
        return run.state

    def request_state(self) -> RequestState:
        request = stored_requests.get(self.db, id=self.request.id)
        assert request is not None
        return request.state

    def steps(self) -> list[Step]:
        return stored_steps.for_run(self.db, run_id=self.id)

    def step(self, node: str, kind: str, index: int = 0) -> Step:
        return [s for s in self.steps() if s.node == node and s.kind == kind][index]

    def move(self, node: str, kind: str, state: StepState, *, detail: Any = None, index: int = 0) -> Step:
        """The step as the engine leaves it: started (with `detail` as the engine wrote it), then ended."""
        step = self.step(node, kind, index)
        if detail is not None:
            assert stored_steps.replace_detail(self.db, id=step.id, expected="pending", detail=detail)
        if state != "pending":
            assert stored_steps.transition(self.db, id=step.id, expected="pending", new="running", at=NOW)
        if state not in ("pending", "running"):
            assert stored_steps.transition(self.db, id=step.id, expected="running", new=state, at=NOW)
        return self.step(node, kind, index)

    def audited(self, action: str) -> list[dict[str, Any]]:
        """The run's audit rows of `action`, without their hashes."""
        return [{k: v for k, v in dataclasses.asdict(e).items() if k not in ("prev_hash", "hash")}
                for e in audit.for_run(self.db, self.id) if e.action == action]

    def entries(self) -> list[AuditEntry]:
        return audit.for_run(self.db, self.id)

    def posted(self, event: str) -> list[dict[str, Any]]:
        return [{k: row[k] for k in ("channel", "thread_ts", "kind", "dedupe_key", "payload")}
                for row in outbox_rows(self.db) if row["payload"]["event"] == event]

    def told(self) -> list[str]:
        """What the thread heard about the run."""
        return [row["payload"]["event"] for row in outbox_rows(self.db) if row["payload"].get("run_id") == self.id]

    def recorded_once(self, action: str, *, before: str, after: str, detail: dict[str, Any], dedupe: str) -> None:
        """`action` audited once, by Ada at LATER, and told once in the request's thread, in full."""
        (row,) = self.audited(action)
        assert row == {"seq": row["seq"], "at": LATER, "actor": "U0ADA", "k8s_identity": None, "action": action,
                       "target": POOL, "request_id": self.request.id, "run_id": self.id, "before": before,
                       "after": after, "detail": detail}
        assert self.posted(action) == [{
            "channel": "C0OPS", "thread_ts": THREAD, "kind": "post", "dedupe_key": f"{self.id}/{dedupe}/{row['seq']}",
            "payload": {"event": action, "request_id": self.request.id, "run_id": self.id, "pool": POOL,
                        "kind": "drain", "state": after, "text": detail["text"], "people": ["U0ADA"]}}]


def refused_by(act: Callable[[], object]) -> str:
    """Why `act` was refused (it must be)."""
    with pytest.raises(RunRefused) as refused:
        act()
    return str(refused.value)


def a_typo_of(run_id: str) -> str:
    return run_id[:-1] + ("0" if run_id[-1] != "0" else "1")


# ------------------------------------------------------------------ confirm_host_driver


def test_confirming_for_a_run_that_does_not_exist_names_the_closest_run_ids_and_writes_nothing(db):
    run = Run(db)
    run.move("gpu-01", REMOVED, "running")
    typo = a_typo_of(run.id)

    with pytest.raises(UnknownRun) as close:
        run.service.confirm_host_driver(ada, typo, now=LATER)
    with pytest.raises(UnknownRun) as far:
        run.service.confirm_host_driver(ada, "nothing-like-it", now=LATER)

    assert (str(close.value), close.value.run_id, close.value.closest) == (
        refusal_messages.unknown_run(typo, [run.id]), typo, (run.id,))
    assert str(far.value) == refusal_messages.unknown_run("nothing-like-it", []) == "No run nothing-like-it."
    assert run.step("gpu-01", REMOVED).detail == {"params": OWN_PARAMS}
    assert [e.action for e in run.entries()] == ["run.created"] and run.wakes == 0


@pytest.mark.parametrize("who", [bob, eve, pool_operator("serving-a")], ids=["approver", "viewer", "other-pool"])
def test_only_an_operator_of_the_runs_pool_may_confirm_a_host_driver_and_the_refusal_names_role_and_pool(db, who):
    run = Run(db)
    run.move("gpu-01", REMOVED, "running")

    with pytest.raises(RunAccessDenied) as refused:
        run.service.confirm_host_driver(who, run.id, now=LATER)

    assert isinstance(refused.value, AccessDenied) and isinstance(refused.value, RunRefused)
    assert (str(refused.value), refused.value.role, refused.value.pool) == (
        refusal_messages.not_allowed_to_confirm(run.id, POOL), Role.OPERATOR, POOL)
    assert run.step("gpu-01", REMOVED).detail == {"params": OWN_PARAMS}
    assert [e.action for e in run.entries()] == ["run.created"] and run.told() == ["run.created"]
    assert run.wakes == 0


@pytest.mark.parametrize("who", [ada, dan, pool_operator(POOL)], ids=["operator", "admin", "pool-operator"])
def test_an_operator_of_the_pool_or_an_admin_confirms_a_host_driver(db, who):
    run = Run(db)
    run.move("gpu-01", REMOVED, "running")

    run.service.confirm_host_driver(who, run.id, now=LATER)

    assert step_params(run.step("gpu-01", REMOVED))["confirmed_by"] == who.user_id


@pytest.mark.parametrize("state", ["aborted", "failed", "succeeded"])
def test_a_finished_run_waits_for_no_host_driver(db, state):
    run = Run(db)
    run.move("gpu-01", REMOVED, "running")  # as the run left it
    run.becomes(state)

    with pytest.raises(RunRefused) as refused:
        run.service.confirm_host_driver(ada, run.id, now=LATER)

    assert str(refused.value) == refusal_messages.run_not_waiting(run.id, state)
    assert run.step("gpu-01", REMOVED).detail == {"params": OWN_PARAMS} and run.wakes == 0


@pytest.mark.parametrize("state", ["pending", "running", "paused"])
def test_an_unfinished_run_takes_the_word_whatever_its_state(db, state):
    run = Run(db, state=state)
    run.move("gpu-01", REMOVED, "running")

    view = run.service.confirm_host_driver(ada, run.id, now=LATER)

    assert view.state == state and step_params(run.step("gpu-01", REMOVED))["confirmed_by"] == "U0ADA"


def test_a_run_with_no_person_step_in_flight_has_nothing_to_confirm_with_or_without_a_node(db):
    run = Run(db, ("gpu-01", "gpu-02"))
    run.move("gpu-01", "cordon", "running")  # in flight, but no person's step
    run.move("gpu-02", "cordon", "done")
    run.move("gpu-02", REMOVED, "done")  # already over

    with pytest.raises(RunRefused) as anywhere:
        run.service.confirm_host_driver(ada, run.id, now=LATER)
    with pytest.raises(RunRefused) as on_node:
        run.service.confirm_host_driver(ada, run.id, now=LATER, node="gpu-02")

    assert str(anywhere.value) == refusal_messages.nothing_to_confirm(run.id, None)
    assert str(on_node.value) == refusal_messages.nothing_to_confirm(run.id, "gpu-02")
    assert " on gpu-02 " in str(on_node.value) and " on " not in str(anywhere.value)
    assert [e.action for e in run.entries()] == ["run.created"] and run.wakes == 0


def test_a_word_for_a_node_that_does_not_wait_confirms_nothing_on_the_node_that_does(db):
    run = Run(db, ("gpu-01", "gpu-02"))
    run.move("gpu-01", REMOVED, "running")

    refused = refused_by(lambda: run.service.confirm_host_driver(ada, run.id, now=LATER, node="gpu-02"))

    assert refused == refusal_messages.nothing_to_confirm(run.id, "gpu-02")
    assert "confirmed_by" not in step_params(run.step("gpu-01", REMOVED))


@pytest.mark.parametrize("nodes", [("gpu-02", "gpu-01"), ("gpu-03", "gpu-01", "gpu-02")], ids=["two", "three"])
def test_with_several_nodes_waiting_the_word_must_name_one_and_the_refusal_lists_them_in_order(db, nodes):
    run = Run(db, nodes)
    for node in nodes:
        run.move(node, REMOVED, "running")

    with pytest.raises(RunRefused) as refused:
        run.service.confirm_host_driver(ada, run.id, now=LATER)

    assert str(refused.value) == refusal_messages.name_the_node_to_confirm(run.id, sorted(nodes))
    assert not any("confirmed_by" in step_params(s) for s in run.steps())
    assert [e.action for e in run.entries()] == ["run.created"] and run.wakes == 0


def test_naming_the_node_confirms_that_nodes_step_alone(db):
    run = Run(db, ("gpu-01", "gpu-02"))
    run.move("gpu-01", REMOVED, "running")
    run.move("gpu-02", REMOVED, "running")

    view = run.service.confirm_host_driver(ada, run.id, now=LATER, node="gpu-02")

    assert HandConfirmation.read_from(step_params(run.step("gpu-02", REMOVED)), kind=REMOVED) is not None
    assert step_params(run.step("gpu-01", REMOVED)) == OWN_PARAMS
    (row,) = run.audited("run.host-driver-removed")
    assert row["detail"]["nodes"] == ["gpu-02"]
    assert view.state == "running"


def test_a_step_already_confirmed_is_not_confirmed_again_and_no_longer_counts_as_waiting(db):
    run = Run(db, ("gpu-01", "gpu-02"))
    # Bob's word from the command line, before: no name written beside his id.
    earlier = HandConfirmation(confirmed_by="U0BOB", confirmed_at=NOW).written_into(OWN_PARAMS)
    run.move("gpu-01", REMOVED, "running", detail={"params": earlier})
    run.move("gpu-02", REMOVED, "running")

    run.service.confirm_host_driver(ada, run.id, now=LATER)  # gpu-02 alone waits: no node to name

    assert step_params(run.step("gpu-01", REMOVED)) == earlier
    assert step_params(run.step("gpu-02", REMOVED))["confirmed_by"] == "U0ADA"
    again = refused_by(lambda: run.service.confirm_host_driver(dan, run.id, now=LATER))
    assert again == refusal_messages.nothing_to_confirm(run.id, None)
    assert len(run.audited("run.host-driver-removed")) == 1 and run.wakes == 1


def test_the_confirmation_is_written_into_the_steps_params_with_who_and_when_and_the_rest_of_its_detail_kept(db):
    run = Run(db)
    engine_wrote = {"params": OWN_PARAMS, "intent": {"node": "gpu-01"}, "waiting": "a person at gpu-01"}
    run.move("gpu-01", REMOVED, "running", detail=engine_wrote)

    run.service.confirm_host_driver(ada, run.id, now=LATER)

    step = run.step("gpu-01", REMOVED)
    assert step.state == "running"  # the engine ends it, not the word
    assert HandConfirmation.read_from(step_params(step), kind=REMOVED) == HandConfirmation(
        confirmed_by="U0ADA", confirmed_by_name="Ada", confirmed_at=LATER)
    assert HandConfirmation.left_out_of(step_params(step)) == OWN_PARAMS
    assert {k: v for k, v in step.detail.items() if k != "params"} == {  # type: ignore[union-attr]
        "intent": {"node": "gpu-01"}, "waiting": "a person at gpu-01"}


def test_a_waiting_step_whose_stored_detail_is_not_an_object_gets_the_confirmation_alone(db):
    run = Run(db)
    run.move("gpu-01", REMOVED, "running", detail="an old row")

    run.service.confirm_host_driver(ada, run.id, now=LATER)

    assert run.step("gpu-01", REMOVED).detail == {"params": HandConfirmation(
        confirmed_by="U0ADA", confirmed_by_name="Ada", confirmed_at=LATER).written_into({})}


@pytest.mark.parametrize("kind, install", [(REMOVED, False), (INSTALLED, True)])
def test_a_confirmation_is_audited_and_told_in_the_requests_thread_in_full(db, kind, install):
    run = Run(db, kinds=("cordon", kind, "hold"))
    run.move("gpu-01", kind, "running")

    view = run.service.confirm_host_driver(ada, run.id, now=LATER)

    text = run_messages.host_driver_confirmed_by(run.id, "Ada", ["gpu-01"], install=install)
    run.recorded_once(f"run.{kind}", before="running", after="running", detail={"nodes": ["gpu-01"], "text": text},
                      dedupe="host-driver")
    assert run.wakes == 1
    assert isinstance(view, RunView) and view == run.service.get(run.id)
    assert view.steps[1].kind == kind and step_params(view.steps[1])["confirmed_by"] == "U0ADA"


def test_a_node_waiting_on_both_a_removal_and_an_install_is_told_as_an_install(db):
    run = Run(db, kinds=("cordon", REMOVED, INSTALLED, "hold"))
    run.move("gpu-01", REMOVED, "running")
    run.move("gpu-01", INSTALLED, "running")

    run.service.confirm_host_driver(ada, run.id, now=LATER)

    assert all(step_params(run.step("gpu-01", kind))["confirmed_by"] == "U0ADA" for kind in (REMOVED, INSTALLED))
    (row,) = run.audited("run.host-driver-installed")
    assert row["detail"]["text"] == run_messages.host_driver_confirmed_by(run.id, "Ada", ["gpu-01"], install=True)
    assert run.audited("run.host-driver-removed") == []


def test_a_confirmation_for_a_request_without_a_thread_is_recorded_but_posts_nothing(db):
    run = Run(db)
    with db.transaction():  # filed from the command line: no Slack thread
        db.execute("UPDATE requests SET channel = NULL, thread_ts = NULL WHERE id = ?", (run.request.id,))
    run.move("gpu-01", REMOVED, "running")

    run.service.confirm_host_driver(ada, run.id, now=LATER)

    assert len(run.audited("run.host-driver-removed")) == 1 and run.wakes == 1
    assert run.posted("run.host-driver-removed") == []


# ------------------------------------------------------------------ release_hold (`drain done`)


def drain_run(db: Database, nodes: tuple[str, ...] = ("gpu-01",), *, state: RunState = "running") -> Run:
    return Run(db, nodes, ("cordon", "evict", "hold", "uncordon"), state=state)


@pytest.mark.parametrize("who", [bob, eve, pool_operator("serving-a")], ids=["approver", "viewer", "other-pool"])
def test_only_an_operator_of_the_pool_may_say_drain_done_and_the_refusal_names_role_and_pool(db, who):
    run = drain_run(db)
    run.move("gpu-01", "hold", "running")

    with pytest.raises(RunAccessDenied) as refused:
        run.service.release_hold(who, run.request.id, now=LATER)

    assert (str(refused.value), refused.value.role, refused.value.pool) == (
        refusal_messages.not_allowed_to_release(run.request.id, pool=POOL), Role.OPERATOR, POOL)
    assert step_params(run.step("gpu-01", "hold")) == PLANNED["hold"]
    assert [e.action for e in run.entries()] == ["run.created"] and run.wakes == 0


@pytest.mark.parametrize("who", [ada, dan, pool_operator(POOL)], ids=["operator", "admin", "pool-operator"])
def test_an_operator_of_the_pool_or_an_admin_says_drain_done(db, who):
    run = drain_run(db)
    run.move("gpu-01", "hold", "running")

    run.service.release_hold(who, run.request.id, now=LATER)

    assert released_by_control(run.step("gpu-01", "hold"))


def test_drain_done_for_a_request_id_that_does_not_exist_names_the_closest_ids_and_releases_nothing(db):
    run = drain_run(db)
    run.move("gpu-01", "hold", "running")
    typo = a_typo_of(run.request.id)

    said = [refused_by(lambda: run.service.release_hold(ada, asked, now=LATER)) for asked in (typo, "nothing-like-it")]

    assert said == [refusal_messages.unknown_run(typo, [run.request.id]), "No run nothing-like-it."]
    assert not released_by_control(run.step("gpu-01", "hold"))
    assert [e.action for e in run.entries()] == ["run.created"] and run.wakes == 0


def test_drain_done_for_an_unknown_request_id_names_at_most_three_of_the_ids_like_it(db):
    for suffix in "abcd":  # four requests whose ids are as close as can be to the one asked
        stored_requests.create(db, kind="drain", pool=POOL, targets=[], window_start=None, window_end=None,
                               reason="r", requester="U0ADA", requester_name="ada", plan={}, plan_hash="h",
                               approvals_required=0, expires_at=LATER, at=NOW, id=RequestId(f"req-12345{suffix}"))

    said = refused_by(lambda: RunService(db).release_hold(ada, "req-12345x", now=LATER))

    assert said.startswith("No run req-12345x. Did you mean req-12345")
    assert said.count("req-12345") == 4  # the id asked and three suggestions


@pytest.mark.parametrize("state", ["aborted", "failed", "succeeded"])
def test_drain_done_for_a_request_without_an_unfinished_run_says_it_has_no_run(db, state):
    request = submit(db, POOL)  # approved, never started
    run = drain_run(db)
    run.move("gpu-01", "hold", "running")  # as the run left it
    run.becomes(state)

    refusals = []
    for request_id in (request.id, run.request.id):
        with pytest.raises(RunRefused) as refused:
            run.service.release_hold(ada, request_id, now=LATER)
        refusals.append(str(refused.value))

    assert refusals == [refusal_messages.no_run_yet(request.id), refusal_messages.no_run_yet(run.request.id)]
    assert not released_by_control(run.step("gpu-01", "hold")) and run.wakes == 0


@pytest.mark.parametrize("state", ["pending", "running", "paused"])
def test_drain_done_reaches_the_hold_of_a_run_pending_running_or_paused(db, state):
    run = drain_run(db, state=state)

    view = run.service.release_hold(ada, run.request.id, now=LATER)

    assert view.state == state and released_by_control(run.step("gpu-01", "hold"))


def test_drain_done_ends_the_holds_of_the_unfinished_run_not_those_of_an_earlier_one(db):
    request = submit(db, POOL)
    earlier = stored_runs.create(db, request_id=RequestId(request.id), dry_run=False, at=NOW - dt.timedelta(hours=1))
    assert earlier is not None
    stored_steps.add(db, run_id=earlier.id, steps=[stored_steps.NewStep(wave=0, node="gpu-01", seq=0, kind="hold",
                                                                        detail={"params": {"seconds": 60}})])
    assert stored_runs.transition(db, id=earlier.id, expected="pending", new="failed", at=NOW)
    now_running = runs_of(db).start(request.id, dry_run=False, now=NOW, actor=ada)

    view = RunService(db).release_hold(ada, request.id, now=LATER)

    assert view.id == now_running.id and [s.kind for s in view.steps if released_by_control(s)] == ["hold"]
    assert not any(released_by_control(s) for s in stored_steps.for_run(db, run_id=earlier.id))
    assert [e.run_id for e in audit.for_request(db, RequestId(request.id)) if e.action == "run.released"] == [
        now_running.id]


def test_only_holds_pending_or_in_flight_are_ended_and_the_message_names_their_nodes_once_in_order(db):
    run = drain_run(db, ("gpu-04", "gpu-02", "gpu-03", "gpu-01"))
    run.move("gpu-01", "hold", "running")
    run.move("gpu-02", "hold", "done")
    run.move("gpu-03", "hold", "skipped")
    run.move("gpu-04", "evict", "running")  # its hold still pending: it ends as it starts

    run.service.release_hold(ada, run.request.id, now=LATER)

    assert {s.node: released_by_control(s) for s in run.steps() if s.kind == "hold"} == {
        "gpu-01": True, "gpu-02": False, "gpu-03": False, "gpu-04": True}
    assert not any(released_by_control(s) for s in run.steps() if s.kind != "hold")
    (row,) = run.audited("run.released")
    assert row["detail"] == {"text": run_messages.hold_released(run.id, "Ada", nodes=["gpu-01", "gpu-04"])}


def test_a_node_with_two_holds_is_named_once_in_the_message(db):
    run = Run(db, ("gpu-02", "gpu-01"), ("cordon", "hold", "hold", "uncordon"))

    run.service.release_hold(ada, run.request.id, now=LATER)

    assert all(released_by_control(s) for s in run.steps() if s.kind == "hold")
    (row,) = run.audited("run.released")
    assert row["detail"]["text"] == run_messages.hold_released(run.id, "Ada", nodes=["gpu-01", "gpu-02"])


def test_a_run_whose_holds_are_all_over_has_nothing_to_release(db):
    run = drain_run(db, ("gpu-01", "gpu-02"))
    run.move("gpu-01", "hold", "done")
    run.move("gpu-02", "hold", "failed")
    run.move("gpu-02", "evict", "running")

    with pytest.raises(RunRefused) as refused:
        run.service.release_hold(ada, run.request.id, now=LATER)

    assert str(refused.value) == refusal_messages.nothing_to_release(run.id)
    assert [e.action for e in run.entries()] == ["run.created"] and run.told() == ["run.created"]
    assert run.wakes == 0


def test_a_hold_already_released_is_not_released_again(db):
    run = drain_run(db, ("gpu-01", "gpu-02"))
    # Released before by a word whose author was not written down.
    earlier = HoldRelease(released_at=NOW).written_into(PLANNED["hold"])
    run.move("gpu-01", "hold", "running", detail={"params": earlier})
    run.move("gpu-02", "hold", "running")

    run.service.release_hold(ada, run.request.id, now=LATER)

    assert step_params(run.step("gpu-01", "hold")) == earlier
    (row,) = run.audited("run.released")
    assert row["detail"]["text"] == run_messages.hold_released(run.id, "Ada", nodes=["gpu-02"])
    again = refused_by(lambda: run.service.release_hold(dan, run.request.id, now=LATER))
    assert again == refusal_messages.nothing_to_release(run.id)
    assert len(run.audited("run.released")) == 1 and run.wakes == 1


def test_a_hold_that_ends_while_drain_done_is_written_is_left_alone_and_not_named(db):
    run = drain_run(db, ("gpu-01", "gpu-02"))
    run.move("gpu-01", "hold", "running")
    run.move("gpu-02", "hold", "running")
    # The engine ends gpu-02's hold between the read of the steps and the write of its release.
    db.execute("CREATE TEMP TRIGGER meanwhile AFTER UPDATE OF detail ON steps WHEN NEW.node = 'gpu-01' BEGIN "
               "UPDATE steps SET state = 'done' WHERE run_id = NEW.run_id AND node = 'gpu-02' AND kind = 'hold'; END")

    run.service.release_hold(ada, run.request.id, now=LATER)

    db.execute("DROP TRIGGER meanwhile")
    assert not released_by_control(run.step("gpu-02", "hold"))
    (row,) = run.audited("run.released")
    assert row["detail"]["text"] == run_messages.hold_released(run.id, "Ada", nodes=["gpu-01"])


def test_drain_done_writes_the_release_with_who_and_when_and_keeps_the_rest_of_the_holds_detail(db):
    run = drain_run(db)
    engine_wrote = {"params": PLANNED["hold"], "intent": {"until": "2025-06-07T13:00:00Z"}, "waiting": "until 13:00"}
    run.move("gpu-01", "hold", "running", detail=engine_wrote)

    run.service.release_hold(ada, run.request.id, now=LATER)

    step = run.step("gpu-01", "hold")
    assert step.state == "running"  # the engine ends it on its next look
    assert HoldRelease.read_from(step_params(step), kind="hold") == HoldRelease(released_at=LATER,
                                                                                released_by_user="U0ADA")
    assert HoldRelease.left_out_of(step_params(step)) == PLANNED["hold"]
    assert {k: v for k, v in step.detail.items() if k != "params"} == {  # type: ignore[union-attr]
        "intent": {"until": "2025-06-07T13:00:00Z"}, "waiting": "until 13:00"}


def test_a_hold_whose_stored_detail_is_not_an_object_gets_the_release_alone(db):
    run = drain_run(db)
    run.move("gpu-01", "hold", "running", detail=["an", "old", "row"])

    run.service.release_hold(ada, run.request.id, now=LATER)

    assert run.step("gpu-01", "hold").detail == {
        "params": HoldRelease(released_at=LATER, released_by_user="U0ADA").written_into({})}


def test_drain_done_is_audited_and_told_in_the_requests_thread_in_full_and_wakes_the_engine(db):
    run = drain_run(db, state="paused")

    view = run.service.release_hold(ada, run.request.id, now=LATER)

    text = run_messages.hold_released(run.id, "Ada", nodes=["gpu-01"])
    run.recorded_once("run.released", before="paused", after="paused", detail={"text": text}, dedupe="released")
    assert run.wakes == 1 and view == run.service.get(run.id)


def test_the_thread_names_someone_the_configuration_does_not_name_by_a_mention_not_their_display_name(db):
    confirmed, released = Run(db), drain_run(db)
    confirmed.move("gpu-01", REMOVED, "running")
    pat = pool_operator(POOL)  # "Pat" in Slack, which anyone can call themselves

    confirmed.service.confirm_host_driver(pat, confirmed.id, now=LATER)
    released.service.release_hold(pat, released.request.id, now=LATER)

    assert [p["payload"]["text"] for p in confirmed.posted(f"run.{REMOVED}") + released.posted("run.released")] == [
        run_messages.host_driver_confirmed_by(confirmed.id, "<@U0POOL>", ["gpu-01"], install=False),
        run_messages.hold_released(released.id, "<@U0POOL>", nodes=["gpu-01"])]
    assert step_params(confirmed.step("gpu-01", REMOVED))["confirmed_by_name"] == "<@U0POOL>"


# ------------------------------------------------------------------ pause, resume, abort

_ALL_STATES: tuple[RunState, ...] = ("pending", "running", "paused", "aborted", "failed", "succeeded")
# What each control accepts a run in, and the state it leaves it in.
_CONTROLS: dict[str, tuple[tuple[RunState, ...], RunState, str]] = {"pause": (("pending", "running"), "paused", "paused"),
             "resume": (("paused",), "running", "resumed"),
             "abort": (("pending", "running", "paused"), "aborted", "aborted")}


def _control(run: Run, name: str, who: Actor = ada) -> RunView:
    return getattr(run.service, name)(who, run.id, now=LATER)


@pytest.mark.parametrize("name", sorted(_CONTROLS))
@pytest.mark.parametrize("state", _ALL_STATES)
def test_each_control_acts_only_on_a_run_in_the_states_it_expects_and_otherwise_says_why(db, name, state):
    expected, new, done = _CONTROLS[name]
    run = drain_run(db, state=state)

    outcome: str
    try:
        outcome = _control(run, name).state
    except RunRefused as refused:
        outcome = str(refused)

    if state in expected:
        assert outcome == new == run.state
        assert [e.action for e in run.entries()] == ["run.created", f"run.{done}"] and run.wakes == 1
    else:
        assert outcome == refusal_messages.cannot_control(run.id, done, state)
        assert run.state == state
        assert [e.action for e in run.entries()] == ["run.created"] and run.told() == ["run.created"]
        assert run.wakes == 0


def test_someone_at_the_command_line_who_pauses_a_run_is_named_in_the_thread_by_their_name_not_their_id(db):
    run = drain_run(db)
    console = Actor(user_id=UserId("cli:ada"), name="ada at the console", roles=frozenset({Role.OPERATOR}), via="cli")

    run.service.pause(console, run.id, now=LATER)

    (paused,) = run.posted("run.paused")
    assert paused["payload"]["text"] == run_messages.run_paused(run.id, "ada at the console")


def test_a_control_of_a_run_that_does_not_exist_names_the_closest_run_ids(db):
    run = drain_run(db)
    typo = a_typo_of(run.id)

    with pytest.raises(UnknownRun) as refused:
        run.service.pause(ada, typo, now=LATER)

    assert (str(refused.value), refused.value.closest) == (refusal_messages.unknown_run(typo, [run.id]), (run.id,))
    assert run.state == "running" and run.wakes == 0


@pytest.mark.parametrize("name, say", [("pause", run_messages.run_paused), ("resume", run_messages.run_resumed)])
def test_a_pause_or_a_resume_is_audited_and_told_in_the_requests_thread_in_full(db, name, say):
    _, new, done = _CONTROLS[name]
    run = drain_run(db, state="running" if name == "pause" else "paused")
    before = run.state

    view = _control(run, name)

    text = say(run.id, "Ada")
    run.recorded_once(f"run.{done}", before=before, after=new, detail={"text": text}, dedupe=done)
    assert run.wakes == 1 and view == run.service.get(run.id) and view.state == new
    stored = stored_runs.get(db, id=run.id)
    assert stored is not None and stored.halted_reason is None
    assert run.request_state() == "running"  # a pause or a resume leaves the request as it is


def test_an_abort_ends_every_unfinished_step_naming_who_aborted_and_leaves_ended_ones_as_they_were(db):
    run = drain_run(db, ("gpu-01", "gpu-02"))
    run.move("gpu-01", "cordon", "done")
    run.move("gpu-01", "evict", "running")
    run.move("gpu-02", "cordon", "failed")

    view = _control(run, "abort")

    assert [(s.node, s.kind, s.state, s.error) for s in view.steps] == [
        ("gpu-01", "cordon", "done", None), ("gpu-01", "evict", "failed", halt_messages.aborted_step("Ada")),
        ("gpu-01", "hold", "skipped", None), ("gpu-01", "uncordon", "skipped", None),
        ("gpu-02", "cordon", "failed", None), ("gpu-02", "evict", "skipped", None),
        ("gpu-02", "hold", "skipped", None), ("gpu-02", "uncordon", "skipped", None)]
    assert halt_messages.aborted_step("Ada") == "aborted by Ada"
    assert [s.ended_at for s in view.steps if s.state == "skipped" or s.kind == "evict"] == [LATER] * 6


def test_an_abort_says_which_nodes_the_run_left_cordoned_in_its_reason_audit_and_thread(db):
    run = drain_run(db, ("gpu-01", "gpu-02", "gpu-03"))
    run.move("gpu-01", "cordon", "done", detail={"params": {}, "result": {"prior_unschedulable": False}})
    run.move("gpu-02", "cordon", "done", detail={"params": {}, "result": {"prior_unschedulable": True}})
    run.move("gpu-03", "cordon", "running", detail={"params": {}, "intent": {"prior_unschedulable": False}})

    view = _control(run, "abort")

    # gpu-03's cordon was on the wire: it may have landed, so the reason names it too.
    reason = halt_messages.run_aborted(run.id, "Ada", left_cordoned=("gpu-01", "gpu-03"))
    assert view.run.halted_reason == reason and view.left_cordoned == ("gpu-01", "gpu-03")
    run.recorded_once("run.aborted", before="running", after="aborted", detail={"text": reason}, dedupe="aborted")
    assert run.wakes == 1


def test_the_aborted_runs_view_lists_a_node_whose_cordon_was_in_flight_as_its_reason_does(db):
    run = drain_run(db)
    run.move("gpu-01", "cordon", "running", detail={"params": {}, "intent": {"prior_unschedulable": False}})

    view = _control(run, "abort")

    assert view.run.halted_reason == halt_messages.run_aborted(run.id, "Ada", left_cordoned=("gpu-01",))
    assert view.left_cordoned == ("gpu-01",)  # what `/gpu status` lists and drift counts as this run's


@pytest.mark.parametrize("request_state, after", [("running", "failed"), ("scheduled", "failed"),
                                                  ("approved", "failed"), ("cancelled", "cancelled"),
                                                  ("done", "done")])
def test_an_abort_fails_the_request_only_from_running_scheduled_or_approved(db, request_state, after):
    run = drain_run(db)
    if request_state != "running":
        assert stored_requests.transition(db, id=run.request.id, expected="running", new=request_state, at=NOW)

    assert _control(run, "abort").state == "aborted"

    assert run.request_state() == after


@pytest.mark.parametrize("name", sorted(_CONTROLS))
def test_a_run_that_changes_under_a_control_refuses_it_as_changing_and_keeps_everything_as_it_was(db, name):
    expected, _, done = _CONTROLS[name]
    run = drain_run(db, state=expected[-1])
    run.move("gpu-01", "evict", "running")
    # Another writer moves the run first: the compare-and-set of this control loses.
    db.execute("CREATE TEMP TRIGGER meanwhile BEFORE UPDATE OF state ON runs BEGIN SELECT RAISE(IGNORE); END")

    with pytest.raises(RunRefused) as refused:
        _control(run, name)

    db.execute("DROP TRIGGER meanwhile")
    assert str(refused.value) == refusal_messages.cannot_control(run.id, done, "changing")
    assert run.state == expected[-1] and run.request_state() == "running"
    assert [s.state for s in run.steps()] == ["pending", "running", "pending", "pending"]
    assert [e.action for e in run.entries()] == ["run.created"] and run.told() == ["run.created"]
    assert run.wakes == 0


def test_a_control_of_a_request_without_a_thread_is_recorded_but_posts_nothing(db):
    run = drain_run(db)
    with db.transaction():
        db.execute("UPDATE requests SET channel = NULL, thread_ts = NULL WHERE id = ?", (run.request.id,))

    _control(run, "pause")

    assert len(run.audited("run.paused")) == 1 and run.posted("run.paused") == []


# ------------------------------------------------------------------ reading a step's detail


def stored(kind: str, detail: Any, state: str = "failed") -> Step:
    return step_of("gpu-01", kind, state, 1, detail)


@pytest.mark.parametrize("code", HALT_CODES)
def test_a_failed_step_halts_with_the_code_its_detail_names(code):
    assert halt_code_of(stored("evict", {"halt_code": code})) == code


@pytest.mark.parametrize("detail", [{}, {"halt_code": "no-such-code"}, {"halt_code": None}, {"note": "mig-failed"},
                                    ["halt_code", "mig-failed"], "mig-failed"],
                         ids=["no-code", "unknown-code", "null-code", "other-keys", "a-list", "text"])
def test_a_step_without_a_known_halt_code_halts_as_step_failed(detail):
    assert halt_code_of(stored("evict", detail)) == "step-failed"


def test_a_running_steps_note_is_its_outcome_when_written_else_what_it_waits_for():
    assert step_note(stored("evict", {"note": "evicted 2 pods", "waiting": "ml/job"}, "running")) == "evicted 2 pods"
    assert step_note(stored("evict", {"note": 0, "waiting": "ml/job"}, "running")) == "0"
    assert step_note(stored("evict", {"waiting": "ml/job"}, "running")) == "ml/job"
    assert step_note(stored("evict", {"params": {}}, "running")) is None
    assert step_note(stored("evict", {"waiting": "ml/job"}, "failed")) is None
    assert step_note(stored("evict", {"note": "gone", "waiting": "ml/job"}, "failed")) == "gone"
    assert step_note(stored("evict", ["waiting", "ml/job"], "running")) is None


def test_a_steps_intent_and_params_are_objects_or_empty():
    intent, params = {"prior_unschedulable": False}, {"seconds": 60}
    assert (step_intent(stored("cordon", {"intent": intent})), step_params(stored("cordon", {"params": params}))) == (
        intent, params)
    for detail in ({}, {"intent": "text", "params": ["a", "list"]}, {"intent": None, "params": None}, "an old row"):
        assert (step_intent(stored("cordon", detail)), step_params(stored("cordon", detail))) == ({}, {}), detail


def test_a_hold_counts_as_released_once_drain_done_is_written_even_in_a_form_the_codec_refuses():
    written = HoldRelease(released_at=NOW, released_by_user="U0ADA").written_into({"seconds": 60})
    assert released_by_control(stored("hold", {"params": written}, "running"))
    assert released_by_control(stored("hold", {"params": {"released_at": "yesterday"}}, "running"))
    assert not released_by_control(stored("hold", {"params": {"seconds": 60}}, "running"))
    assert not released_by_control(stored("hold", {"params": {"released_by_user": "U0ADA"}}, "running"))
    assert not released_by_control(stored("hold", "an old row", "running"))


def test_an_extension_reads_as_its_end_its_stored_text_when_the_codec_refuses_it_or_none():
    end = NOW + dt.timedelta(hours=2)
    written = HoldExtension(extended_until=end, extended_by="U0ADA").written_into({"seconds": 60})
    assert extended_by_control(stored("hold", {"params": written}, "running")) == end
    assert extended_by_control(stored("hold", {"params": {"extended_until": "next tuesday"}}, "running")) == (
        "next tuesday")
    assert extended_by_control(stored("hold", {"params": {"extended_until": 5}}, "running")) == "5"
    assert extended_by_control(stored("hold", {"params": {"extended_at": NOW.isoformat()}}, "running")) is None
    assert extended_by_control(stored("hold", {"params": {"extended_until": None}}, "running")) is None
    assert extended_by_control(stored("hold", "an old row", "running")) is None


def test_a_step_takes_over_the_run_its_mark_names_and_none_for_a_mark_the_codec_refuses():
    mark = TakesOverMark(takes_over=RunId("run-0ld001"))
    assert taken_over_run(stored("cordon", {"params": mark.written_into({})}, "running")) == mark
    assert taken_over_run(stored("cordon", {"params": {"takes_over": 5}}, "running")) is None
    assert taken_over_run(stored("cordon", {"params": {}}, "running")) is None
    assert taken_over_run(stored("cordon", ["takes_over"], "running")) is None
