"""What the bot did to the test cluster, from the API server's own audit log
(`ControlPlane.audit_log`: every write the bot's identity sent, with its body and the
answer's code). The bot's log says what it meant to send; this says what the server took,
which is what "no side effect twice" is about: a process killed between its log line and
its call, or a call whose answer a fault proxy dropped, is judged by what arrived."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Engine bookkeeping, not a side effect on the fleet.
_BOOKKEEPING = {"leases", "selfsubjectaccessreviews"}


@dataclass(frozen=True)
class Write:
    """One write the server took (2xx) from the bot: `what` as the gateway names it
    ("cordon", "uncordon", "annotate", "label", "restore", "evict", "create", "delete",
    "patch"), the resource, and the object (namespace/name, or name)."""

    what: str
    resource: str
    target: str

    def __str__(self) -> str:
        return f"{self.what} {self.resource} {self.target}"


class AuditLog:
    """The audit log read from a mark on: `mark()` now, `writes(since=mark)` later."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def events(self, *, since: int = 0) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as log:
            log.seek(since)
            data = log.read()
        # A line still being written has no newline yet: it belongs to the next read.
        complete = data[: data.rfind(b"\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def writes(self, *, since: int = 0) -> list[Write]:
        """The bot's writes the server took, in order, leaving out dry runs and the Lease."""
        found = []
        for event in self.events(since=since):
            code = (event.get("responseStatus") or {}).get("code", 0)
            ref = event.get("objectRef") or {}
            if not 200 <= code < 300 or ref.get("resource") in _BOOKKEEPING or "dryRun=" in event.get("requestURI", ""):
                continue
            target = "/".join(p for p in (ref.get("namespace"), ref.get("name")) if p)
            found.append(Write(_what(event, ref), ref.get("resource", "?"), target))
        return found

    def counts(self, *, since: int = 0) -> Counter[str]:
        return Counter(str(w) for w in self.writes(since=since))


def _what(event: dict[str, Any], ref: dict[str, Any]) -> str:
    verb = event.get("verb", "?")
    if ref.get("subresource") == "eviction":
        return "evict"
    if ref.get("resource") != "nodes" or verb != "patch":
        return verb
    body = event.get("requestObject") or {}
    unschedulable = (body.get("spec") or {}).get("unschedulable", "absent")
    if unschedulable is True:
        return "cordon"
    if unschedulable in (False, None):
        return "uncordon"
    if "taints" in (body.get("spec") or {}):
        return "restore"
    if (body.get("metadata") or {}).get("labels"):
        return "label"
    return "annotate"
