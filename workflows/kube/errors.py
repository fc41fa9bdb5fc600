"""The API server's answers as a small typed exception tree: callers write
`except Conflict:` instead of comparing status numbers. Every gateway call raises one
of these."""

from __future__ import annotations

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
