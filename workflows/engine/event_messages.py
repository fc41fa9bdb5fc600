"""What a Kubernetes Event's note says (`kubectl describe node`, `kubectl get events`, event
exporters): what gpuops did, then the run, the request, who approved it and the window.
One sentence per reason (workflows.engine.kube_events decides the reason); nothing here
decides anything."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from workflows import wording

# The API server refuses a note over 1 kB (bytes, UTF-8).
NOTE_LIMIT = 1024

# What was done, by the Event's reason; `{...}` are read from the audited detail.
_WHAT: dict[str, str] = {
    "Cordoned": "Cordoned by gpuops",
    "EvictionStarted": "Evicting the node's pods",
    "PodEvicted": "Evicted a pod (the series counts them)",
    "EvictionBlocked": "A PodDisruptionBudget blocks an eviction; gpuops tries again",
    "PodDeleted": "Deleted a pod its PodDisruptionBudget kept blocking past the timeout",
    "PodsReturned": "Evicted pods came back to the node; evicting them again",
    "Drained": "Drained: {note}",
    "DriverVersionSet": "Driver version set to {to} (was {from})",
    "DriverVersionSetBack": "Driver version set back to {to} after a failed canary",
    "DriverPodRestarted": "Driver pod restarted: {note}",
    "MigLayoutSet": "MIG layout set: {note}",
    "NodeValidated": "Node validated: {note}",
    "GpuCheckPassed": "GPU check passed",
    "GpuCheckFailed": "GPU check failed: {reason}",
    "StepFailed": "The {kind} step failed: {reason}",
    "Uncordoned": "Uncordoned: {note}",
    "HoldEnded": "The hold on the drained node ended: {note}",
    "JobsFinished": "The node's jobs finished: {note}",
    "NodeLeftOut": "Left out of the run: {reason}",
    "NodeRestored": "Labels and taints restored",
    "Halted": "Run halted here: {reason}",
    "GateHeld": "The run waits before this node: {text}",
    "GateReleased": "The change freeze is over; the run goes on",
    "WaveStarted": "Wave {wave} started",
}


class _Blank(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "?"


def event_what(reason: str, *, kind: str | None, detail: Mapping[str, Any]) -> str:
    """The first part of the note: what gpuops did (a step kind with no sentence of its own
    says it in general words)."""
    template = _WHAT.get(reason)
    if template is None:
        return f"The {kind or 'gpuops'} step is done"
    fields = _Blank({k: v for k, v in detail.items() if isinstance(v, (str, int, float))})
    fields.setdefault("kind", kind or "?")
    if "wave" in detail and isinstance(detail["wave"], int):
        fields["wave"] = detail["wave"] + 1  # people count waves from 1
    return template.format_map(fields)


def event_note(what: str, *, run_id: str, request_id: str, request_kind: str, pool: str,
               approvers: Sequence[str], window_start: dt.datetime | None, window_end: dt.datetime | None,
               zone: dt.tzinfo) -> str:
    """The note: what, then the run, the request, who approved it and the window; cut to
    the API's limit (what is cut first: the rest names the change)."""
    approved = f"approved by {wording.names(approvers)}" if approvers else "no approval required"
    if window_end is not None:
        start = wording.when(window_start, zone) if window_start is not None else "approval"
        window = f"window {start} to {wording.when(window_end, zone)}"
    else:
        window = "no window"
    tail = f" Run {run_id} of request {request_id} ({request_kind}, pool {pool}), {approved}, {window}."
    room = NOTE_LIMIT - len(tail.encode())
    head = what.rstrip(".") + "."
    if len(head.encode()) > room:
        head = head.encode()[:max(0, room - 3)].decode(errors="ignore") + "..."
    return (head + tail).encode()[:NOTE_LIMIT].decode(errors="ignore")


def events_refused(error: str) -> str:
    return (f"the API refuses gpuops' Kubernetes Events ({error}); steps go on, Events are not sent "
            "(grant create and patch on events.events.k8s.io)")


def events_unreachable(error: str) -> str:
    return f"the events API does not answer ({error}); steps go on, Events are sent when it does"


def events_flowing() -> str:
    return "Kubernetes Events are sent again"


def person_note(what: str) -> str:
    """The note of what a person did through gpuops outside a run (it names them and the
    run), cut to the API's limit."""
    return (what.rstrip(".") + ".").encode()[:NOTE_LIMIT].decode(errors="ignore")
