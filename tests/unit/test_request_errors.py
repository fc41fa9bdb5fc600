"""What the request service's refusals carry besides their sentence: the refusal's code
(the same for a person's missing role, which is also an access denial), and the id an
unknown request was looked up by with the ids that look like it. And when a request reads
as expired: stored so, or pending at its deadline to the second."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.unit.test_handover_checklist import request_view
from workflows.access import AccessDenied
from workflows.requests import messages as say
from workflows.requests.errors import (ChangedMeanwhile, RequestAccessDenied, RequestRefused, UnknownRequest,
                                       refusal_error)
from workflows.requests.policy import ROLE_REFUSALS, Refusal, RefusalCode

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("code", sorted(ROLE_REFUSALS))
def test_a_refusal_for_who_the_person_is_is_an_access_denial_that_keeps_its_code(code):
    err = refusal_error(Refusal(code, "only an approver of train-a may approve"))
    assert isinstance(err, RequestAccessDenied) and isinstance(err, AccessDenied)
    assert (err.code, err.reason, str(err)) == (code, "only an approver of train-a may approve",
                                                "only an approver of train-a may approve")


@pytest.mark.parametrize("code", sorted(set(RefusalCode) - ROLE_REFUSALS))
def test_any_other_refusal_is_a_plain_refusal_that_keeps_its_code(code):
    err = refusal_error(Refusal(code, "why"))
    assert type(err) is RequestRefused and not isinstance(err, AccessDenied)
    assert (err.code, err.reason) == (code, "why")


def test_a_lost_compare_and_set_says_so_and_carries_its_code():
    err = ChangedMeanwhile("req-7f3a2c")
    assert (err.code, err.reason) == (RefusalCode.CHANGED_MEANWHILE, say.changed_meanwhile("req-7f3a2c"))


def test_an_unknown_request_names_what_was_asked_for_and_what_looks_like_it():
    err = UnknownRequest("req-7f3a2d", closest=["req-7f3a2c", "req-7f3a2e"])
    assert err.code == RefusalCode.UNKNOWN_REQUEST
    assert (err.request_id, err.closest) == ("req-7f3a2d", ("req-7f3a2c", "req-7f3a2e"))
    assert err.reason == say.unknown_request("req-7f3a2d", closest=["req-7f3a2c", "req-7f3a2e"])


@pytest.mark.parametrize("state, expires_at, expired", [
    ("expired", NOW + dt.timedelta(hours=1), True),  # stored expired: whatever its deadline says now
    ("pending", NOW, True),  # at its deadline to the second
    ("pending", NOW + dt.timedelta(seconds=1), False),
    ("approved", NOW - dt.timedelta(hours=1), False),  # decided before its deadline
])
def test_a_request_reads_as_expired_when_stored_so_or_pending_at_its_deadline(state, expires_at, expired):
    assert request_view("req-1", state=state, expires_at=expires_at).is_expired(NOW) is expired
