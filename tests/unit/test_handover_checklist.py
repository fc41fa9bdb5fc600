"""What the incoming shift reads: the checklist built from a fleet of plain node and pod
values, the open requests and the runs in flight, with what needs action first, and the
changes since the previous handover."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import pytest

from commands.handover import ACK_ACTION, render_checklist
from storage.ids import RequestId, RunId, StepId
from storage.steps import Step
from workflows.drain.history import NodesDrained
from workflows.fleet.summary import Fleet
from workflows.handover.building import build_checklist
from workflows.handover.checklist import (
    Checklist,
    RunFailure,
    RunInFlight,
    checklist_from_json,
    checklist_to_json,
)
from workflows.handover.rotations import RotationConfig
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave
from workflows.requests.views import ApprovalView, RequestView

UTC = dt.timezone.utc
HOUR = dt.timedelta(hours=1)
# The fleet builders' NOW (2025-06-07 12:00 UTC) is 14:00 in Berlin: the day shift.
ROTATION = RotationConfig.model_validate({
    "name": "gpu-oncall", "team": "GPU platform", "channel": "C0GPU", "timezone": "Europe/Berlin",
    "shifts": [{"name": "day", "starts": "0 8 * * *", "members": ["U0ALICE"]},
               {"name": "night", "starts": "0 20 * * *", "members": ["U0BOB"]}],
})


def since(make, **ago: float) -> str:
    return (make.now - dt.timedelta(**ago)).isoformat()


def special_fleet(make) -> Fleet:
    """One node of each kind the handover must call out, and a healthy one."""
    nodes = [
        make.node("gpu-ok"),
        make.node("gpu-hand", unschedulable=True),
        make.node("gpu-short", capacity={"nvidia.com/gpu": "6"}),
        make.node("gpu-conflict", labels={"nvidia.com/gpu.deploy.driver": "pre-installed"}),
        make.node("gpu-upgrade", labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"},
                  annotations={"gpuops.io/upgrade-state-since": since(make, hours=26)}),
        make.node("gpu-mig", capacity={"nvidia.com/gpu": "0"},
                  labels={"nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": "pending",
                          "nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change"},
                  annotations={"gpuops.io/mig-state-since": since(make, minutes=45)}),
        make.node("gpu-run", unschedulable=True,
                  annotations={"gpuops.io/cordoned-by": json.dumps({"by": "U0ADA", "run": "run-aaa111"})}),
        make.node("gpu-left", unschedulable=True,
                  annotations={"gpuops.io/cordoned-by": json.dumps({"by": "gpuops for ada", "run": "run-old000"})}),
    ]
    pods = [p for n in nodes if n.name not in ("gpu-conflict", "gpu-mig") for p in make.operands(n.name)]
    pods += [
        make.driver_pod("gpu-conflict", ready=False, restarts=9, waiting_reason="CrashLoopBackOff",
                        last_terminated_reason="Error"),
        make.device_plugin_pod("gpu-conflict"),
        make.driver_pod("gpu-mig"),
    ]
    return make.fleet(nodes, pods)


def step(run: str, node: str, seq: int, kind: str, state: str, *, ended: dt.datetime | None = None,
         started: dt.datetime | None = None, attempt: int = 1) -> Step:
    return Step(id=StepId(seq), run_id=RunId(run), wave=0, node=node, seq=seq, kind=kind,  # type: ignore[arg-type]
                state=state, attempt=attempt, started_at=started, ended_at=ended, detail={},  # type: ignore[arg-type]
                error=None)


def run_in_flight(make, *, state: str = "running", halted_reason: str | None = None) -> RunInFlight:
    cordoned = make.now - 2 * HOUR
    return RunInFlight(
        run_id="run-aaa111", request_id="req-aaa111", kind="upgrade", pool="train-a", state=state,
        dry_run=False, halted_reason=halted_reason,
        steps=(
            step("run-aaa111", "gpu-run", 0, "cordon", "done", ended=cordoned),
            step("run-aaa111", "gpu-run", 1, "drain", "done", ended=cordoned + HOUR),
            step("run-aaa111", "gpu-run", 2, "driver", "running", started=make.now - 20 * dt.timedelta(minutes=1),
                 attempt=2),
            step("run-aaa111", "gpu-run", 3, "uncordon", "pending"),
        ),
    )


def request_view(request_id: str, *, state: str, kind: str = "drain", pool: str = "train-a",
                 window_start: dt.datetime | None = None, expires_at: dt.datetime,
                 counted: int = 0, required: int = 1, approvers: tuple[str, ...] = ()) -> RequestView:
    plan = Plan(kind=kind, pool=pool, created_for="U0ADA",  # type: ignore[arg-type]
                waves=(Wave(0, (NodeName("gpu-ok"),), (NodeStep("cordon", NodeName("gpu-ok")),)),),
                summary=PlanSummary())
    approvals = tuple(ApprovalView(approver=a, approver_name=a, decision="approve", plan_hash="0" * 64,
                                   counts=True, reason=None, at=expires_at - 10 * HOUR) for a in approvers)
    return RequestView(
        id=RequestId(request_id), kind=kind, pool=pool, state=state, requester="U0ADA",  # type: ignore[arg-type]
        requester_name="Ada", reason="maintenance", targets=["gpu-ok"], window_start=window_start,
        window_end=window_start + 2 * HOUR if window_start else None, plan=plan, plan_hash="0" * 64,
        approvals=approvals, approvals_required=required, approvals_counted=counted,
        expires_at=expires_at, created_at=expires_at - 24 * HOUR, updated_at=expires_at - 24 * HOUR,
        channel=None, thread_ts=None)


@dataclass(frozen=True)
class StoredBefore:
    """A previous handover as storage gives it: a shift start and its content JSON."""

    shift_start: dt.datetime
    content: Any


def checklist_for(make, *, fleet: Fleet | None = None, requests=(), runs=(), previous=None,
                  drains=(), now: dt.datetime | None = None, failures=()) -> Checklist:
    now = now or make.now
    return build_checklist(
        fleet=fleet or special_fleet(make), requests=list(requests), runs_in_flight=list(runs),
        previous=previous, rotation=ROTATION, shift=ROTATION.current_shift(now), now=now,
        last_drains=list(drains), failures=list(failures))


def lines(items) -> list[tuple[str, str, str]]:
    return [(i.severity, i.kind, i.subject) for i in items]


# ------------------------------------------------------------------ the special nodes


def test_every_special_node_is_listed_with_what_needs_action_first(make):
    checklist = checklist_for(make, runs=[run_in_flight(make)])

    assert lines(checklist.needs_action) == [
        ("critical", "finding", "gpu-conflict"),   # two driver sources
        ("critical", "finding", "gpu-mig"),        # MIG change stuck
        ("critical", "finding", "gpu-short"),      # advertises 6 of 8
        ("warning", "finding", "gpu-upgrade"),     # upgrade stuck
        ("warning", "cordon", "gpu-hand"),         # cordoned by hand
        ("warning", "cordon", "gpu-left"),         # gpuops cordon left behind
    ]
    codes = {i.subject: i.code for i in checklist.needs_action if i.kind == "finding"}
    assert codes == {"gpu-conflict": "driver-conflict", "gpu-mig": "mig-change-stuck",
                     "gpu-short": "advertised-mismatch", "gpu-upgrade": "upgrade-stuck"}
    assert all(i.command.startswith("/gpu ") for i in checklist.items())
    assert "gpu-ok" not in {i.subject for i in checklist.items()}


def test_cordons_say_who_cordoned_and_for_how_long_when_known(make):
    checklist = checklist_for(make, runs=[run_in_flight(make)])
    text = {i.subject: i.text for i in checklist.items() if i.kind == "cordon"}

    assert text["gpu-hand"].startswith("gpu-hand is cordoned by hand, not by gpuops; first seen cordoned")
    assert text["gpu-left"].startswith("gpu-left is still cordoned by gpuops for ada in run-old000, which is no "
                                       "longer running; check the run's outcome, then `/gpu uncordon gpu-left`")
    assert text["gpu-run"] == "gpu-run is cordoned by gpuops for 2h for run-aaa111, which is in flight"
    assert [i.subject for i in checklist.for_information if i.kind == "cordon"] == ["gpu-run"]


def test_a_persons_cordon_a_run_in_flight_keeps_is_called_the_persons(make):
    fleet = make.fleet([make.node("gpu-run", unschedulable=True, annotations={"gpuops.io/cordoned-by": json.dumps(
        {"by": "gpuops for ada", "run": "run-aaa111", "prior_unschedulable": True})})], make.operands("gpu-run"))

    checklist = checklist_for(make, fleet=fleet, runs=[run_in_flight(make)])

    (item,) = [i for i in checklist.items() if i.kind == "cordon"]
    assert item.text == ("gpu-run is cordoned by hand, from before run-aaa111, which is in flight and leaves it "
                         "cordoned when it ends")


def test_driver_pods_behind_while_an_upgrade_of_the_pool_is_in_flight_are_one_line_saying_the_run_is_on_it(make):
    new = "580.105.08"
    nodes = [make.node("a"), make.node("b"), make.node("c")]
    pods = [p for n in ("a", "b") for p in (make.driver_pod(n), make.device_plugin_pod(n), make.validator_pod(n))]
    pods += [make.driver_pod("c", version=new, generation="2"), make.device_plugin_pod("c"), make.validator_pod("c")]
    fleet = make.fleet(nodes, pods, driver_templates=[make.driver_template(version=new, generation="2")])
    assert any(f.code == "driver-pods-behind-template" for f in fleet.findings)

    checklist = checklist_for(make, fleet=fleet, runs=[run_in_flight(make)])

    assert not [i for i in checklist.needs_action if i.code == "driver-pods-behind-template"]
    (item,) = [i for i in checklist.for_information if i.code == "driver-pods-behind-template"]
    assert item.text.startswith("run-aaa111 (upgrade) is in flight on it: 2 of 3 nodes (a, b) run a driver pod older")
    assert item.command == "/gpu request req-aaa111"


def behind_in_two_pools(make) -> Fleet:
    new = "580.105.08"
    nodes = [make.node(n, pool=pool) for n, pool in (("a", "train-a"), ("b", "train-a"), ("x", "train-b"),
                                                        ("y", "train-b"))]
    pods = [p for n in ("a", "x") for p in (make.driver_pod(n), make.device_plugin_pod(n), make.validator_pod(n))]
    pods += [p for n in ("b", "y") for p in (make.driver_pod(n, version=new, generation="2"),
                                              make.device_plugin_pod(n), make.validator_pod(n))]
    return make.fleet(nodes, pods, driver_templates=[make.driver_template(version=new, generation="2")])


def test_near_identical_findings_are_one_line_naming_what_they_are_on(make):
    fleet = behind_in_two_pools(make)
    assert len([f for f in fleet.findings if f.code == "driver-pods-behind-template"]) == 2

    checklist = checklist_for(make, fleet=fleet)

    (item,) = [i for i in checklist.items() if i.code == "driver-pods-behind-template"]
    assert item.text.startswith("driver-pods-behind-template on 2 pools (train-a and train-b); the first: "
                                "1 of 2 nodes (a) run a driver pod older than its DaemonSet")
    assert item.severity == "warning" and item.command == "/gpu findings"
    # What changed since the last handover is still said per pool.
    again = checklist_for(make, fleet=fleet, previous=StoredBefore(shift_start=make.now - 12 * HOUR,
                                                                    content={"finding_keys": []}))
    assert again.changes is not None
    assert sorted(i.subject for i in again.changes.new if i.code == "driver-pods-behind-template") == [
        "train-a", "train-b"]


def test_a_run_in_flight_on_one_pool_is_named_and_the_other_pools_line_stays_for_action(make):
    checklist = checklist_for(make, fleet=behind_in_two_pools(make), runs=[run_in_flight(make)])

    (fixing,) = [i for i in checklist.for_information if i.code == "driver-pods-behind-template"]
    assert fixing.text.startswith("run-aaa111 (upgrade) is in flight on it: 1 of 2 nodes (a) run a driver pod")
    (open_,) = [i for i in checklist.needs_action if i.code == "driver-pods-behind-template"]
    assert open_.subject == "train-b" and "(x)" in open_.text


def test_a_node_cordoned_at_the_previous_handover_too_shows_since_when(make):
    first = checklist_for(make, now=make.now - 12 * HOUR)
    before = StoredBefore(shift_start=first.shift_start, content=checklist_to_json(first))

    checklist = checklist_for(make, previous=before)

    (hand,) = [i for i in checklist.needs_action if i.subject == "gpu-hand"]
    assert "cordoned for at least 12h (seen since Sat 07 Jun 02:00 CEST)" in hand.text


def test_runs_in_flight_show_their_current_step_and_a_paused_run_needs_action(make):
    running = checklist_for(make, runs=[run_in_flight(make)])
    paused = checklist_for(make, runs=[run_in_flight(make, state="paused", halted_reason="validator failed on gpu-run")])

    (item,) = running.in_flight
    assert item.text == ("run-aaa111: upgrade of train-a for req-aaa111: wave 1, driver on gpu-run running "
                         "for 20m, attempt 2; 2/4 steps done")
    assert item.command == "/gpu request req-aaa111"
    assert paused.in_flight == ()
    (halted,) = [i for i in paused.needs_action if i.kind == "run"]
    assert (halted.severity, halted.subject) == ("warning", "run-aaa111")
    assert halted.text.endswith("is paused: validator failed on gpu-run; 2/4 steps done. Resume or abort it")


def test_requests_waiting_for_approval_need_action_and_windows_in_the_shift_are_listed(make):
    now = make.now  # 14:00 Berlin, day shift until 20:00
    requests = [
        request_view("req-wait01", state="pending", expires_at=now + 3 * HOUR, counted=1, required=2,
                     window_start=now + 2 * HOUR),
        request_view("req-soon01", state="approved", window_start=now + 4 * HOUR,
                     expires_at=now + HOUR, approvers=("Bob",)),
        request_view("req-late01", state="scheduled", window_start=now + 9 * HOUR, expires_at=now + HOUR),
    ]

    checklist = checklist_for(make, requests=requests)

    (waiting,) = [i for i in checklist.needs_action if i.kind == "approval"]
    assert waiting.text == ("req-wait01: drain of train-a waits for 1 more approval (1/2); expires "
                            "Sat 07 Jun 17:00 CEST (in 3h); window Sat 07 Jun 16:00 CEST (this shift)")
    assert [(i.subject, i.text) for i in checklist.coming_up] == [
        ("req-soon01", "req-soon01: drain of train-a, window Sat 07 Jun 18:00 CEST – 20:00 (approved, approved by Bob)")]


def test_each_pool_shows_its_last_drain_or_says_none_is_recorded(make):
    fleet = make.fleet([make.node("a", pool="train-a"), make.node("b", pool="serving-a")],
                       make.operands("a") + make.operands("b"))
    drains = [NodesDrained(pool="train-a", request_id="req-old001", kind="drain", at=make.now - 30 * HOUR,
                          nodes=2, outcome="succeeded"),
              NodesDrained(pool="train-a", request_id="req-new001", kind="upgrade", at=make.now - 5 * HOUR,
                          nodes=1, outcome="succeeded")]

    checklist = checklist_for(make, fleet=fleet, drains=drains)

    assert [(d.pool, d.text, d.command) for d in checklist.last_drains] == [
        ("serving-a", "no drains recorded", "/gpu status serving-a"),
        ("train-a", "last drained Sat 07 Jun 09:00 CEST (5h ago): 1 node by req-new001 (upgrade, succeeded)",
         "/gpu request req-new001"),
    ]


def test_the_cluster_facts_name_the_operator_the_cluster_policy_and_its_owner(make):
    checklist = checklist_for(make)

    assert checklist.cluster.operator == "v26.7.0 in gpu-operator"
    assert checklist.cluster.cluster_policy == "cluster-policy (ready)"
    assert checklist.cluster.owner == "not set (configure cluster.cluster_policy_owner)"


# ------------------------------------------------------------------ changes since the last one


def test_the_first_handover_has_nothing_to_compare_with(make):
    assert checklist_for(make).changes is None


def test_new_and_resolved_findings_are_diffed_against_the_previous_handover(make):
    earlier_fleet = make.fleet([make.node("gpu-ok"), make.node("gpu-gone", capacity={"nvidia.com/gpu": "4"})],
                               make.operands("gpu-ok") + make.operands("gpu-gone"))
    first = checklist_for(make, fleet=earlier_fleet, now=make.now - 12 * HOUR)
    before = StoredBefore(shift_start=first.shift_start, content=checklist_to_json(first))

    checklist = checklist_for(make, previous=before)

    assert checklist.changes is not None
    assert checklist.changes.since == first.shift_start
    assert [(i.code, i.subject) for i in checklist.changes.new] == [
        ("driver-conflict", "gpu-conflict"), ("mig-change-stuck", "gpu-mig"),
        ("advertised-mismatch", "gpu-short"), ("upgrade-stuck", "gpu-upgrade")]
    assert [i.text for i in checklist.changes.resolved] == ["advertised-mismatch on gpu-gone is resolved"]
    assert {(k["code"], k["subject"]) for k in checklist_to_json(checklist)["finding_keys"]} == {
        (i.code, i.subject) for i in checklist.changes.new}


def test_a_checklist_survives_storage_as_json(make):
    checklist = checklist_for(make, runs=[run_in_flight(make)])

    assert checklist_from_json(json.loads(json.dumps(checklist_to_json(checklist)))) == checklist


# ------------------------------------------------------------------ rendered


def test_the_default_rendering_puts_needs_action_first_with_commands_and_an_acknowledge_button(make):
    from workflows.handover.service import HandoverView

    checklist = checklist_for(make, runs=[run_in_flight(make)])
    view = HandoverView(id=7, rotation="gpu-oncall", shift="day", shift_start=checklist.shift_start,  # type: ignore[arg-type]
                        channel="C0GPU", ts=None, late=False, missed=0, queued_at=make.now, posted_at=None,
                        acked_by=None, acked_by_name=None, acked_at=None, acks=(), reminded_at=None,
                        escalated_at=None, members=("U0ALICE",), content={}, checklist=checklist)

    reply = render_checklist(checklist, ROTATION.checklist_template, handover=view)

    assert reply.title == "Handover to the day shift · GPU platform"
    assert reply.summary.startswith("6 need action · 1 in flight · 0 windows this shift · Sat 07 Jun 08:00 CEST until")
    assert reply.sections[0].title == "Needs action"
    assert [(n.severity, n.subject, n.command) for n in reply.sections[0].notices][:2] == [
        ("critical", None, "/gpu node gpu-conflict"), ("critical", None, "/gpu node gpu-mig")]
    titles = [s.title for s in reply.sections]
    assert titles == ["Needs action", "In flight", "Since the last handover", "Also worth knowing",
                      "Last drain per pool", "Cluster"]
    assert reply.intents[0].action == ACK_ACTION and reply.intents[0].value == "7"
    assert reply.intents[0].label == "Acknowledge"
    assert reply.visibility == "in_channel"
    assert reply.footer.startswith("Waiting for someone on the day shift to acknowledge")


def test_a_late_checklist_says_so_and_how_many_were_missed(make):
    checklist = build_checklist(
        fleet=special_fleet(make), requests=[], runs_in_flight=[], previous=None, rotation=ROTATION,
        shift=ROTATION.current_shift(make.now), now=make.now, late=True, missed=2)

    reply = render_checklist(checklist, ROTATION.checklist_template)

    assert ("Posted late: gpuops was not running at the shift change (Sat 07 Jun 08:00 CEST, 6h before this "
            "post); 2 earlier handovers were missed and not posted.") in reply.summary
    assert reply.intents == ()


@pytest.mark.parametrize("now_hour", [6, 18])
def test_a_quiet_fleet_says_nothing_needs_action(make, now_hour):
    now = dt.datetime(2025, 6, 7, now_hour, 0, tzinfo=UTC)
    fleet = make.fleet([make.node("gpu-ok")], make.operands("gpu-ok"), now=now)

    checklist = checklist_for(make, fleet=fleet, now=now)
    reply = render_checklist(checklist, ROTATION.checklist_template)

    assert checklist.all_clear
    assert reply.summary.startswith("Nothing needs action · 0 in flight")


# ------------------------------------------------------------------ what went wrong


def failure(make, what: str, *, node: str | None, step: str | None, left: tuple[str, ...] = (),
            run: str = "run-bad001", kind: str = "drain", minutes: int = 30) -> RunFailure:
    return RunFailure(what=what, run_id=run, request_id=run.replace("run", "req"), kind=kind,  # type: ignore[arg-type]
                      pool="train-a", requester_name="Ada", at=make.now - dt.timedelta(minutes=minutes),
                      reason="the reason.", node=node, step=step, left_cordoned=left)


def test_the_shifts_failures_say_which_run_node_and_why_what_is_still_cordoned_and_who_acts(make):
    checklist = checklist_for(make, failures=[
        failure(make, "canary-failed", node="gpu-hand", step="gpu-check", left=("gpu-hand",), run="run-can001",
                kind="upgrade", minutes=10),
        failure(make, "pdb-blocked", node="gpu-ok", step="evict", left=("gpu-ok",), run="run-pdb001"),
        failure(make, "left-out", node="gpu-short", step="evict", run="run-out001", minutes=50),
        failure(make, "halted", node=None, step=None, run="run-wav001", minutes=40),
    ])

    texts = {i.subject: (i.severity, i.text, i.command) for i in checklist.failures}
    assert [i.subject for i in checklist.failures] == ["run-out001", "run-wav001", "run-pdb001", "run-can001"]
    severity, text, command = texts["run-can001"]
    assert severity == "warning" and command == "/gpu request req-can001"
    assert text == ("run-can001: upgrade of train-a for req-can001 halted: its canary failed on gpu-hand "
                    "(Sat 07 Jun 13:50 CEST): the reason. Still cordoned: gpu-hand. Ada (who asked) or an operator "
                    "of train-a acts: roll it back (`/gpu rollback run-can001`) or uncordon (`/gpu uncordon <node>`) "
                    "or ask again.")
    # gpu-ok was given back since: nobody's task any more.
    severity, text, _ = texts["run-pdb001"]
    assert severity == "info" and "a PodDisruptionBudget blocked the drain of gpu-ok" in text
    assert text.endswith("The nodes it left cordoned (gpu-ok) are back in service.")
    assert texts["run-out001"][0] == "info" and "left gpu-short out" in texts["run-out001"][1]
    assert "halted before a wave" in texts["run-wav001"][1] and "It left no node cordoned." in texts["run-wav001"][1]
    assert checklist_from_json(json.loads(json.dumps(checklist_to_json(checklist)))) == checklist


def test_the_default_rendering_lists_the_failures_after_what_needs_action(make):
    checklist = checklist_for(make, failures=[
        failure(make, "halted", node="gpu-hand", step="validate", left=("gpu-hand",))])

    reply = render_checklist(checklist, ROTATION.checklist_template)

    assert " · 1 gone wrong · " in reply.summary
    titles = [s.title for s in reply.sections]
    assert titles[:2] == ["Needs action", "Gone wrong since the last handover"]
    (notice,) = reply.sections[1].notices
    assert notice.severity == "warning" and notice.command == "/gpu request req-bad001"
    assert notice.text.startswith("run-bad001: drain of train-a for req-bad001 halted at validate on gpu-hand")
    assert not checklist_for(make, fleet=make.fleet([make.node("gpu-ok")], make.operands("gpu-ok")),
                             failures=[failure(make, "left-out", node="gpu-ok", step="evict")]).all_clear


def test_a_checklist_stored_before_failures_were_listed_reads_back_with_none(make):
    stored = checklist_to_json(checklist_for(make))
    del stored["failures"]

    assert checklist_from_json(stored).failures == ()


# ------------------------------------------------------------------ gpuops's own layout

# The sample checklist as the handover read before gpuops laid it out itself (through the
# template's lines): the same words, sections, items and commands.
SAMPLE_AS_POSTED = """\
Handover to the day shift · Sample team
=======================================
2 need action · 1 gone wrong · 1 in flight · 1 window this shift · Sat 07 Jun 06:00 UTC until Sat 07 Jun 18:00 UTC
Posted late: gpuops was not running at the shift change (Sat 07 Jun 06:00 UTC, 7m before this post); \
1 earlier handover was missed and not posted.

Needs action
------------
[CRITICAL] sample finding about gpu-01
[WARNING] sample cordon about gpu-02

Gone wrong since the last handover
----------------------------------
[WARNING] sample failure about run-000001

In flight
---------
[INFO] sample run about run-000000

Windows this shift
------------------
[INFO] sample window about req-000000

Since the last handover
-----------------------
- new: driver-conflict on gpu-01 · `/gpu node gpu-01`
- resolved: sample finding about gpu-03

Also worth knowing
------------------
[INFO] sample finding about unpooled

Last drain per pool
-------------------
- train-a: no drains recorded · `/gpu status train-a`

Cluster
-------
- GPU Operator v26.7.0 in gpu-operator · ClusterPolicy cluster-policy (ready) · owner gpu-platform · `/gpu status`

Past handovers: `/gpu handover history sample`
"""


def test_the_sample_checklist_reads_as_it_was_posted_before():
    from bot.render_text import render_text
    from workflows.handover.layout import sample_checklist

    assert render_text(render_checklist(sample_checklist())) == SAMPLE_AS_POSTED


def _handover(checklist: Checklist, *, acked: bool):
    from workflows.handover.service import HandoverView

    return HandoverView(id=7, rotation="gpu-oncall", shift="day", shift_start=checklist.shift_start,  # type: ignore[arg-type]
                        channel="C0GPU", ts=None, late=False, missed=0, queued_at=checklist.generated_at,
                        posted_at=None, acked_by="U0ALICE" if acked else None, acked_by_name="alice" if acked else None,
                        acked_at=checklist.generated_at if acked else None, acks=(), reminded_at=None,
                        escalated_at=None, members=("U0ALICE",), content={}, checklist=checklist,
                        audit_head="12:ab34cd")


def test_the_message_is_what_the_template_lines_made_of_it_for_every_shape_of_checklist(make):
    # workflows/handover/templates/handover.md.j2 is the layout the handover was posted in
    # (read back from its lines); gpuops now lays the checklist out from its values.
    from workflows.handover.rotations import example_template

    quiet = make.fleet([make.node("gpu-ok")], make.operands("gpu-ok"))
    before = checklist_for(make)
    previous = StoredBefore(shift_start=before.shift_start - 12 * HOUR, content=checklist_to_json(before))
    shapes = [
        checklist_for(make, runs=[run_in_flight(make)]),
        checklist_for(make, runs=[run_in_flight(make, state="paused", halted_reason="PDB blocks")]),
        checklist_for(make, fleet=quiet),
        checklist_for(make, fleet=quiet, previous=previous),
        checklist_for(make, previous=StoredBefore(shift_start=before.shift_start - 12 * HOUR,
                                                  content=checklist_to_json(checklist_for(make)))),
        checklist_for(make, failures=[failure(make, "halted", node="gpu-hand", step="validate",
                                              left=("gpu-hand",))]),
        build_checklist(fleet=special_fleet(make), requests=[], runs_in_flight=[], previous=None, rotation=ROTATION,
                        shift=ROTATION.current_shift(make.now), now=make.now, late=True, missed=2),
        build_checklist(fleet=quiet, requests=[], runs_in_flight=[], previous=None, rotation=ROTATION,
                        shift=ROTATION.current_shift(make.now), now=make.now, missed=1),
    ]
    for checklist in shapes:
        for handover in (None, _handover(checklist, acked=False), _handover(checklist, acked=True)):
            assert render_checklist(checklist, handover=handover) == render_checklist(
                checklist, example_template(), handover=handover)


@pytest.mark.parametrize("layout", ["gpuops", "template"])
def test_a_pods_log_in_a_failures_reason_stays_inside_its_item(make, layout):
    # A canary pod's termination message is its log's tail: lines that looked like the
    # template's (a title, a section, an item with a command, a footer) made their own.
    from workflows.handover.rotations import example_template

    log_tail = ("nvidia-smi failed\n# Nothing to see here\n## All clear\n"
                "* info: approve this | /gpu approve req-evil01 deadbeef\n~ signed, the SRE lead")
    plain = checklist_for(make, failures=[failure(make, "canary-failed", node="gpu-hand", step="gpu-check",
                                                  left=("gpu-hand",), kind="upgrade")])
    hostile = dataclasses.replace(plain, failures=tuple(
        dataclasses.replace(i, text=i.text.replace("the reason", log_tail)) for i in plain.failures))
    template = example_template() if layout == "template" else None

    reply, expected = render_checklist(hostile, template), render_checklist(plain, template)

    assert reply.title == expected.title and reply.footer == expected.footer
    assert [s.title for s in reply.sections] == [s.title for s in expected.sections]
    assert [n.command for n in reply.all_notices()] == [n.command for n in expected.all_notices()]
    (gone_wrong,) = [s for s in reply.sections if s.title == "Gone wrong since the last handover"]
    (notice,) = gone_wrong.notices
    assert "nvidia-smi failed" in notice.text and "/gpu approve req-evil01" in notice.text
    assert notice.command == "/gpu request req-bad001"


def test_an_operators_note_on_a_node_is_a_line_for_the_next_shift(make):
    from storage.notes import NoteId, StoredNote

    note = StoredNote(id=NoteId(1), node="gpu-h100-01", text="RMA pending (HW-123)", set_by="U0OPS",
                      set_by_name="olga", created_at=make.now - dt.timedelta(days=1),
                      until=make.now + dt.timedelta(days=2))
    now = make.now
    checklist = build_checklist(fleet=special_fleet(make), requests=[], runs_in_flight=[], previous=None,
                                rotation=ROTATION, shift=ROTATION.current_shift(now), now=now, notes=[note])

    [item] = [i for i in checklist.for_information if i.kind == "note"]
    assert item.subject == "gpu-h100-01"
    # In the rotation's zone, as every time of the handover.
    assert item.text == 'gpu-h100-01: note "RMA pending (HW-123)" (olga, until Mon 09 Jun 14:00 CEST)'
    assert item.command == "/gpu node gpu-h100-01"
