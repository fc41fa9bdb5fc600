"""Every gpuops button pressed by every kind of person, through the one click path Slack
and the console share (`bot.clicks.press`): each press answers with a notice, never an
exception, and only the people the button is for change anything.

The demo people: alice (operator, and the requester), bob (approver of serving-a), dave
(viewer), erin (admin); a serving-a upgrade needs two approvals.
"""

from __future__ import annotations

import datetime as dt

import pytest

from bot.clicks import Click, ClickOutcome, press
from bot.intents import encode_value
from bot.request_forms import WantedForm
from tests.e2e.harness import submit_upgrade
from workflows.handover.service import HandoverService

UTC = dt.timezone.utc
PEOPLE = ("U0ALICE", "U0BOB", "U0DAVE", "U0ERIN")

# Who a press changes something for; everyone else is refused with a sentence.
ALLOWED = {
    "approve": {"U0BOB", "U0ERIN"},          # approvers and admins, never the requester
    "deny": {"U0BOB", "U0ERIN"},
    "cancel": {"U0ALICE", "U0ERIN"},         # the requester or an admin
    "abort": {"U0ALICE", "U0ERIN"},          # operators of the pool and admins
    "request-drain": {"U0ALICE", "U0ERIN"},  # whoever may drain something
}
# What the refusal says, per button and person (one phrase of the sentence).
REFUSALS = {
    ("approve", "U0ALICE"): "needs the approver role", ("approve", "U0DAVE"): "needs the approver role",
    ("deny", "U0ALICE"): "needs the approver role", ("deny", "U0DAVE"): "needs the approver role",
    ("cancel", "U0BOB"): "requester", ("cancel", "U0DAVE"): "requester",
    ("abort", "U0BOB"): "needs the operator role for pool serving-a",
    ("abort", "U0DAVE"): "needs the operator role for pool serving-a; dave has viewer",
    ("request-drain", "U0BOB"): "operator role", ("request-drain", "U0DAVE"): "operator role",
}


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


def _press(runtime, action: str, value: str | None, who: str, reason: str | None = None) -> ClickOutcome:
    services = runtime.services()
    return press(Click(action=action, value=value, actor=services.config.actor(who), now=now(), reason=reason),
                 services)


def _running_run(runtime) -> str:
    """A serving-a upgrade alice asked for, approved by bob and carol, its run started."""
    services = runtime.services()
    view = submit_upgrade(runtime)
    for approver in ("U0BOB", "U0CAROL"):
        services.requests.approve(services.config.actor(approver), view.id, plan_hash=view.plan_hash, now=now())
    return services.runs.start(view.id, dry_run=False, now=now(), actor=services.config.actor("U0ALICE")).id


@pytest.mark.parametrize("who", PEOPLE)
@pytest.mark.parametrize("action", ["approve", "deny", "cancel"])
def test_a_request_button_changes_the_request_only_for_whom_it_is_meant(runtime, action, who):
    view = submit_upgrade(runtime)
    value = encode_value(view.id, view.plan_hash)

    outcome = _press(runtime, action, value, who, reason="capacity is short" if action == "deny" else None)

    after = runtime.services().requests.get(view.id)
    if who in ALLOWED[action]:
        assert outcome.ok, outcome.notice.summary
        changed = {"approve": (after.approvals_counted, after.state) == (1, "pending"),
                   "deny": after.state == "denied", "cancel": after.state == "cancelled"}
        assert changed[action], after
    else:
        assert not outcome.ok and REFUSALS[(action, who)] in (outcome.notice.summary or ""), outcome.notice
        assert (after.state, after.approvals_counted) == ("pending", 0)
    assert outcome.card is not None  # the request's message shows it as it now is


@pytest.mark.parametrize("who", PEOPLE)
def test_deny_opens_the_reason_form_only_for_someone_who_may_deny_and_refuses_anyone_else_at_the_click(
        runtime, who):
    view = submit_upgrade(runtime)

    outcome = _press(runtime, "deny", encode_value(view.id, view.plan_hash), who)  # no reason yet: the form

    if who in ALLOWED["deny"]:
        assert outcome.ok and outcome.wants_reason == view.id
    else:  # told now, not after typing a reason into a form that would be refused
        assert not outcome.ok and outcome.wants_reason is None
        assert REFUSALS[("deny", who)] in (outcome.notice.summary or ""), outcome.notice
    assert runtime.services().requests.get(view.id).state == "pending"


@pytest.mark.parametrize("who", PEOPLE)
def test_abort_stops_the_run_only_for_an_operator_of_its_pool_or_an_admin_and_refuses_anyone_else(runtime, who):
    run_id = _running_run(runtime)

    outcome = _press(runtime, "abort", encode_value(run_id), who)

    state = runtime.services().runs.get(run_id).state
    if who in ALLOWED["abort"]:
        assert outcome.ok and state == "aborted", outcome.notice.summary
    else:
        assert not outcome.ok and state == "pending"
        assert REFUSALS[("abort", who)] in (outcome.notice.summary or ""), outcome.notice


@pytest.mark.parametrize("who", PEOPLE)
def test_request_a_drain_opens_the_form_only_for_someone_who_may_drain(runtime, who):
    outcome = _press(runtime, "request-drain", "serving-a", who)

    if who in ALLOWED["request-drain"]:
        assert outcome.ok and outcome.wants_form == WantedForm("drain", "serving-a")
    else:
        assert not outcome.ok and outcome.wants_form is None
        assert REFUSALS[("request-drain", who)] in (outcome.notice.summary or ""), outcome.notice


@pytest.mark.parametrize("who", PEOPLE)
def test_anyone_may_press_acknowledge_and_only_the_incoming_shift_counts(runtime, small_fleet, who):
    services = runtime.services()
    rotation = services.config.rotations[0]
    shift = rotation.incoming_shift(rotation.next_shift_change(now() - dt.timedelta(days=1)))
    handovers = HandoverService(services.database, services.config)
    posted = handovers.post(rotation, shift.start, handovers.checklist(rotation, shift, fleet=small_fleet, now=now()),
                            late=False, now=now())

    outcome = _press(runtime, "handover-ack", encode_value(str(posted.id)), who)

    assert outcome.ok, outcome.notice.summary
    members = next(s.members for s in rotation.shifts if s.name == posted.shift)
    assert (HandoverService(services.database, services.config).get(posted.id).acked_by == who) == (who in members)


@pytest.mark.parametrize("action", ["approve", "deny", "cancel", "abort", "handover-ack"])
def test_a_button_for_something_that_does_not_exist_is_refused_for_everyone(runtime, action):
    for who in PEOPLE:
        outcome = _press(runtime, action, encode_value("req-000000" if action != "handover-ack" else "999999"), who,
                         reason="x")
        assert not outcome.ok, (action, who, outcome.notice)
