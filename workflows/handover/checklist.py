"""The handover checklist as a value: what an incoming shift must know, what it is made
from, and how it is stored.

`building.build_checklist(...)` makes one from the fleet, the open requests, the runs in
flight, the previous handover, the rotation, the incoming shift and `now`; `layout` holds
the Jinja2 templates a rotation may lay it out with.

The checklist is stored as JSON in the handover's content (`checklist_to_json`), so the
posted message can be rendered again when it is acknowledged, and so the next handover
can say what changed: it diffs the stored `finding_keys` (code + subject) against the
fleet's findings now, and carries forward since when a node has been seen cordoned.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias

from storage import codec
from storage.steps import Step
from workflows.fleet.findings import Severity

CHECKLIST_FORMAT = 1
ItemKind: TypeAlias = Literal["freeze", "cluster", "finding", "approval", "run", "cordon", "window", "failure",
                              "note"]


# --------------------------------------------------------------------------------------
# What goes in


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInFlight:
    """An unfinished run with its steps, as the checklist reads it."""

    run_id: str
    request_id: str
    kind: str
    pool: str
    state: str  # pending | running | paused
    dry_run: bool
    halted_reason: str | None
    steps: tuple[Step, ...]

    @property
    def done(self) -> int:
        return sum(s.state in ("done", "skipped") for s in self.steps)

    @property
    def running_steps(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.state == "running")

    @property
    def current_step(self) -> Step | None:
        """The step being worked on: the first running one, else the next pending one."""
        running = self.running_steps
        if running:
            return running[0]
        return next((s for s in self.steps if s.state == "pending"), None)

    def cordoned_at(self, node: str) -> dt.datetime | None:
        """When this run's cordon step for `node` finished, if it did."""
        return next(
            (s.ended_at for s in self.steps if s.node == node and s.kind == "cordon" and s.state == "done"),
            None,
        )


FailureKind: TypeAlias = Literal["halted", "pdb-blocked", "canary-failed", "left-out"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailure:
    """Something that went wrong in a run since the previous handover: the run halted
    (at a step on a node, or before a wave), a PodDisruptionBudget blocked its drain (it
    halted, or left the node out and gave it back), or its canary failed."""

    what: FailureKind
    run_id: str
    request_id: str
    kind: str
    pool: str
    requester_name: str
    at: dt.datetime
    reason: str
    node: str | None = None  # None: the run halted before a wave, on no node
    step: str | None = None
    left_cordoned: tuple[str, ...] = ()  # as the run left them


class Rotation(Protocol):
    """What the checklist reads of a rotation (`rotations.RotationConfig`, which compiles
    its template against this module, so the checklist names only what it reads)."""

    @property
    def name(self) -> str: ...

    @property
    def team(self) -> str: ...

    @property
    def timezone(self) -> str: ...

    @property
    def zone(self) -> zoneinfo.ZoneInfo: ...


class ShiftStint(Protocol):
    """What the checklist reads of the incoming shift's stint (`rotations.ShiftOnDuty`)."""

    @property
    def name(self) -> str: ...

    @property
    def start(self) -> dt.datetime: ...

    @property
    def end(self) -> dt.datetime: ...

    def contains(self, at: dt.datetime) -> bool: ...


class StoredHandover(Protocol):
    """What the checklist reads of the previous handover (storage's or the service's view)."""

    @property
    def shift_start(self) -> dt.datetime: ...

    @property
    def content(self) -> Any: ...


# --------------------------------------------------------------------------------------
# What comes out


@dataclass(frozen=True, slots=True, kw_only=True)
class ChecklistItem:
    kind: ItemKind
    severity: Severity
    subject: str
    text: str
    command: str  # the /gpu command that shows more
    code: str | None = None  # the finding code, for findings


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingKey:
    code: str
    subject: str
    severity: Severity
    command: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CordonSeen:
    """A cordoned node and since when it is known to be cordoned."""

    node: str
    since: dt.datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolDrain:
    pool: str
    text: str
    command: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterFacts:
    operator: str
    cluster_policy: str
    owner: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Changes:
    """Findings that appeared or went away since the previous handover."""

    since: dt.datetime  # the previous handover's shift start
    new: tuple[ChecklistItem, ...]
    resolved: tuple[ChecklistItem, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Checklist:
    rotation: str
    team: str
    shift: str  # the incoming shift
    shift_start: dt.datetime
    shift_end: dt.datetime
    timezone: str
    generated_at: dt.datetime
    late: bool
    missed: int  # earlier shift changes that got no handover (gpuops was down)
    cluster: ClusterFacts
    needs_action: tuple[ChecklistItem, ...]  # most severe first
    in_flight: tuple[ChecklistItem, ...]  # runs being executed or about to start
    coming_up: tuple[ChecklistItem, ...]  # approved windows starting in this shift
    for_information: tuple[ChecklistItem, ...]
    last_drains: tuple[PoolDrain, ...]
    changes: Changes | None  # None: no previous handover to compare with
    # For the next handover's diff and cordon ages.
    finding_keys: tuple[FindingKey, ...] = ()
    cordons: tuple[CordonSeen, ...] = ()
    history_command: str = ""
    # What went wrong in runs since the previous handover, oldest first; those that left a
    # node cordoned are warnings (someone must act), the others information.
    failures: tuple[ChecklistItem, ...] = ()

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)

    @property
    def all_clear(self) -> bool:
        return not (self.needs_action or self.in_flight or self.coming_up or self.failures)

    def items(self) -> tuple[ChecklistItem, ...]:
        return self.needs_action + self.in_flight + self.coming_up + self.for_information



# --------------------------------------------------------------------------------------
# Stored as JSON


def checklist_to_json(checklist: Checklist) -> dict[str, Any]:
    """The checklist as canonical-JSON-ready values (times as storage's UTC text)."""
    t = codec.time_to_text
    return {
        "format": CHECKLIST_FORMAT,
        "rotation": checklist.rotation,
        "team": checklist.team,
        "shift": checklist.shift,
        "shift_start": t(checklist.shift_start),
        "shift_end": t(checklist.shift_end),
        "timezone": checklist.timezone,
        "generated_at": t(checklist.generated_at),
        "late": checklist.late,
        "missed": checklist.missed,
        "cluster": {"operator": checklist.cluster.operator,
                    "cluster_policy": checklist.cluster.cluster_policy,
                    "owner": checklist.cluster.owner},
        "needs_action": [_item_json(i) for i in checklist.needs_action],
        "in_flight": [_item_json(i) for i in checklist.in_flight],
        "coming_up": [_item_json(i) for i in checklist.coming_up],
        "for_information": [_item_json(i) for i in checklist.for_information],
        "last_drains": [{"pool": d.pool, "text": d.text, "command": d.command}
                        for d in checklist.last_drains],
        "changes": None if checklist.changes is None else {
            "since": t(checklist.changes.since),
            "new": [_item_json(i) for i in checklist.changes.new],
            "resolved": [_item_json(i) for i in checklist.changes.resolved],
        },
        "finding_keys": [{"code": k.code, "subject": k.subject, "severity": k.severity,
                          "command": k.command} for k in checklist.finding_keys],
        "cordons": [{"node": c.node, "since": t(c.since)} for c in checklist.cordons],
        "history_command": checklist.history_command,
        "failures": [_item_json(i) for i in checklist.failures],
    }


def checklist_from_json(raw: Mapping[str, Any]) -> Checklist:
    t = codec.time_from_text
    changes = raw.get("changes")
    return Checklist(
        rotation=raw["rotation"],
        team=raw["team"],
        shift=raw["shift"],
        shift_start=t(raw["shift_start"]),
        shift_end=t(raw["shift_end"]),
        timezone=raw["timezone"],
        generated_at=t(raw["generated_at"]),
        late=bool(raw["late"]),
        missed=int(raw["missed"]),
        cluster=ClusterFacts(**raw["cluster"]),
        needs_action=tuple(_item_from(i) for i in raw["needs_action"]),
        in_flight=tuple(_item_from(i) for i in raw["in_flight"]),
        coming_up=tuple(_item_from(i) for i in raw["coming_up"]),
        for_information=tuple(_item_from(i) for i in raw["for_information"]),
        last_drains=tuple(PoolDrain(**d) for d in raw["last_drains"]),
        changes=None if changes is None else Changes(
            since=t(changes["since"]),
            new=tuple(_item_from(i) for i in changes["new"]),
            resolved=tuple(_item_from(i) for i in changes["resolved"]),
        ),
        finding_keys=tuple(FindingKey(**k) for k in raw["finding_keys"]),
        cordons=tuple(CordonSeen(node=c["node"], since=t(c["since"])) for c in raw["cordons"]),
        history_command=raw.get("history_command", ""),
        failures=tuple(_item_from(i) for i in raw.get("failures", ())),
    )


def _item_json(item: ChecklistItem) -> dict[str, Any]:
    return {"kind": item.kind, "severity": item.severity, "subject": item.subject,
            "text": item.text, "command": item.command, "code": item.code}


def _item_from(raw: Mapping[str, Any]) -> ChecklistItem:
    return ChecklistItem(**raw)
