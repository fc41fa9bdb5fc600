"""The request, run and audit commands through the one dispatcher, on a real SQLite
request service: what approvers, requesters and on-call engineers are told."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from commands.catalog import dispatch
from commands.reply import Reply
from commands.services import Services
from storage import runs as stored_runs
from storage.database import open_database
from workflows.config import GpuopsConfig
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave, short_hash
from workflows.requests.views import RequestView

NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=dt.timezone.utc)
RAW_CONFIG = {
    "pools": {"serving-a": {"kind": "serving"}, "train-a": {"kind": "training"}},
    "access": {
        "users": {"U0ALICE": ["operator"], "U0OTTO": ["operator"], "U0BOB": ["approver"],
                  "U0CAROL": ["approver"], "U0DAVE": ["viewer"], "U0ERIN": ["admin"]},
        "names": {"U0ALICE": "alice", "U0OTTO": "otto", "U0BOB": "bob", "U0CAROL": "carol",
                  "U0DAVE": "dave", "U0ERIN": "erin"},
    },
}
CONFIG = GpuopsConfig.model_validate(RAW_CONFIG)
alice, otto, bob, carol, dave, erin = (CONFIG.actor(u) for u in
                                       ("U0ALICE", "U0OTTO", "U0BOB", "U0CAROL", "U0DAVE", "U0ERIN"))


class NoFleet:
    def fleet(self, now: dt.datetime) -> Fleet:
        raise AssertionError("these commands do not read the fleet")


@pytest.fixture
def services(tmp_path: Path):
    db = open_database(tmp_path / "gpuops.db")
    yield Services.on_database(config=CONFIG, fleet=NoFleet(), database=db)
    db.close()


def _plan(kind: str = "upgrade", pool: str = "serving-a", requester: str = "U0ALICE") -> Plan:
    nodes = ("gpu-01", "gpu-02")
    change = ("driver", {"version": "580.95.05"}) if kind == "upgrade" else ("hold", {})
    return Plan(kind=kind, pool=pool, created_for=requester, summary=PlanSummary(notes=("one node at a time",)),  # type: ignore[arg-type]
                waves=tuple(Wave(i, (NodeName(n),), tuple(NodeStep(k, NodeName(n), p)  # type: ignore[arg-type]
                                                          for k, p in (("cordon", {}), change, ("uncordon", {}))))
                            for i, n in enumerate(nodes)))


def _submit(services: Services, actor=alice, kind: str = "upgrade", pool: str = "serving-a") -> RequestView:
    return services.requests.submit(actor, kind=kind, pool=pool, targets=["gpu-01", "gpu-02"],  # type: ignore[union-attr]
                                    plan=_plan(kind, pool, actor.user_id), window_start=None, window_end=None,
                                    reason="driver 580 for the CUDA 13 rollout", now=NOW)


def run(services: Services, actor, text: str, *, at: dt.datetime = NOW) -> Reply:
    return dispatch(text, actor=actor, services=services, now=at)


def test_two_approvers_approving_the_plan_hash_they_were_shown_approve_the_request(services):
    request = _submit(services)
    first = run(services, bob, f"/gpu approve {request.id} {request.short_hash}")
    assert first.ok and first.title == f"Approved {request.id}"
    assert first.summary == f"pending · 1 of 2 approvals · plan {request.short_hash}"
    second = run(services, carol, f"approve {request.id} {request.plan_hash}")
    assert second.summary == f"approved · 2 of 2 approvals · plan {request.short_hash}"
    decisions = next(s for s in second.sections if s.title == "Decisions")
    assert decisions.bullets == (f"bob approved plan {request.short_hash}", f"carol approved plan {request.short_hash}")


def test_approve_without_a_hash_shows_the_plan_and_the_exact_command_and_counts_nothing(services):
    request = _submit(services)
    reply = run(services, bob, f"approve {request.id}")
    assert reply.ok and reply.title == f"Approve {request.id}?"
    assert reply.summary == (f"Approvals are for one exact plan. Review it below, then run "
                             f"`/gpu approve {request.id} {request.short_hash}` to approve that plan.")
    plan = next(s for s in reply.sections if s.title == f"Plan {request.short_hash}")
    assert plan.table.rows == (("1", "gpu-01", "cordon → driver → uncordon"), ("2", "gpu-02", "cordon → driver → uncordon"))
    assert [i.action for i in reply.intents] == ["approve", "deny"]  # bob may not cancel alice's request
    assert reply.intents[0].value == f"{request.id}/{request.plan_hash}"
    assert services.requests.get(request.id).approvals_counted == 0


def test_an_approval_of_another_plan_hash_is_refused_with_the_current_one(services):
    request = _submit(services)
    reply = run(services, bob, f"approve {request.id} deadbeef")
    assert not reply.ok and reply.title == "Refused"
    assert short_hash(request.plan_hash) in reply.summary


def test_nobody_approves_their_own_request_not_even_an_admin(services):
    request = _submit(services, actor=erin)
    reply = run(services, erin, f"approve {request.id} {request.short_hash}")
    assert not reply.ok
    assert reply.summary == f"You requested {request.id} yourself; someone else has to approve it (two-person rule)."


def test_people_without_the_role_are_told_which_role_a_command_needs(services):
    request = _submit(services)
    approve = run(services, dave, f"approve {request.id} {request.short_hash}")
    assert (approve.ok, approve.title) == (False, "Not allowed")
    assert approve.summary == "`/gpu approve` needs the approver role; dave has viewer."
    cancel = run(services, bob, f"cancel {request.id}")
    assert cancel.summary == "`/gpu cancel` needs the operator role; bob has approver, viewer."


def test_deny_needs_a_reason_and_the_requester_reads_it(services):
    request = _submit(services)
    usage = run(services, bob, f"deny {request.id}")
    assert not usage.ok and usage.title == "Usage: /gpu deny <id> <reason>"
    reply = run(services, bob, f'deny {request.id} "clashes with the launch"')
    assert reply.ok and reply.title == f"Denied {request.id}" and reply.summary.startswith("denied")
    decisions = next(s for s in reply.sections if s.title == "Decisions")
    assert decisions.bullets == (f"bob denied plan {request.short_hash}: clashes with the launch",)


def test_only_the_requester_or_an_admin_cancels_a_request(services):
    request = _submit(services)
    refused = run(services, otto, f"cancel {request.id}")
    assert (refused.ok, refused.title) == (False, "Not allowed")
    assert refused.summary == f"Only the requester (alice) or an admin can cancel {request.id}."
    reply = run(services, alice, f"cancel {request.id}")
    assert reply.ok and reply.title == f"Cancelled {request.id}" and reply.summary.startswith("cancelled")


def test_a_request_shown_to_one_person_offers_only_the_buttons_they_may_press(services):
    request = _submit(services)

    def buttons(actor) -> list[str]:
        return [i.label for i in run(services, actor, f"request {request.id}").intents]

    assert buttons(alice) == ["Cancel request"]  # the requester, who may not approve her own
    assert buttons(bob) == ["Approve", "Deny"]
    assert buttons(dave) == []  # a viewer decides nothing
    assert buttons(otto) == []  # another operator neither approves nor cancels alice's request
    assert buttons(erin) == ["Approve", "Deny", "Cancel request"]
    own = _submit(services, actor=erin)
    assert buttons_of(run(services, erin, f"approve {own.id}")) == ["Cancel request"]


def buttons_of(reply: Reply) -> list[str]:
    return [i.label for i in reply.intents]


def test_the_open_requests_say_how_many_wait_for_you(services):
    first, second = _submit(services), _submit(services, kind="drain", pool="train-a")
    reply = run(services, bob, "requests")
    assert reply.summary == "2 open · 1 waiting for your approval"
    rows = {row[0]: row for row in reply.sections[0].table.rows}
    assert rows[first.id][3:6] == ("pending", "alice", "0/2")
    assert rows[second.id][3] == "approved"  # training drains need no approval
    assert run(services, bob, "requests train-a").summary == "1 open"


def test_an_unknown_request_is_not_found_and_the_closest_ids_are_offered(services):
    request = _submit(services)
    typo = request.id[:-1] + ("0" if request.id[-1] != "0" else "1")
    reply = run(services, dave, f"request {typo}")
    assert (reply.ok, reply.title) == (False, "Not found")
    assert reply.summary == f"There is no request {typo}; did you mean {request.id}?"


def _running(services: Services) -> tuple[RequestView, str]:
    request = _submit(services, kind="drain", pool="train-a")
    view = services.runs.start(request.id, dry_run=False, now=NOW, actor=alice)  # type: ignore[union-attr]
    return request, view.id


def test_an_operator_pauses_resumes_and_aborts_a_run_and_abort_says_nodes_stay_as_they_are(services):
    request, run_id = _running(services)
    paused = run(services, alice, f"pause {run_id}")
    assert paused.ok and paused.title == f"{run_id} paused"
    assert stored_runs.get(services.database, id=run_id).state == "paused"
    assert run(services, alice, f"pause {run_id}").summary == f"{run_id} is paused: it cannot be paused"
    assert run(services, otto, f"resume {run_id}").ok
    aborted = run(services, otto, f"abort {run_id}")
    assert aborted.ok and aborted.summary == (
        f"otto aborted {run_id}: nothing more will be done and nodes are left as they are. "
        "No node is left cordoned by this run.")
    assert services.requests.get(request.id).state == "failed"
    shown = run(services, dave, f"request {request.id}")
    steps = next(s for s in shown.sections if s.title == f"Run {run_id}: aborted")
    # Nothing had started: one line says so, not a "skipped" row per step.
    assert steps.table is None
    assert steps.bullets[-1] == "Not started (2 nodes, waves 1-2): gpu-01, gpu-02"


def test_a_viewer_cannot_abort_a_run_and_an_unknown_run_is_not_found(services):
    _, run_id = _running(services)
    refused = run(services, dave, f"abort {run_id}")
    assert (refused.ok, refused.summary) == (False, "`/gpu abort` needs the operator role; dave has viewer.")
    missing = run(services, alice, "abort run-000000")
    assert (missing.ok, missing.title) == (False, "Not found")


def test_the_audit_log_shows_the_newest_entries_or_one_requests_story(services):
    request = _submit(services)
    run(services, bob, f"approve {request.id} {request.short_hash}")
    newest = run(services, dave, "audit 1")
    assert newest.summary == "1 entry, newest first"
    assert newest.sections[0].table.rows[0][2:5] == ("bob", "request.approval", "serving-a")
    story = run(services, dave, f"audit {request.id}")
    assert [row[3] for row in story.sections[0].table.rows] == ["request.created", "request.approval"]
    assert story.summary == "2 entries, oldest first"
    assert not run(services, dave, "audit 0").ok


def test_request_commands_say_so_where_no_database_is_configured():
    bare = Services(config=CONFIG, fleet=NoFleet())
    reply = dispatch("requests", actor=dave, services=bare, now=NOW)
    assert (reply.ok, reply.summary) == (False, "Requests are not available here: this gpuops has no database configured.")


def test_a_requests_window_is_written_in_the_display_zone_with_its_zone_and_an_open_end_says_what_ends_it(tmp_path):
    config = CONFIG.model_copy(update={"display": CONFIG.display.model_copy(update={"timezone": "Europe/Berlin"})})
    db = open_database(tmp_path / "zoned.db")
    services = Services.on_database(config=config, fleet=NoFleet(), database=db)

    def window(end: dt.datetime | None) -> str:
        view = services.requests.submit(alice, kind="drain", pool="train-a", targets=["gpu-01", "gpu-02"],  # type: ignore[union-attr]
                                        plan=_plan("drain", "train-a"), window_start=NOW + dt.timedelta(hours=1),
                                        window_end=end, reason="rack move", now=NOW)
        reply = run(services, alice, f"request {view.id}")
        return next(f.value for s in reply.sections for f in s.facts if f.label == "Window")

    assert window(NOW + dt.timedelta(hours=3)) == "Sat 2025-06-07 15:00 CEST - Sat 2025-06-07 17:00 CEST"
    assert window(None) == "Sat 2025-06-07 15:00 CEST until `/gpu drain done`"
    db.close()


def test_the_display_zone_is_the_first_rotations_unless_set_else_utc():
    rotation = {"name": "platform", "team": "gpu", "channel": "C0GPU", "timezone": "Europe/Berlin",
                "shifts": [{"name": "day", "starts": "0 8 * * *", "members": ["U0ALICE"]}]}
    assert str(GpuopsConfig.model_validate({}).display_zone) == "UTC"
    assert str(GpuopsConfig.model_validate({"rotations": [rotation]}).display_zone) == "Europe/Berlin"
    assert str(GpuopsConfig.model_validate({"rotations": [rotation], "display": {"timezone": "Asia/Tokyo"}})
               .display_zone) == "Asia/Tokyo"


def test_an_audit_row_of_a_step_names_the_step_and_a_long_what_is_cut(services):
    from storage import audit

    db = services.database
    with db.transaction():
        audit.append(db, actor="gpuops", k8s_identity=None, action="step.running", target="gpu-01", at=NOW,
                     before="pending", after="running", detail={"step": 7, "kind": "evict", "intent": {}})
        audit.append(db, actor="gpuops", k8s_identity=None, action="step.failed", target="gpu-01", at=NOW,
                     before="running", after="failed", detail={"kind": "validate", "reason": "x" * 1000})

    rows = run(services, dave, "audit 2").sections[0].table.rows

    assert rows[1][5] == "evict: pending → running"
    assert rows[0][5].startswith("validate: xxx") and len(rows[0][5]) <= 200 and rows[0][5].endswith("…")


def test_the_open_requests_table_and_the_audit_log_write_times_in_the_display_zone_with_it(tmp_path):
    config = GpuopsConfig.model_validate({**RAW_CONFIG, "display": {"timezone": "Europe/Berlin"}})
    db = open_database(tmp_path / "gpuops.db")
    services = Services.on_database(config=config, fleet=NoFleet(), database=db)
    _submit(services)

    table = next(s.table for s in run(services, bob, "requests").sections if s.table)
    assert table.columns[-1] == "expires" and table.rows[0][-1] == "2025-06-08 14:00 CEST"
    audit = run(services, dave, "audit 1").sections[0].table
    assert audit.columns[1] == "at" and audit.rows[0][1] == "2025-06-07 14:00 CEST"
    db.close()
