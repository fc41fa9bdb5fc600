"""The API server's answers as a small typed exception tree: callers write
`except Conflict:` instead of comparing status numbers. Every gateway call raises one
of these, made from the answer by `error_for_status`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class KubeError(Exception):
    """The API server refused or could not answer; `status` is the HTTP status (0 when
    the server could not be reached); `api_message` the server's own words, without the
    method and path the message starts with (the whole message when it said nothing)."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "", api_message: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.api_message = message if api_message is None else api_message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Forbidden(KubeError):
    pass


class Invalid(KubeError):
    pass


class Gone(KubeError):
    """A watch's resourceVersion is too old (410): list again."""


class WatchError(KubeError):
    """The server ended a watch with an error event other than 410, such as an internal
    error reading etcd's history (a deleted object whose previous state a compaction
    took: "etcd event received with PrevKv=nil"). Resuming from the same version meets
    the same event again, so the caller lists again, as client-go's reflector does."""


class TooManyRequests(KubeError):
    """429. `disruption_budget` says whether a PodDisruptionBudget refused an eviction
    (True), or the API server asked the client to slow down (False: API Priority and
    Fairness, an admission webhook); None when whoever raised it did not say."""

    def __init__(self, message: str, *, retry_after: float | None, disruption_budget: bool | None = None,
                 **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after
        self.disruption_budget = disruption_budget


class Unavailable(KubeError):
    """The API server could not be reached, or answered 5xx, after retries."""


_BY_STATUS: dict[int, type[KubeError]] = {403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone, 422: Invalid}


def error_for_status(status: int, body: bytes | str, *, method: str, path: str,
                     headers: Mapping[str, str]) -> KubeError:
    """The error an answer of `status` (its body a Kubernetes Status, or any text) means."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    message, reason, causes = text, "", set()
    try:
        status_obj = json.loads(text)
        message = status_obj.get("message") or text
        reason = status_obj.get("reason") or ""
        causes = {str(c.get("type")) for c in (status_obj.get("details") or {}).get("causes") or ()}
    except (ValueError, AttributeError, TypeError):
        pass
    where = f"{method} {path}"
    if status == 429:
        # NB: the Eviction API names a refusing budget as a DisruptionBudget cause (and in
        # its message); a 429 without it is the server asking to slow down, not a budget.
        budget = "DisruptionBudget" in causes or "disruption budget" in message.lower()
        return TooManyRequests(f"{where}: {message}", retry_after=_retry_after(headers), status=429, reason=reason,
                               api_message=message, disruption_budget=budget)
    if status >= 500:
        return Unavailable(f"{where}: {message}", status=status, reason=reason)
    return _BY_STATUS.get(status, KubeError)(f"{where}: {message}", status=status, reason=reason,
                                             api_message=message)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After") if headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
