"""The two-person rule as plain functions: who may submit, approve, deny and cancel, and
the one sentence each refusal says. Requests and decisions here are plain rows."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from storage.approvals import Approval
from storage.ids import ApprovalId, RequestId
from storage.requests import Request
from workflows.access import Actor, Role, UserId
from workflows.config import GpuopsConfig
from workflows.pools.config import PoolConfig
from workflows.requests.policy import (
    RefusalCode,
    approvals_required,
    check_approval,
    check_cancel,
    check_deny,
    check_replan,
    check_submit,
    counted_approvers,
    deny_decision,
    is_expired,
    matches_current_plan,
    state_at_creation,
)

UTC = dt.timezone.utc
NOW = dt.datetime(2025, 6, 7, 12, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
PLAN = "3f9a1c0e" + "a" * 56
OLD_PLAN = "77be01d2" + "b" * 56

CONFIG = GpuopsConfig.model_validate({
    "pools": {
        "serving-a": {"kind": "serving", "approvers": ["U0PAM"]},
        "serving-b": {"kind": "serving"},
        "train-a": {"kind": "training", "request_ttl": "12h"},
    },
    "access": {
        "users": {
            "U0ADA": ["operator", "approver"],
            "U0BOB": ["approver"],
            "U0CAROL": ["approver"],
            "U0DAN": ["admin"],
            "U0EVE": ["viewer"],
            "U0OTTO": ["operator"],
        },
        "names": {"U0BOB": "Bob"},
    },
})
ada, bob, carol, dan, eve, otto, pam = (
    CONFIG.actor(u, name=n) for u, n in [
        ("U0ADA", "Ada"), ("U0BOB", "Bob"), ("U0CAROL", "Carol"), ("U0DAN", "Dan"),
        ("U0EVE", "Eve"), ("U0OTTO", "Otto"), ("U0PAM", "Pam")])
SERVING = CONFIG.pools["serving-a"]


def request(**changes) -> Request:
    row = Request(
        id=RequestId("req-7f3a2c"), kind="upgrade", pool="serving-a", targets=["gpu-01"],
        window_start=None, window_end=None, reason="Xid 79 fix", requester="U0ADA",
        requester_name="Ada", state="pending", plan={}, plan_hash=PLAN, approvals_required=2,
        expires_at=NOW + 24 * HOUR, created_at=NOW, updated_at=NOW, channel=None,
        thread_ts=None,
    )
    return dataclasses.replace(row, **changes)


def decision(approver: str, *, plan_hash: str = PLAN, kind: str = "approve",
             reason: str | None = None) -> Approval:
    return Approval(id=ApprovalId(1), request_id=RequestId("req-7f3a2c"), approver=approver,
                    decision=kind, plan_hash=plan_hash, reason=reason, created_at=NOW)  # type: ignore[arg-type]


def approver_now(user_id: str) -> bool:
    return CONFIG.actor(user_id).has(Role.APPROVER, pool="serving-a")


def approve(approver, *, req: Request | None = None, so_far=(), plan_hash: str = PLAN,
            pool: PoolConfig | None = SERVING, now: dt.datetime = NOW, still_approver=approver_now):
    return check_approval(request=req or request(), approvals_so_far=list(so_far),
                          approver=approver, plan_hash=plan_hash, pool_policy=pool, now=now,
                          approver_now=still_approver, names=CONFIG.access.names)


# ------------------------------------------------------------------ how many approvals


@pytest.mark.parametrize(
    "pool, kind, needed",
    [("serving-a", "upgrade", 2), ("serving-a", "mig", 2), ("serving-a", "drain", 1),
     ("train-a", "upgrade", 1), ("train-a", "drain", 0)],
)
def test_pools_need_the_approvals_their_kind_asks_for(pool, kind, needed):
    assert CONFIG.pools[pool].approvals_required(kind) == needed


def test_a_request_needing_no_approval_is_approved_as_it_is_created():
    assert state_at_creation(0) == "approved"
    assert state_at_creation(1) == "pending"


def test_tightening_the_pool_policy_applies_to_requests_already_waiting():
    stricter = PoolConfig(kind="serving", approvals={"drain": 3})
    looser = PoolConfig(kind="serving", approvals={"drain": 0})
    drain = request(kind="drain", approvals_required=1)
    assert approvals_required(drain, stricter) == 3
    assert approvals_required(drain, looser) == 1


# ------------------------------------------------------------------ approvals that count


def test_an_approvers_approval_counts_and_leaves_one_to_go_on_a_serving_upgrade():
    decision_ = approve(bob)
    assert decision_.counted and not decision_.fully_approved
    assert (decision_.approvals_counted, decision_.approvals_required) == (1, 2)


def test_a_second_distinct_approver_completes_a_serving_upgrade():
    decision_ = approve(carol, so_far=[decision("U0BOB")])
    assert decision_.fully_approved
    assert decision_.approvals_counted == 2


def test_one_approval_completes_a_serving_drain():
    assert approve(bob, req=request(kind="drain", approvals_required=1)).fully_approved


def test_an_admin_counts_as_an_approver():
    assert approve(dan).counted


def test_the_short_hash_people_were_shown_is_enough_to_approve():
    assert approve(bob, plan_hash=PLAN[:8] + "…").counted
    assert approve(bob, plan_hash=PLAN[:12]).counted


def test_a_prefix_shorter_than_the_short_hash_is_not_enough():
    assert approve(bob, plan_hash=PLAN[:5]).refusal.code is RefusalCode.STALE_PLAN


# ------------------------------------------------------------------ approvals refused


def test_the_requester_cannot_approve_their_own_request_even_holding_the_approver_role():
    refusal = approve(ada).refusal
    assert refusal.code is RefusalCode.OWN_REQUEST
    assert refusal.reason == (
        "You requested req-7f3a2c yourself; someone else has to approve it (two-person rule).")


def test_an_admin_cannot_approve_their_own_request_either():
    assert approve(dan, req=request(requester="U0DAN")).refusal.code is RefusalCode.OWN_REQUEST


def test_approving_twice_is_refused_and_says_how_many_more_are_needed():
    refusal = approve(bob, so_far=[decision("U0BOB")]).refusal
    assert refusal.code is RefusalCode.ALREADY_APPROVED
    assert "You already approved req-7f3a2c (plan 3f9a1c0e…)" in refusal.reason
    assert "it needs 1 more approval from someone else" in refusal.reason


@pytest.mark.parametrize("who, held", [("eve", "viewer"), ("otto", "operator, viewer")])
def test_someone_without_the_approver_role_cannot_approve(who, held):
    refusal = approve({"eve": eve, "otto": otto}[who]).refusal
    assert refusal.code is RefusalCode.NOT_AN_APPROVER
    assert refusal.reason == (
        f"You cannot approve req-7f3a2c: that needs the approver role for pool serving-a "
        f"(you have {held}).")


def test_a_pool_approver_may_approve_on_their_pool_only():
    assert pam.has(Role.APPROVER, pool="serving-a") and not pam.has(Role.APPROVER)
    assert approve(pam).counted
    other = approve(pam, req=request(pool="serving-b"), pool=CONFIG.pools["serving-b"])
    assert other.refusal.code is RefusalCode.NOT_AN_APPROVER
    assert "approver role for pool serving-b" in other.refusal.reason


def test_approving_a_plan_that_is_no_longer_current_is_refused_with_the_new_hash():
    refusal = approve(bob, plan_hash=OLD_PLAN).refusal
    assert refusal.code is RefusalCode.STALE_PLAN
    assert refusal.reason.startswith(
        "The plan changed since you looked; approvals were reset — review the new plan "
        "(hash 3f9a1c0e…)")


def test_approvals_of_an_earlier_plan_do_not_count_toward_the_current_one():
    so_far = [decision("U0BOB", plan_hash=OLD_PLAN), decision("U0CAROL", plan_hash=OLD_PLAN)]
    assert counted_approvers(request(), so_far, approver_now=approver_now) == ()
    decision_ = approve(bob, so_far=so_far)
    assert decision_.counted and decision_.approvals_counted == 1


def test_an_earlier_approver_who_lost_the_role_no_longer_counts_when_approvals_are_counted():
    so_far = [decision("U0BOB")]
    bob_left = approve(carol, so_far=so_far, still_approver=lambda user_id: user_id != "U0BOB")

    assert bob_left.counted and bob_left.approvals_counted == 1 and not bob_left.fully_approved
    assert approve(carol, so_far=so_far).fully_approved  # with bob still an approver


def test_an_approval_row_from_the_requester_never_counts_even_if_storage_held_one():
    # Ada requested and holds the approver role; a database from before storage refused
    # such rows may still hold her approval. With it, Bob's approval is still the first.
    so_far = [decision("U0ADA"), decision("U0BOB"), decision("U0BOB")]
    assert counted_approvers(request(), so_far, approver_now=lambda _user: True) == ("U0BOB",)
    with_carol = approve(carol, so_far=so_far)
    assert with_carol.fully_approved and with_carol.approvals_counted == 2
    assert not approve(carol, so_far=[decision("U0ADA")]).fully_approved


def test_the_approvers_are_counted_in_the_order_they_approved_and_denies_do_not_count():
    so_far = [decision("U0CAROL"), decision("U0PAM", kind="deny", reason="no"), decision("U0BOB")]
    assert counted_approvers(request(), so_far, approver_now=lambda _user: True) == ("U0CAROL", "U0BOB")


def test_approving_after_the_deadline_is_refused_and_says_when_it_expired():
    late = approve(bob, now=NOW + 25 * HOUR).refusal
    assert late.code is RefusalCode.EXPIRED
    assert late.reason == (
        "req-7f3a2c expired at 2025-06-08 12:00 UTC before it had enough approvals; "
        "ask the requester to submit it again.")


def test_a_request_is_expired_at_its_deadline_exactly():
    assert not is_expired(request(), now=NOW + 24 * HOUR - dt.timedelta(microseconds=1))
    assert is_expired(request(), now=NOW + 24 * HOUR)
    assert not is_expired(request(state="approved"), now=NOW + 48 * HOUR)


def test_a_denied_request_refuses_approvals_naming_who_denied_it_and_why():
    denied = request(state="denied")
    refusal = approve(carol, req=denied,
                      so_far=[decision("U0BOB", kind="deny", reason="capacity is short")]).refusal
    assert refusal.code is RefusalCode.NOT_PENDING
    assert refusal.reason == (
        "req-7f3a2c was denied by Bob (capacity is short); it can no longer be approved.")


def test_an_approved_request_needs_no_more_approvals():
    refusal = approve(carol, req=request(state="approved")).refusal
    assert refusal.reason == "req-7f3a2c is already approved; it can no longer be approved."


def test_a_request_on_a_pool_removed_from_the_configuration_cannot_be_approved():
    refusal = approve(bob, pool=None).refusal
    assert refusal.code is RefusalCode.UNKNOWN_POOL
    assert "no longer in the configuration" in refusal.reason


# ------------------------------------------------------------------ deny


def deny(who, *, req: Request | None = None, reason: str = "capacity is short",
         now: dt.datetime = NOW):
    return check_deny(request=req or request(), approvals_so_far=[], approver=who,
                      reason=reason, now=now)


def test_an_approver_may_deny_a_pending_request():
    assert deny(bob).allowed


def test_an_approver_who_approved_may_still_change_their_mind_and_deny():
    verdict = check_deny(request=request(), approvals_so_far=[decision("U0BOB")], approver=bob,
                         reason="saw a page", now=NOW)
    assert verdict.allowed


def test_someone_without_the_approver_role_cannot_deny():
    refusal = deny(otto).refusal
    assert refusal.code is RefusalCode.NOT_AN_APPROVER
    assert refusal.reason.startswith("You cannot deny req-7f3a2c")


def test_the_requester_is_told_to_cancel_rather_than_deny():
    assert deny(ada).refusal.reason == (
        "You requested req-7f3a2c yourself; cancel it instead of denying it.")


def test_a_deny_needs_a_reason():
    assert deny(bob, reason="  ").refusal.reason == (
        "Say why you deny req-7f3a2c; the requester reads your reason.")


def test_an_approved_request_cannot_be_denied_but_can_still_be_cancelled():
    assert deny(bob, req=request(state="approved")).refusal.reason == (
        "req-7f3a2c is already approved; the requester or an admin can still cancel it.")


# ------------------------------------------------------------------ cancel and re-plan


@pytest.mark.parametrize("state", ["pending", "approved", "scheduled"])
def test_the_requester_may_cancel_before_the_run_starts(state):
    assert check_cancel(request=request(state=state), actor=ada, now=NOW).allowed


def test_an_admin_may_cancel_someone_elses_request():
    assert check_cancel(request=request(state="approved"), actor=dan, now=NOW).allowed


def test_an_approver_cannot_cancel_someone_elses_request():
    refusal = check_cancel(request=request(), actor=bob, now=NOW).refusal
    assert refusal.code is RefusalCode.NOT_REQUESTER_OR_ADMIN
    # Ada is not named in the configuration: a mention, never the name stored from Slack.
    assert refusal.reason == "Only the requester (<@U0ADA>) or an admin can cancel req-7f3a2c."


def test_a_running_request_needs_an_abort_not_a_cancel():
    refusal = check_cancel(request=request(state="running"), actor=ada, now=NOW).refusal
    assert refusal.code is RefusalCode.RUNNING
    assert "abort the run instead" in refusal.reason


@pytest.mark.parametrize("state, phrase", [("done", "is done"), ("cancelled", "was cancelled"),
                                           ("expired", "expired")])
def test_a_finished_request_has_nothing_left_to_cancel(state, phrase):
    refusal = check_cancel(request=request(state=state), actor=ada, now=NOW).refusal
    assert refusal.reason == f"req-7f3a2c {phrase}; there is nothing left to cancel."


def test_a_pending_request_past_its_deadline_counts_as_expired_for_cancel():
    refusal = check_cancel(request=request(), actor=ada, now=NOW + 30 * HOUR).refusal
    assert refusal.reason == "req-7f3a2c expired; there is nothing left to cancel."


def test_only_the_requester_or_an_admin_may_change_the_plan_of_a_pending_request():
    assert check_replan(request=request(), actor=ada, now=NOW).allowed
    assert check_replan(request=request(), actor=dan, now=NOW).allowed
    assert check_replan(request=request(), actor=otto, now=NOW).refusal.reason == (
        "Only the requester (<@U0ADA>) or an admin can change the plan of req-7f3a2c.")
    assert check_replan(request=request(state="approved"), actor=ada, now=NOW).refusal.reason == (
        "req-7f3a2c is already approved; to change the plan, cancel it and submit a new request.")


# ------------------------------------------------------------------ submit


def submit(who, *, pool: str = "serving-a", reason: str = "Xid 79 fix"):
    return check_submit(actor=who, kind="upgrade", pool=pool, reason=reason, pools=CONFIG.pools)


def test_an_operator_may_request_a_change():
    assert submit(ada).allowed


def test_a_viewer_or_approver_cannot_request_a_change():
    assert submit(eve).refusal.reason == (
        "Requesting a driver upgrade on pool serving-a needs the operator role for serving-a; "
        "Eve has viewer.")
    assert submit(bob).refusal.code is RefusalCode.NOT_AN_OPERATOR


def test_an_unknown_pool_is_refused_with_the_closest_name():
    reason = submit(ada, pool="serving-c").refusal.reason
    assert reason.startswith("There is no pool named serving-c; did you mean serving-")
    assert "serving-a" in reason and "serving-b" in reason
    assert submit(ada, pool="zzz").refusal.reason == (
        "There is no pool named zzz; the configured pools are serving-a, serving-b, train-a.")


def test_a_request_needs_a_reason():
    assert submit(ada, reason=" ").refusal.code is RefusalCode.NO_REASON


# ------------------------------------------------------------------ roles held for one pool, and the exact sentences


def pool_actor(pool: str, *roles: Role) -> Actor:
    return Actor(user_id=UserId("U0PAT"), name="Pat", pool_roles={pool: frozenset(roles)})


def test_a_refused_approval_still_says_where_the_count_stands():
    for refused in (approve(eve, so_far=[decision("U0BOB")]),                       # no role
                    approve(bob, so_far=[decision("U0BOB")]),                       # twice
                    approve(carol, so_far=[decision("U0BOB")], now=NOW + 25 * HOUR)):  # too late
        assert not refused.counted
        assert (refused.approvals_counted, refused.approvals_required) == (1, 2)


def test_an_approval_is_counted_against_the_pools_stricter_number_now():
    stricter = PoolConfig(kind="serving", approvers=["U0PAM"], approvals={"upgrade": 3})
    second = approve(carol, so_far=[decision("U0BOB")], pool=stricter)
    assert (second.counted, second.fully_approved, second.approvals_required) == (True, False, 3)


def test_the_sentences_of_approval_refusals_name_the_request_the_pool_and_the_plan():
    assert approve(bob, pool=None).refusal.reason == (
        "Pool serving-a of req-7f3a2c is no longer in the configuration, so nobody can approve it; "
        "cancel it or restore the pool.")
    assert approve(bob, plan_hash=OLD_PLAN).refusal.reason.endswith("(hash 3f9a1c0e…) of req-7f3a2c and approve that one.")
    # Operator for this pool only: that is what the refusal says Pat holds.
    assert approve(pool_actor("serving-a", Role.OPERATOR)).refusal.reason == (
        "You cannot approve req-7f3a2c: that needs the approver role for pool serving-a "
        "(you have operator, viewer).")


def test_approving_again_once_nothing_more_is_needed_says_so():
    one = request(kind="drain", approvals_required=1)
    refusal = approve(bob, req=one, so_far=[decision("U0BOB")], pool=CONFIG.pools["train-a"]).refusal
    assert refusal.code is RefusalCode.ALREADY_APPROVED
    assert refusal.reason.endswith("it needs no more approvals.")


def test_a_request_marked_expired_is_expired_whatever_its_deadline():
    assert is_expired(request(state="expired"), now=NOW)
    assert approve(bob, req=request(state="expired")).refusal.code is RefusalCode.EXPIRED


def test_a_hash_with_anything_after_it_is_not_the_plan_shown():
    assert approve(bob, plan_hash="3f9a1c0e…").counted
    assert approve(bob, plan_hash="3f9a1c0eX").refusal.code is RefusalCode.STALE_PLAN
    assert not matches_current_plan(request(), PLAN + "X")


def test_someone_the_configuration_does_not_name_is_named_by_a_mention_of_their_user_id():
    denied = request(state="denied")
    so_far = [decision("U0ZED", kind="deny", reason="no capacity")]
    assert approve(carol, req=denied, so_far=so_far).refusal.reason.startswith(
        "req-7f3a2c was denied by <@U0ZED> (no capacity)")


def test_the_deny_that_ended_a_request_is_the_last_one_and_there_is_none_without_a_deny():
    assert deny_decision([decision("U0BOB"), decision("U0CAROL")]) is None
    last = decision("U0CAROL", kind="deny", reason="later")
    assert deny_decision([decision("U0BOB", kind="deny", reason="first"), last]) == last


def test_cancelling_a_denied_request_says_who_denied_it_and_why():
    so_far = [decision("U0BOB"), decision("U0BOB", kind="deny", reason="capacity is short")]
    refusal = check_cancel(request=request(state="denied"), actor=ada, now=NOW, approvals_so_far=so_far,
                           names=CONFIG.access.names).refusal
    assert refusal.code is RefusalCode.FINISHED
    assert refusal.reason == "req-7f3a2c was denied by Bob (capacity is short); there is nothing left to cancel."
    assert check_cancel(request=request(state="running"), actor=ada, now=NOW).refusal.reason.startswith(
        "req-7f3a2c is already running")


def test_an_approver_of_one_pool_may_deny_there_and_nowhere_else():
    pam_serving_b = request(pool="serving-b")
    assert check_deny(request=request(), approvals_so_far=[], approver=pam, reason="no", now=NOW).allowed
    refusal = check_deny(request=pam_serving_b, approvals_so_far=[], approver=pam, reason="no", now=NOW).refusal
    assert refusal.code is RefusalCode.NOT_AN_APPROVER
    assert refusal.reason == ("You cannot deny req-7f3a2c: that needs the approver role for pool serving-b "
                              "(you have no role).")
    as_operator = check_deny(request=request(), approvals_so_far=[], approver=pool_actor("serving-a", Role.OPERATOR),
                             reason="no", now=NOW).refusal
    assert as_operator.reason.endswith("(you have operator, viewer).")


def test_deny_refusals_carry_their_codes_and_name_who_denied_first():
    assert deny(ada).refusal.code is RefusalCode.OWN_REQUEST
    assert deny(bob, reason=" ").refusal.code is RefusalCode.NO_REASON
    again = check_deny(request=request(state="denied"), approver=carol, reason="me too", now=NOW,
                       approvals_so_far=[decision("U0BOB", kind="deny", reason="capacity is short")],
                       names=CONFIG.access.names).refusal
    assert again.reason.startswith("req-7f3a2c was denied by Bob (capacity is short)")


def test_replanning_a_denied_request_names_who_denied_it():
    refusal = check_replan(request=request(state="denied"), actor=ada, now=NOW, names=CONFIG.access.names,
                           approvals_so_far=[decision("U0BOB", kind="deny", reason="capacity is short")]).refusal
    assert refusal.reason.startswith("req-7f3a2c was denied by Bob (capacity is short)")


def test_an_operator_of_one_pool_may_request_changes_there_only():
    assert submit(pool_actor("serving-a", Role.OPERATOR)).allowed
    refusal = submit(pool_actor("serving-b", Role.OPERATOR)).refusal
    assert refusal.code is RefusalCode.NOT_AN_OPERATOR and refusal.reason.endswith("Pat has no role.")
    assert submit(pool_actor("serving-a", Role.APPROVER)).refusal.reason.endswith("Pat has approver, viewer.")


def test_an_unknown_pool_offers_at_most_two_close_names_and_a_missing_reason_names_the_change():
    pools = {name: CONFIG.pools["serving-a"] for name in ("serving-a", "serving-b", "serving-c")}
    unknown = check_submit(actor=ada, kind="upgrade", pool="serving-x", reason="r", pools=pools).refusal
    assert unknown.code is RefusalCode.UNKNOWN_POOL
    # Equally close names come in a fixed order (difflib's: the larger string first).
    assert unknown.reason == "There is no pool named serving-x; did you mean serving-c or serving-b?"
    assert submit(ada, reason=" ").refusal.reason == (
        "Say why you request a driver upgrade on pool serving-a; approvers read the reason before they approve.")
