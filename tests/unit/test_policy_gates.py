"""The two-person rule's gates, in the words and order people meet them (beyond test_policy.py).

Pinned here:
- the deadline gate comes before every question of who is acting: past its deadline a
  pending request is refused as expired to everyone, the requester included, and the
  sentence writes the deadline in the zone the caller reads times in;
- who may cancel or re-plan names the requester: the name the configuration gives, else a
  mention of a Slack user id, else (a requester from the command line, not a Slack user)
  the name stored with the request;
- a running drain's pending extension is approved by the same rules on the extension's
  hash; once its deadline has come the refusal says the extension lapsed (both window
  ends, in the caller's zone) and still says how many approvals counted of how many;
- a request with no pending extension cannot be read as one, and the error names it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from storage.requests import PendingExtension, Request
from tests.unit.test_policy import (
    CONFIG,
    HOUR,
    NOW,
    PLAN,
    SERVING,
    ada,
    approver_now,
    bob,
    carol,
    dan,
    decision,
    otto,
    request,
)
from workflows.requests.policy import (
    RefusalCode,
    as_extension,
    check_approval,
    check_cancel,
    check_deny,
    check_extension_approval,
    check_replan,
)

BERLIN = ZoneInfo("Europe/Berlin")  # CEST in June: two hours ahead of UTC
LATE = NOW + 25 * HOUR  # the request's deadline (NOW + 24h) has passed
EXTENSION_PLAN = "c0ffee12" + "d" * 56


# ------------------------------------------------------------------ the deadline gate comes first


def test_approving_after_the_deadline_writes_the_deadline_in_the_zone_times_are_read_in():
    late = check_approval(request=request(), approvals_so_far=[], approver=bob, plan_hash=PLAN,
                          pool_policy=SERVING, now=LATE, approver_now=approver_now, zone=BERLIN)
    assert late.refusal.code is RefusalCode.EXPIRED
    assert late.refusal.reason == (
        "req-7f3a2c expired at 2025-06-08 14:00 CEST before it had enough approvals; "
        "ask the requester to submit it again.")


@pytest.mark.parametrize("action", ["approve", "deny", "replan"])
def test_past_its_deadline_everyone_the_requester_included_hears_that_the_request_expired(action):
    # On time Ada would hear "own request" (approve, deny) and Otto "only the requester"
    # (replan); the deadline gate answers first, in Berlin time.
    if action == "approve":
        refusal = check_approval(request=request(), approvals_so_far=[], approver=ada, plan_hash=PLAN,
                                 pool_policy=SERVING, now=LATE, approver_now=approver_now, zone=BERLIN).refusal
    elif action == "deny":
        refusal = check_deny(request=request(), approvals_so_far=[], approver=ada, reason="no",
                             now=LATE, zone=BERLIN).refusal
    else:
        refusal = check_replan(request=request(), actor=otto, now=LATE, zone=BERLIN).refusal
    assert refusal.code is RefusalCode.EXPIRED
    assert refusal.reason.startswith("req-7f3a2c expired at 2025-06-08 14:00 CEST ")


# ------------------------------------------------------------------ naming the requester


def from_the_command_line(**changes) -> Request:
    # "alice" is not a Slack user id: no mention can name her, so her stored name does.
    return request(requester="alice", requester_name="Alice Liddell", **changes)


def test_only_the_requester_may_cancel_and_a_command_line_requester_is_named_by_their_stored_name():
    refusal = check_cancel(request=from_the_command_line(), actor=bob, now=NOW,
                           names=CONFIG.access.names).refusal
    assert refusal.code is RefusalCode.NOT_REQUESTER_OR_ADMIN
    assert refusal.reason == "Only the requester (Alice Liddell) or an admin can cancel req-7f3a2c."


def test_only_the_requester_may_replan_and_a_command_line_requester_is_named_by_their_stored_name():
    refusal = check_replan(request=from_the_command_line(), actor=otto, now=NOW,
                           names=CONFIG.access.names).refusal
    assert refusal.code is RefusalCode.NOT_REQUESTER_OR_ADMIN
    assert refusal.reason == "Only the requester (Alice Liddell) or an admin can change the plan of req-7f3a2c."


def test_the_name_the_configuration_gives_wins_over_the_name_stored_from_slack():
    # Bob's Slack display name was "Robert" when he asked; the configuration calls him Bob.
    bobs = request(requester="U0BOB", requester_name="Robert")
    assert check_cancel(request=bobs, actor=carol, now=NOW, names=CONFIG.access.names).refusal.reason == (
        "Only the requester (Bob) or an admin can cancel req-7f3a2c.")
    assert check_replan(request=bobs, actor=carol, now=NOW, names=CONFIG.access.names).refusal.reason == (
        "Only the requester (Bob) or an admin can change the plan of req-7f3a2c.")


# ------------------------------------------------------------------ a running drain's extension


def extending_drain(**changes) -> Request:
    """A running drain holding its nodes to 16:00 UTC, asked at noon to hold them to 20:00;
    the extension waits for approvals until the drain's window ends."""
    row = request(
        kind="drain", state="running", approvals_required=2, window_start=NOW, window_end=NOW + 4 * HOUR,
        extension=PendingExtension(window_end=NOW + 8 * HOUR, plan={}, plan_hash=EXTENSION_PLAN,
                                   asked_by="U0ADA", asked_at=NOW, expires_at=NOW + 4 * HOUR),
    )
    return dataclasses.replace(row, **changes)


def approve_extension(approver, *, so_far=(), plan_hash: str = EXTENSION_PLAN, now: dt.datetime = NOW):
    return check_extension_approval(request=extending_drain(), approvals_so_far=list(so_far), approver=approver,
                                    plan_hash=plan_hash, pool_policy=SERVING, now=now,
                                    approver_now=approver_now, names=CONFIG.access.names, zone=BERLIN)


def test_an_extension_is_approved_on_its_own_hash_by_distinct_approvers():
    # Bob approved the drain itself earlier: that approval does not count for the extension.
    so_far = [decision("U0BOB", plan_hash=PLAN), decision("U0CAROL", plan_hash=EXTENSION_PLAN)]
    first = approve_extension(bob, so_far=so_far)
    assert (first.counted, first.fully_approved) == (True, True)
    assert (first.approvals_counted, first.approvals_required) == (2, 2)
    stale = approve_extension(dan, plan_hash=PLAN)
    assert stale.refusal.code is RefusalCode.STALE_PLAN
    assert "(hash c0ffee12…)" in stale.refusal.reason


def test_an_extension_approved_after_its_deadline_has_lapsed_and_says_where_the_count_stood():
    lapsed = approve_extension(carol, so_far=[decision("U0BOB", plan_hash=EXTENSION_PLAN)], now=NOW + 5 * HOUR)
    assert lapsed.refusal.code is RefusalCode.EXPIRED
    assert lapsed.refusal.reason == (
        "The extension of req-7f3a2c to 2025-06-07 22:00:00 CEST lapsed: it was not approved before its drain "
        "window ended (2025-06-07 18:00:00 CEST), so the window ended then.")
    assert not lapsed.counted
    assert (lapsed.approvals_counted, lapsed.approvals_required) == (1, 2)


def test_a_request_with_no_pending_extension_cannot_be_read_as_one():
    with pytest.raises(ValueError) as raised:
        as_extension(extending_drain(extension=None))
    assert str(raised.value) == "req-7f3a2c has no extension waiting for approval"
