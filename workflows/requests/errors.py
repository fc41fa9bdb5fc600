"""What the request service raises: a refusal shown to the user verbatim
(`RequestRefused`), one about who the actor is (`RequestAccessDenied`, also an
`access.AccessDenied`), an id that names no request (`UnknownRequest`, with the closest
ids), and a compare-and-set that lost (`ChangedMeanwhile`)."""

from __future__ import annotations

from collections.abc import Sequence

from workflows.access import AccessDenied
from workflows.requests import messages as say
from workflows.requests import policy
from workflows.requests.policy import Refusal, RefusalCode


class RequestRefused(Exception):
    """The action was refused; `reason` is one sentence to show the user verbatim."""

    def __init__(self, reason: str, *, code: RefusalCode | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class RequestAccessDenied(RequestRefused, AccessDenied):
    """Refused because of who the actor is (a missing role, not the requester)."""


class UnknownRequest(RequestRefused):
    """No request has this id; `closest` are ids that look like it."""

    def __init__(self, request_id: str, *, closest: Sequence[str]) -> None:
        super().__init__(say.unknown_request(request_id, closest=closest),
                         code=RefusalCode.UNKNOWN_REQUEST)
        self.request_id = request_id
        self.closest = tuple(closest)


def refusal_error(refusal: Refusal) -> RequestRefused:
    if refusal.code in policy.ROLE_REFUSALS:
        return RequestAccessDenied(refusal.reason, code=refusal.code)
    return RequestRefused(refusal.reason, code=refusal.code)


class ChangedMeanwhile(RequestRefused):
    def __init__(self, request_id: str) -> None:
        super().__init__(say.changed_meanwhile(request_id), code=RefusalCode.CHANGED_MEANWHILE)
