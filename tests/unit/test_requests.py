"""Requests through `RequestService` on a real SQLite file: what the requester, the
approvers and the request's thread see at each step, what the audit log records, and
that racing approvals never count twice."""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from freezegun import freeze_time

from storage import audit, codec, outbox
from storage import requests as stored_requests
from storage.database import Database, open_database
from storage.ids import RequestId
from workflows.access import AccessDenied, Actor, Role
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunService
from workflows.kube.objects import NodeName
from workflows.plans import NodeStep, Plan, PlanSummary, Wave, plan_hash, short_hash
from workflows.requests.policy import RefusalCode
from workflows.requests.errors import RequestAccessDenied, RequestRefused, UnknownRequest
from workflows.requests.service import RequestService
from workflows.requests.views import RequestView

UTC = dt.timezone.utc
START = dt.datetime(2025, 6, 7, 12, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
CHANNEL = "C0GPUOPS"

CONFIG_DATA = {
    "pools": {
        "serving-a": {"kind": "serving", "approvers": ["U0PAM"], "request_ttl": "24h"},
        "serving-b": {"kind": "serving"},
        "train-a": {"kind": "training"},
    },
    "access": {
        "users": {
            "U0ADA": ["operator"],
            "U0BOB": ["approver"],
            "U0CAROL": ["approver"],
            "U0DAN": ["admin"],
            "U0EVE": ["viewer"],
            "U0OTTO": ["operator"],
        },
        "names": {"U0ADA": "Ada", "U0BOB": "Bob", "U0CAROL": "Carol", "U0DAN": "Dan", "U0EVE": "Eve",
                  "U0OTTO": "Otto", "U0PAM": "Pam"},
    },
}
CONFIG = GpuopsConfig.model_validate(CONFIG_DATA)
ada, bob, carol, dan, eve, otto, pam = (
    CONFIG.actor(u, name=n) for u, n in [
        ("U0ADA", "Ada"), ("U0BOB", "Bob"), ("U0CAROL", "Carol"), ("U0DAN", "Dan"),
        ("U0EVE", "Eve"), ("U0OTTO", "Otto"), ("U0PAM", "Pam")])


def a_plan(kind: str = "upgrade", *, pool: str = "serving-a", created_for: str = "U0ADA",
           version: str = "580.95.05", nodes: tuple[str, ...] = ("gpu-01", "gpu-02")) -> Plan:
    change = {"upgrade": ("driver", {"version": version}), "mig": ("mig", {"config": "all-1g.10gb"}),
              "drain": ("hold", {})}[kind]
    waves = tuple(
        Wave(index, (NodeName(node),), tuple(
            NodeStep(k, NodeName(node), p)  # type: ignore[arg-type]
            for k, p in (("cordon", {}), ("drain", {"timeout_s": 600}), change, ("uncordon", {}))))
        for index, node in enumerate(nodes)
    )
    return Plan(kind=kind, pool=pool, waves=waves,  # type: ignore[arg-type]
                summary=PlanSummary(target_driver_version=version if kind == "upgrade" else None,
                                    evictions_expected=4, max_gpus_unavailable=8),
                created_for=created_for)


@pytest.fixture
def service(db: Database) -> RequestService:
    return RequestService(db, CONFIG)


class Clock:
    """The wall clock, frozen by freezegun; tests move it on."""

    def __init__(self, frozen) -> None:
        self._frozen = frozen

    def now(self) -> dt.datetime:
        return dt.datetime.now(UTC)

    def advance(self, by: dt.timedelta) -> None:
        self._frozen.tick(by)


@pytest.fixture
def clock() -> Iterator[Clock]:
    with freeze_time(START) as frozen:
        yield Clock(frozen)


def submit(service: RequestService, actor: Actor = ada, *, kind: str = "upgrade",
           pool: str = "serving-a", plan: Plan | None = None, now: dt.datetime = START,
           channel: str | None = CHANNEL) -> RequestView:
    return service.submit(
        actor, kind=kind, pool=pool, targets=["gpu-01", "gpu-02"],  # type: ignore[arg-type]
        plan=plan or a_plan(kind, pool=pool, created_for=actor.user_id),
        window_start=START + 14 * HOUR, window_end=START + 16 * HOUR,
        reason="driver 580.95.05 fixes Xid 79", channel=channel, now=now)


def thread(db: Database) -> list[str]:
    """What the request threads will read, in order."""
    return [codec.json_from_text(r["payload"])["text"]
            for r in db.query("SELECT payload FROM outbox ORDER BY id")]


def audit_story(db: Database, request_id: str) -> list[tuple[str, str, object, object]]:
    return [(e.action, e.actor, e.before, e.after)
            for e in audit.for_request(db, RequestId(request_id))]


# ------------------------------------------------------------------ submitting


def test_a_serving_upgrade_waits_for_two_approvals_until_its_deadline(service, db):
    view = submit(service)
    assert view.state == "pending"
    assert (view.approvals_required, view.approvals_counted, view.approvals_missing) == (2, 0, 2)
    assert view.expires_at == START + 24 * HOUR
    assert view.plan == a_plan() and view.plan_hash == plan_hash(a_plan())
    assert view.summary.target_driver_version == "580.95.05"
    assert audit_story(db, view.id) == [("request.created", "U0ADA", None, "pending")]
    assert thread(db) == [
        f"{view.id}: Ada requested a driver upgrade on pool serving-a (2 nodes in 2 waves, "
        f"plan {view.short_hash}…): driver 580.95.05 fixes Xid 79. It needs 2 approvals by "
        "2025-06-08 12:00 UTC."]


def test_a_drain_of_a_training_pool_is_approved_as_it_is_submitted(service, db):
    view = submit(service, kind="drain", pool="train-a")
    assert view.state == "approved"
    assert view.approvals_required == 0
    assert audit_story(db, view.id) == [("request.created", "U0ADA", None, "pending"),
                                        ("request.approved", "gpuops", "pending", "approved")]
    assert thread(db)[0].endswith("Pool policy needs no approval, so it is approved.")


def test_a_request_without_a_channel_queues_no_message(service, db):
    submit(service, channel=None)
    assert thread(db) == []


def test_a_viewer_cannot_submit_and_nothing_is_stored(service, db):
    with pytest.raises(RequestAccessDenied) as refused:
        submit(service, eve)
    assert isinstance(refused.value, AccessDenied)
    assert "needs the operator role for serving-a; Eve has viewer" in str(refused.value)
    assert service.open_requests() == []


def test_a_plan_whose_dcgm_diagnostics_outgrow_its_window_is_refused_and_nothing_is_stored(service, db):
    from workflows.plans import PreflightNote

    plan = a_plan()
    note = PreflightNote(check="duration", code="diag-outgrows-window", severity="critical",
                         sentence="The run takes at most 3h; its DCGM diagnostics make it outgrow the window")
    refused_plan = Plan(kind=plan.kind, pool=plan.pool, waves=plan.waves, summary=plan.summary.with_preflight(note),
                        created_for=plan.created_for)
    with pytest.raises(RequestRefused) as refused:
        submit(service, plan=refused_plan)
    assert refused.value.code == RefusalCode.DIAG_OUTGROWS_WINDOW
    assert refused.value.reason == note.sentence
    assert service.open_requests() == []
    # A plan whose run only warns that it outgrows its window is still a request.
    warned = PreflightNote(check="duration", code="outgrows-window", severity="warning", sentence="too long")
    submit(service, plan=Plan(kind=plan.kind, pool=plan.pool, waves=plan.waves,
                              summary=plan.summary.with_preflight(warned), created_for=plan.created_for))


def test_a_plan_built_for_another_pool_is_a_programming_error(service):
    with pytest.raises(ValueError, match="cannot back a upgrade request on pool serving-a"):
        submit(service, plan=a_plan(pool="serving-b"))


# ------------------------------------------------------------------ approving


def test_two_distinct_approvers_approve_a_serving_upgrade(service, db):
    view = submit(service)
    after_bob = service.approve(bob, view.id, plan_hash=view.plan_hash, now=START + HOUR)
    assert (after_bob.state, after_bob.approvals_counted) == ("pending", 1)
    after_carol = service.approve(carol, view.id, plan_hash=view.short_hash, now=START + 2 * HOUR)
    assert (after_carol.state, after_carol.approvals_counted) == ("approved", 2)
    assert after_carol.approvers == ("U0BOB", "U0CAROL")
    assert thread(db)[1:] == [f"Bob approved {view.id} (1 of 2).",
                              f"Carol approved {view.id} (2 of 2): it is approved."]
    assert audit_story(db, view.id)[1:] == [
        ("request.approval", "U0BOB", "pending", "pending"),
        ("request.approved", "U0CAROL", "pending", "approved")]


def test_one_approval_is_enough_for_a_serving_drain(service):
    view = submit(service, kind="drain")
    assert view.approvals_required == 1
    assert service.approve(bob, view.id, plan_hash=view.plan_hash, now=START).state == "approved"


def test_the_requester_cannot_approve_their_own_request(service, db):
    ada_the_admin = CONFIG.actor("U0DAN", name="Dan")
    view = submit(service, ada_the_admin)
    with pytest.raises(RequestRefused, match="yourself; someone else has to approve it"):
        service.approve(ada_the_admin, view.id, plan_hash=view.plan_hash, now=START)
    assert service.get(view.id).approvals_counted == 0
    assert len(audit.for_request(db, view.id)) == 1


def test_approving_twice_counts_once(service):
    view = submit(service)
    service.approve(bob, view.id, plan_hash=view.plan_hash, now=START)
    with pytest.raises(RequestRefused) as refused:
        service.approve(bob, view.id, plan_hash=view.plan_hash, now=START + HOUR)
    assert refused.value.code is RefusalCode.ALREADY_APPROVED
    assert "needs 1 more approval from someone else" in str(refused.value)
    assert service.get(view.id).approvals_counted == 1


def test_someone_without_the_approver_role_cannot_approve(service):
    view = submit(service)
    with pytest.raises(RequestAccessDenied, match="needs the approver role for pool serving-a "
                                                  r"\(you have operator, viewer\)"):
        service.approve(otto, view.id, plan_hash=view.plan_hash, now=START)
    assert service.get(view.id).approvals_counted == 0


def test_a_pool_approver_approves_on_their_pool_and_nowhere_else(service):
    on_theirs = submit(service)
    elsewhere = submit(service, pool="serving-b")
    assert service.approve(pam, on_theirs.id, plan_hash=on_theirs.plan_hash,
                           now=START).approvals_counted == 1
    with pytest.raises(RequestAccessDenied, match="approver role for pool serving-b"):
        service.approve(pam, elsewhere.id, plan_hash=elsewhere.plan_hash, now=START)


def test_an_approval_after_the_deadline_is_refused_and_the_request_expires(service, db, clock):
    view = submit(service, now=clock.now())
    service.approve(bob, view.id, plan_hash=view.plan_hash, now=clock.now())
    clock.advance(25 * HOUR)
    with pytest.raises(RequestRefused) as refused:
        service.approve(carol, view.id, plan_hash=view.plan_hash, now=clock.now())
    assert str(refused.value) == (
        f"{view.id} expired at 2025-06-08 12:00 UTC before it had enough approvals; "
        "ask the requester to submit it again.")
    assert service.get(view.id).state == "expired"
    assert audit_story(db, view.id)[-1] == ("request.expired", "gpuops", "pending", "expired")
    assert thread(db)[-1] == f"{view.id} expired at 2025-06-08 12:00 UTC with 1 of 2 approvals."


def test_a_requests_expiry_is_written_in_the_display_zone_in_its_thread_and_refusals(db, clock):
    # June in Berlin is CEST (UTC+2); a December deadline would read CET.
    berlin = RequestService(db, CONFIG.model_copy(
        update={"display": CONFIG.display.model_copy(update={"timezone": "Europe/Berlin"})}))
    view = submit(berlin, now=clock.now())
    assert thread(db)[-1].endswith("It needs 2 approvals by 2025-06-08 14:00 CEST.")
    clock.advance(25 * HOUR)
    with pytest.raises(RequestRefused, match=f"{view.id} expired at 2025-06-08 14:00 CEST before"):
        berlin.approve(carol, view.id, plan_hash=view.plan_hash, now=clock.now())
    assert thread(db)[-1] == f"{view.id} expired at 2025-06-08 14:00 CEST with 0 of 2 approvals."


def test_the_sweep_expires_only_requests_past_their_deadline(service, clock):
    early = submit(service, now=clock.now())
    clock.advance(2 * HOUR)
    later = submit(service, now=clock.now())
    clock.advance(23 * HOUR)
    assert service.get(early.id).is_expired(clock.now())
    assert [v.id for v in service.expire_due(clock.now())] == [early.id]
    assert service.get(early.id).state == "expired"
    assert service.get(later.id).state == "pending"
    assert service.expire_due(clock.now()) == []


# ------------------------------------------------------------------ re-planning


def test_a_new_plan_resets_approvals_and_the_old_hash_is_refused(service, db):
    view = submit(service)
    service.approve(bob, view.id, plan_hash=view.plan_hash, now=START)
    new_plan = a_plan(version="580.95.06")
    replanned = service.replan(view.id, new_plan, now=START + HOUR, actor=ada)
    assert replanned.plan_hash == plan_hash(new_plan)
    assert (replanned.state, replanned.approvals_counted) == ("pending", 0)
    assert [a.counts for a in replanned.approvals] == [False]
    with pytest.raises(RequestRefused) as refused:
        service.approve(carol, view.id, plan_hash=view.plan_hash, now=START + 2 * HOUR)
    assert str(refused.value).startswith(
        "The plan changed since you looked; approvals were reset — review the new plan "
        f"(hash {short_hash(plan_hash(new_plan))}…)")
    again = service.approve(bob, view.id, plan_hash=replanned.plan_hash, now=START + 2 * HOUR)
    assert again.approvals_counted == 1
    assert audit_story(db, view.id)[2] == ("request.replanned", "U0ADA", "pending", "pending")
    assert "the 1 earlier approval no longer counts" in thread(db)[2]


def test_the_same_plan_again_changes_nothing(service, db):
    view = submit(service)
    assert service.replan(view.id, a_plan(), now=START, actor=ada).plan_hash == view.plan_hash
    assert len(audit.for_request(db, view.id)) == 1


def test_another_operator_cannot_change_the_plan(service):
    view = submit(service)
    with pytest.raises(RequestAccessDenied, match=r"Only the requester \(Ada\) or an admin"):
        service.replan(view.id, a_plan(version="1"), now=START, actor=otto)


# ------------------------------------------------------------------ denying


def test_a_deny_ends_the_request_and_later_approvals_are_refused(service, db):
    view = submit(service)
    denied = service.deny(bob, view.id, reason="serving-a is at its capacity floor", now=START)
    assert denied.state == "denied"
    assert denied.denial is not None and denied.denial.reason == "serving-a is at its capacity floor"
    with pytest.raises(RequestRefused) as refused:
        service.approve(carol, view.id, plan_hash=view.plan_hash, now=START + HOUR)
    assert str(refused.value) == (
        f"{view.id} was denied by Bob (serving-a is at its capacity floor); "
        "it can no longer be approved.")
    assert audit_story(db, view.id)[-1] == ("request.denied", "U0BOB", "pending", "denied")
    assert audit.for_request(db, RequestId(view.id))[-1].detail == {
        "plan_hash": view.plan_hash, "reason": "serving-a is at its capacity floor"}
    assert thread(db)[-1] == f"Bob denied {view.id}: serving-a is at its capacity floor"
    # The card turns denied; Bob (who denied) is mentioned with the requester; once only.
    told = db.query("SELECT dedupe_key, payload FROM outbox ORDER BY id")[-1]
    payload = codec.json_from_text(told["payload"])
    assert (payload["event"], payload["state"], payload["people"]) == ("request.denied", "denied",
                                                                     sorted({"U0ADA", "U0BOB"}))
    assert told["dedupe_key"] == f"{view.id}/denied"


def test_a_second_deny_and_a_deny_click_on_a_denied_request_name_who_denied_it_and_why(service):
    """Two approvers deny at once: the second is told who was first and why, both when the
    deny is sent and when the Deny button is pressed (before the reason form)."""
    view = submit(service)
    service.deny(bob, view.id, reason="serving-a is at its capacity floor", now=START)
    said = f"{view.id} was denied by Bob (serving-a is at its capacity floor)"

    with pytest.raises(RequestRefused, match=re.escape(said)):
        service.deny(carol, view.id, reason="also no", now=START + HOUR)
    with pytest.raises(RequestRefused, match=re.escape(said)):
        service.check_may_deny(carol, view.id, now=START + HOUR)
    assert [a.approver for a in service.get(view.id).approvals] == ["U0BOB"]


def test_a_deny_after_the_deadline_is_refused_naming_the_deadline_in_the_display_zone(db):
    berlin = RequestService(db, GpuopsConfig.model_validate({**CONFIG_DATA, "display": {"timezone": "Europe/Berlin"}}))
    view = submit(berlin)  # serving-a: 24 h to approve, so until 2025-06-08 12:00 UTC, 14:00 in Berlin
    late = START + 25 * HOUR

    for refused_by in (lambda: berlin.deny(bob, view.id, reason="too late anyway", now=late),
                       lambda: berlin.check_may_deny(bob, view.id, now=late)):
        with pytest.raises(RequestRefused, match=re.escape(f"{view.id} expired at 2025-06-08 14:00")):
            refused_by()


def test_an_approver_who_approved_can_change_their_mind_and_deny(service):
    view = submit(service)
    service.approve(bob, view.id, plan_hash=view.plan_hash, now=START)
    denied = service.deny(bob, view.id, reason="saw a page from serving-a", now=START + HOUR)
    assert denied.state == "denied" and denied.approvals_counted == 0
    assert [(a.decision, a.reason) for a in denied.approvals] == [
        ("deny", "saw a page from serving-a")]


def test_a_deny_by_someone_without_the_approver_role_is_refused(service):
    view = submit(service)
    with pytest.raises(RequestAccessDenied, match="You cannot deny"):
        service.deny(otto, view.id, reason="no", now=START)
    assert service.get(view.id).state == "pending"


# ------------------------------------------------------------------ cancelling


def test_the_requester_cancels_a_pending_request(service, db):
    view = submit(service)
    assert service.cancel(ada, view.id, now=START).state == "cancelled"
    assert audit_story(db, view.id)[-1] == ("request.cancelled", "U0ADA", "pending", "cancelled")
    assert thread(db)[-1] == f"Ada cancelled {view.id}."


def test_an_admin_cancels_an_approved_request(service, db):
    view = submit(service, kind="drain", pool="train-a")
    assert service.cancel(dan, view.id, now=START).state == "cancelled"
    assert audit_story(db, view.id)[-1] == ("request.cancelled", "U0DAN", "approved", "cancelled")


def test_someone_else_cannot_cancel(service):
    view = submit(service)
    with pytest.raises(RequestAccessDenied, match=r"Only the requester \(Ada\) or an admin can cancel"):
        service.cancel(bob, view.id, now=START)


def test_a_running_request_must_be_aborted_not_cancelled(service, db):
    view = submit(service, kind="drain", pool="train-a")
    assert stored_requests.transition(db, id=view.id, expected="approved", new="running", at=START)
    with pytest.raises(RequestRefused, match="abort the run instead"):
        service.cancel(ada, view.id, now=START)


def test_a_cancelled_request_cannot_be_cancelled_again(service):
    view = submit(service)
    service.cancel(ada, view.id, now=START)
    with pytest.raises(RequestRefused, match="was cancelled; there is nothing left to cancel"):
        service.cancel(ada, view.id, now=START)


# ------------------------------------------------------------------ reading


def test_an_unknown_id_suggests_the_closest_ones(service):
    view = submit(service)
    typo = view.id[:-1] + ("0" if view.id[-1] != "0" else "1")
    with pytest.raises(UnknownRequest) as unknown:
        service.get(typo)
    assert str(unknown.value) == f"There is no request {typo}; did you mean {view.id}?"
    with pytest.raises(UnknownRequest, match="^There is no request nonsense.$"):
        service.approve(bob, "nonsense", plan_hash="x", now=START)


def test_waiting_for_lists_what_each_person_could_approve_now(service):
    later = START + HOUR
    other_pool = submit(service, pool="serving-b", now=later)
    upgrade = submit(service)
    service.approve(bob, upgrade.id, plan_hash=upgrade.plan_hash, now=later)
    assert [v.id for v in service.waiting_for(carol, now=later)] == [upgrade.id, other_pool.id]
    assert [v.id for v in service.waiting_for(bob, now=later)] == [other_pool.id]
    assert [v.id for v in service.waiting_for(pam, now=later)] == [upgrade.id]
    assert service.waiting_for(ada, now=later) == []
    assert [v.id for v in service.waiting_for(carol, now=START + 24 * HOUR)] == [other_pool.id]


def test_open_requests_leave_out_finished_ones(service):
    kept = submit(service)
    gone = submit(service, pool="serving-b")
    service.cancel(ada, gone.id, now=START)
    assert [v.id for v in service.open_requests()] == [kept.id]
    assert service.open_requests(pool="serving-b") == []


# ------------------------------------------------------------------ the audit trail


def test_every_transition_is_audited_and_the_chain_verifies(service, db):
    drained = submit(service, kind="drain")
    service.approve(bob, drained.id, plan_hash=drained.plan_hash, now=START)
    upgrade = submit(service)
    service.approve(pam, upgrade.id, plan_hash=upgrade.plan_hash, now=START)
    service.replan(upgrade.id, a_plan(version="580.95.06"), now=START, actor=ada)
    service.deny(carol, upgrade.id, reason="wait for the next release", now=START)
    late = submit(service, pool="serving-b")
    service.expire_due(START + 48 * HOUR)
    rows = audit.recent(db, 100)
    assert [r.action for r in reversed(rows)] == [
        "request.created", "request.approved",
        "request.created", "request.approval", "request.replanned", "request.denied",
        "request.created", "request.expired"]
    assert {r.target for r in rows} == {"serving-a", "serving-b"}
    assert all(r.k8s_identity is None for r in rows)
    assert audit.for_request(db, late.id)[-1].detail["approvals_counted"] == 0
    assert audit.verify(db).ok


# ------------------------------------------------------------------ racing


def race(db_path: Path, *actions: Callable[[RequestService], RequestView]) -> list[object]:
    """Run each action in its own thread, on its own connection, all at once."""
    barrier = threading.Barrier(len(actions))
    results: list[object] = [None] * len(actions)

    def work(index: int) -> None:
        database = open_database(db_path)
        try:
            service = RequestService(database, CONFIG)
            barrier.wait()
            results[index] = actions[index](service)
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            results[index] = err
        finally:
            database.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(actions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


@pytest.mark.parametrize("round_", range(8))
def test_two_approvals_racing_for_the_last_place_count_once(service, db, db_path, round_):
    view = submit(service)
    service.approve(pam, view.id, plan_hash=view.plan_hash, now=START)
    results = race(db_path,
                   lambda s: s.approve(bob, view.id, plan_hash=view.plan_hash, now=START),
                   lambda s: s.approve(carol, view.id, plan_hash=view.plan_hash, now=START))
    won = [r for r in results if isinstance(r, RequestView)]
    lost = [r for r in results if isinstance(r, RequestRefused)]
    assert len(won) == 1 and len(lost) == 1, results
    assert won[0].state == "approved" and won[0].approvals_counted == 2
    assert str(lost[0]) == f"{view.id} is already approved; it can no longer be approved."
    final = service.get(view.id)
    assert (final.state, final.approvals_counted, len(final.approvals)) == ("approved", 2, 2)
    assert audit.verify(db).ok


@pytest.mark.parametrize("round_", range(5))
def test_the_same_approver_clicking_twice_at_once_counts_once(service, db_path, round_):
    view = submit(service)
    results = race(db_path,
                   lambda s: s.approve(bob, view.id, plan_hash=view.plan_hash, now=START),
                   lambda s: s.approve(bob, view.id, plan_hash=view.plan_hash, now=START))
    assert sorted(type(r).__name__ for r in results) == ["RequestRefused", "RequestView"], results
    assert service.get(view.id).approvals_counted == 1


@pytest.mark.parametrize("round_", range(8))
def test_an_approval_racing_a_deny_leaves_one_consistent_outcome(service, db, db_path, round_):
    view = submit(service, kind="drain")
    results = race(db_path,
                   lambda s: s.approve(bob, view.id, plan_hash=view.plan_hash, now=START),
                   lambda s: s.deny(carol, view.id, reason="capacity", now=START))
    won = [r for r in results if isinstance(r, RequestView)]
    lost = [r for r in results if isinstance(r, RequestRefused)]
    assert len(won) == 1 and len(lost) == 1, results
    final = service.get(view.id)
    assert final.state == won[0].state
    if final.state == "approved":
        assert "is already approved" in str(lost[0])
    else:
        assert final.state == "denied"
        assert "was denied by Carol (capacity)" in str(lost[0])
    assert [e.after for e in audit.for_request(db, view.id)] == ["pending", final.state]
    assert audit.verify(db).ok


def test_thread_messages_name_an_unconfigured_person_by_a_mention_not_the_name_slack_gave(db, service):
    # Otto's actor carries the name Slack showed ("Otto"), which its owner can edit; the
    # configuration does not name him here.
    unnamed = CONFIG.model_copy(update={"access": CONFIG.access.model_copy(update={"names": {}})})
    requests = RequestService(db, unnamed)
    request = requests.submit(otto, kind="drain", pool="train-a", targets=["gpu-01"],
                              plan=a_plan("drain", pool="train-a", created_for="U0OTTO"), window_start=None,
                              window_end=None, reason="kernel", channel=CHANNEL, now=START)
    runs = RunService(db, names=unnamed.access.names)
    run = runs.start(request.id, dry_run=True, now=START, actor=otto)
    runs.pause(otto, run.id, now=START)

    payloads = [outbox.get(db, id=row["id"]).payload for row in db.query("SELECT id FROM outbox ORDER BY id")]
    texts = [p["text"] for p in payloads]
    assert texts[0].startswith(f"{request.id}: <@U0OTTO> requested a drain")
    assert f"<@U0OTTO> paused {run.id}: steps in flight finish, nothing new starts" in texts
    assert not any("Otto" in t for t in texts)
    assert payloads[0]["people"] == ["U0OTTO"] and payloads[-1]["people"] == ["U0OTTO"]


def test_an_approval_is_on_record_with_its_count_and_told_to_the_thread(service, db):
    view = submit(service)
    service.approve(bob, view.id, plan_hash=view.short_hash, now=START + HOUR)

    (row,) = [e for e in audit.for_request(db, view.id) if e.action == "request.approval"]
    assert (row.actor, row.before, row.after, row.at) == ("U0BOB", "pending", "pending", START + HOUR)
    assert row.detail == {"plan_hash": view.plan_hash, "approvals_counted": 1, "approvals_required": 2}
    (message,) = [m for m in db.query("SELECT * FROM outbox ORDER BY id") if '"request.approval"' in m["payload"]]
    assert message["dedupe_key"] == f"{view.id}/approval/U0BOB/{view.plan_hash}"
    payload = codec.json_from_text(message["payload"])
    assert (payload["event"], payload["state"]) == ("request.approval", "pending")


def test_an_approval_that_loses_to_a_row_already_stored_says_the_request_changed(service, db):
    view = submit(service)
    # A decision by bob on this plan that policy does not count (as a racing write could leave).
    db.execute("INSERT INTO approvals (request_id, approver, decision, plan_hash, reason, created_at) "
               "VALUES (?, 'U0BOB', 'deny', ?, 'x', ?)", (view.id, view.plan_hash, codec.time_to_text(START)))

    with pytest.raises(RequestRefused) as refused:
        service.approve(bob, view.id, plan_hash=view.plan_hash, now=START + HOUR)

    assert str(refused.value) == f"{view.id} changed while you were acting on it; look at it again and retry."
    assert service.get(view.id).state == "pending"


def test_a_request_reads_back_when_and_where_it_was_made_and_who_approved_it_when(service, db):
    access = CONFIG.access.model_copy(update={"users": {**CONFIG.access.users, "U0ZED": (Role.APPROVER,)}})
    unnamed = CONFIG.model_copy(update={"access": access})
    made = submit(service)
    approver = unnamed.actor("U0ZED")
    later = START + HOUR
    RequestService(db, unnamed).approve(approver, made.id, plan_hash=made.plan_hash, now=later)

    view = service.get(made.id)

    assert (view.created_at, view.channel) == (START, CHANNEL)
    assert view.thread_ts is None  # no thread posted yet
    (approval,) = view.approvals
    # Someone the configuration does not name is named by a mention of their Slack id, never nothing.
    assert (approval.approver_name, approval.at) == ("<@U0ZED>", later)


def test_a_pool_that_asks_for_more_approvals_after_a_request_was_made_counts_for_it(db):
    made = submit(RequestService(db, CONFIG), kind="drain")
    assert made.approvals_required == 1
    serving = CONFIG.pools["serving-a"].model_copy(update={"approvals": {"drain": 2}})
    stricter = CONFIG.model_copy(update={"pools": {**CONFIG.pools, "serving-a": serving}})

    assert RequestService(db, stricter).get(made.id).approvals_required == 2
