"""Withdrawing, re-planning and missing a request (workflows.requests.submitting), as the
audit log, the request's thread and the person acting see it:

- a cancel is audited with the plan it withdrew, and its thread hears it once, mentioning
  whoever cancelled it beside the requester;
- cancelling or re-planning a denied request is refused naming who denied it and why;
- a re-plan is audited with the old and the new plan's hash and the approvals it voided,
  and its thread hears it once per new plan, mentioning whoever re-planned it;
- a re-plan after the deadline is refused naming the deadline in the display zone;
- a new plan that names the request's own window replaces the old one;
- an approved or scheduled request whose window passed is `missed`: gpuops audits it with
  the window and the plan, and its thread hears it once, with times in the display zone.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from storage import audit, codec
from storage import requests as stored_requests
from storage.database import Database
from storage.ids import RequestId
from test_requests import CONFIG_DATA, HOUR, START, a_plan, ada, bob, dan, service, submit  # noqa: F401
from workflows.config import GpuopsConfig
from workflows.plans import plan_hash, short_hash
from workflows.requests.errors import RequestRefused
from workflows.requests.service import RequestService

# June in Berlin is CEST (UTC+2): a time written in UTC instead reads two hours earlier.
BERLIN = GpuopsConfig.model_validate({**CONFIG_DATA, "display": {"timezone": "Europe/Berlin"}})


def last_audit(db: Database, request_id: str) -> audit.AuditEntry:
    return audit.for_request(db, RequestId(request_id))[-1]


def last_told(db: Database) -> tuple[str, dict]:
    """The newest message queued for a request thread: its dedupe key and its payload."""
    row = db.query("SELECT dedupe_key, payload FROM outbox ORDER BY id")[-1]
    return row["dedupe_key"], codec.json_from_text(row["payload"])


# ------------------------------------------------------------------ cancelling


def test_an_admins_cancel_is_audited_with_its_plan_and_told_once_naming_the_admin(service, db):  # noqa: F811
    view = submit(service)

    assert service.cancel(dan, view.id, now=START + HOUR).state == "cancelled"

    row = last_audit(db, view.id)
    assert (row.actor, row.action, row.before, row.after) == ("U0DAN", "request.cancelled", "pending", "cancelled")
    assert row.detail == {"plan_hash": view.plan_hash}
    dedupe, payload = last_told(db)
    assert dedupe == f"{view.id}/cancelled"
    assert (payload["event"], payload["state"], payload["request_id"]) == ("request.cancelled", "cancelled", view.id)
    assert payload["text"] == f"Dan cancelled {view.id}."
    assert payload["people"] == ["U0ADA", "U0DAN"]


def test_cancelling_a_denied_request_is_refused_naming_who_denied_it_and_why(service):  # noqa: F811
    view = submit(service)
    service.deny(bob, view.id, reason="serving-a is at its capacity floor", now=START)

    with pytest.raises(RequestRefused) as refused:
        service.cancel(ada, view.id, now=START + HOUR)

    assert str(refused.value) == (f"{view.id} was denied by Bob (serving-a is at its capacity floor); "
                                  "there is nothing left to cancel.")


# ------------------------------------------------------------------ re-planning


def test_an_admins_replan_is_audited_with_both_hashes_and_told_once_per_plan(service, db):  # noqa: F811
    view = submit(service)
    service.approve(bob, view.id, plan_hash=view.plan_hash, now=START)
    new_plan = a_plan(version="580.95.06")
    digest = plan_hash(new_plan)

    assert service.replan(view.id, new_plan, now=START + HOUR, actor=dan).plan_hash == digest

    row = last_audit(db, view.id)
    assert (row.actor, row.action, row.before, row.after) == ("U0DAN", "request.replanned", "pending", "pending")
    assert row.detail == {"old_plan_hash": view.plan_hash, "new_plan_hash": digest, "approvals_voided": 1}
    dedupe, payload = last_told(db)
    assert dedupe == f"{view.id}/replanned/{digest}"
    assert (payload["event"], payload["state"], payload["request_id"]) == ("request.replanned", "pending", view.id)
    assert payload["text"] == (f"Dan changed the plan of {view.id} (now {short_hash(digest)}…); the 1 earlier "
                               "approval no longer counts — approvers, please review the new plan.")
    assert payload["people"] == ["U0ADA", "U0DAN"]


def test_replanning_a_denied_request_is_refused_naming_who_denied_it_and_why(service):  # noqa: F811
    view = submit(service)
    service.deny(bob, view.id, reason="serving-a is at its capacity floor", now=START)

    with pytest.raises(RequestRefused) as refused:
        service.replan(view.id, a_plan(version="580.95.06"), now=START + HOUR, actor=ada)

    assert str(refused.value) == (f"{view.id} was denied by Bob (serving-a is at its capacity floor); "
                                  "it can no longer be replanned.")


def test_replanning_after_the_deadline_is_refused_naming_the_deadline_in_the_display_zone(db):
    berlin = RequestService(db, BERLIN)
    view = submit(berlin)  # serving-a: 24 h to approve, until 2025-06-08 12:00 UTC, 14:00 in Berlin

    with pytest.raises(RequestRefused) as refused:
        berlin.replan(view.id, a_plan(version="580.95.06"), now=START + 25 * HOUR, actor=ada)

    assert str(refused.value) == (f"{view.id} expired at 2025-06-08 14:00 CEST before it had enough approvals; "
                                  "ask the requester to submit it again.")
    assert berlin.get(view.id).state == "expired"


def test_a_new_plan_that_names_the_requests_own_window_replaces_the_old_one(service):  # noqa: F811
    view = submit(service)  # its window: 2025-06-08 02:00 - 04:00 UTC
    plan = a_plan(version="580.95.06")
    windowed = dataclasses.replace(plan, summary=dataclasses.replace(
        plan.summary, window_start=view.window_start, window_end=view.window_end))

    replanned = service.replan(view.id, windowed, now=START + HOUR, actor=ada)

    assert replanned.plan_hash == plan_hash(windowed)
    assert (replanned.summary.window_start, replanned.summary.window_end) == (view.window_start, view.window_end)


# ------------------------------------------------------------------ a missed window


@pytest.mark.parametrize("state", ["approved", "scheduled"])
def test_a_request_whose_window_passed_is_missed_audited_by_gpuops_and_told_in_the_display_zone(db, state):
    berlin = RequestService(db, BERLIN)
    view = submit(berlin, kind="drain", pool="train-a")  # approved at once; window 02:00 - 04:00 UTC
    if state == "scheduled":
        assert stored_requests.transition(db, id=RequestId(view.id), expected="approved", new="scheduled", at=START)
    late = START + 17 * HOUR  # 2025-06-08 05:00 UTC

    assert berlin.mark_missed(view.id, now=late).state == "missed"

    row = last_audit(db, view.id)
    assert (row.actor, row.action, row.before, row.after, row.at) == (
        "gpuops", "request.missed", state, "missed", late)
    assert row.detail == {"window_start": "2025-06-08T02:00:00.000000Z",
                          "window_end": "2025-06-08T04:00:00.000000Z", "plan_hash": view.plan_hash}
    dedupe, payload = last_told(db)
    assert dedupe == f"{view.id}/missed"
    assert (payload["event"], payload["state"], payload["request_id"]) == ("request.missed", "missed", view.id)
    assert payload["text"] == (
        f"Ada, {view.id} was not started: its window (2025-06-08 04:00 CEST - 2025-06-08 06:00 CEST) had "
        "passed or begun too long ago when gpuops could start it (2025-06-08 07:00 CEST). Nothing was drained; "
        "request it again for a later window.")
    assert payload["people"] == ["U0ADA"]


def test_a_pending_request_is_not_marked_missed(service):  # noqa: F811
    view = submit(service)

    with pytest.raises(RequestRefused, match=re.escape(f"{view.id} changed while you were acting on it")):
        service.mark_missed(view.id, now=START + 17 * HOUR)

    assert service.get(view.id).state == "pending"
