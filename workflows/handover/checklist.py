"""The handover checklist: what an incoming shift must know, as a value, and the Jinja2
template that lays it out.

`build_checklist(...)` is a pure function of the fleet, the open requests, the runs in
flight, the previous handover, the rotation, the incoming shift and `now`. Items that need
someone to act come first (`needs_action`, most severe first); everything else follows in
fixed groups. Every item names the `/gpu` command that shows more.

The checklist is stored as JSON in the handover's content (`checklist_to_json`), so the
posted message can be rendered again when it is acknowledged, and so the next handover
can say what changed: it diffs the stored `finding_keys` (code + subject) against the
fleet's findings now, and carries forward since when a node has been seen cordoned.

gpuops lays a checklist out itself (`commands.handover.render_checklist`, from these
values). A rotation may name its own Jinja2 template instead (`rotations[].template`):
`ChecklistTemplate` says what such a template receives and what it writes;
`templates/handover.md.j2` is gpuops's own layout written that way, a starting point.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, TypeAlias

import jinja2
import jinja2.sandbox

from storage import codec
from storage.steps import Step
from workflows.drain.history import NodesDrained
from workflows.fleet.clusters import ClusterGlance
from workflows.fleet.assessment import UNPOOLED
from workflows.fleet.findings import SEVERITY_ORDER, Finding, Severity, format_age, node_command, pool_command
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName
from workflows.handover import messages as say
from workflows.pools.freezes import Freeze, freeze_sentence
from workflows.fleet.drift_messages import note_in_handover
from workflows.fleet.notes import Note
from workflows.requests.views import RequestView
from workflows.signals.findings import SIGNAL_CODES
from workflows.signals.service import Reading
from workflows.wording import when

CHECKLIST_FORMAT = 1
ItemKind: TypeAlias = Literal["freeze", "cluster", "finding", "approval", "run", "cordon", "window", "failure",
                              "note"]
# Within one severity: a change freeze first (it changes what anyone may do this shift),
# the other clusters (one that does not answer hides all of its problems), the cluster's
# own problems, then what people must decide.
_KIND_ORDER: dict[str, int] = {"freeze": 0, "cluster": 1, "finding": 2, "approval": 3, "run": 4, "cordon": 5,
                               "window": 6, "failure": 7, "note": 8}
_WINDOW_STATES = frozenset({"approved", "scheduled"})


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
# Building it


def build_checklist(
    *,
    fleet: Fleet,
    requests: Sequence[RequestView],
    runs_in_flight: Sequence[RunInFlight],
    previous: StoredHandover | None,
    rotation: Rotation,
    shift: ShiftStint,
    now: dt.datetime,
    last_drains: Sequence[NodesDrained] = (),
    late: bool = False,
    missed: int = 0,
    signals: Reading | None = None,
    freezes: Sequence[Freeze] = (),
    clusters: Sequence[ClusterGlance] = (),
    failures: Sequence[RunFailure] = (),
    notes: Sequence[Note] = (),
) -> Checklist:
    """The checklist for `shift` of `rotation`, from what is known at `now`.

    `requests` are the open requests (pending, approved, scheduled, running);
    `previous` the rotation's handover before this one, whose stored content gives the
    findings to diff against and since when cordoned nodes have been seen cordoned.
    `signals` is the DCGM reading whose findings `fleet.findings` already holds (None:
    not configured): where it could not be read, for the cluster or one node, the last
    handover's DCGM findings there are carried forward as unknown, never as resolved.
    `freezes` are the change freezes in force: each is an item the shift must know.
    `clusters` are the other clusters gpuops serves (not the one `fleet` is): one that
    does not answer, or has critical findings, needs the shift; the others are a line each.
    `failures` are what went wrong in runs since the previous handover: each says which
    run, step and node, why, which of the nodes it left cordoned still are, and who acts.
    `notes` are the operators' notes on nodes in force (`/gpu note`): a line each, so the
    next shift knows why a node is held.
    """
    zone = rotation.zone
    before = _Previous.read(previous)
    runs = {r.run_id: r for r in runs_in_flight}
    needs: list[ChecklistItem] = []
    in_flight: list[ChecklistItem] = []
    info: list[ChecklistItem] = []

    for freeze in freezes:
        needs.append(_item("freeze", "warning", freeze.target, freeze_sentence(freeze), "/gpu freezes"))

    for other in clusters:
        command = say.cluster_command(other.cluster)
        if other.reach.state != "up":
            needs.append(_item("cluster", "warning", other.cluster, say.cluster_not_answering(
                other.cluster, state=other.reach.state, since=other.reach.since, now=now, nodes=other.nodes,
                ready=other.ready), command))
        elif other.critical:
            needs.append(_item("cluster", "critical", other.cluster, say.cluster_glance(other), command))
        else:
            info.append(_item("cluster", "info", other.cluster, say.cluster_glance(other), command))

    for note in notes:
        info.append(_item("note", "info", note.node, note_in_handover(note.node, note.text, by=note.set_by_name,
                                                                      until=note.until), node_command(note.node)))

    finding_items = [_finding_item(f) for f in fleet.findings]
    # What a driver change in flight on the finding's pool is fixing is for information,
    # one line per run, saying the run is on it.
    fixing: dict[str, list[tuple[Finding, RunInFlight]]] = {}
    for finding in fleet.findings:
        run = next((r for r in runs_in_flight if not r.dry_run and r.kind in _FIXES.get(finding.code, ())
                    and r.pool == finding.pool and r.state == "running"), None)
        if run is not None and finding.severity != "critical":
            fixing.setdefault(run.run_id, []).append((finding, run))
    on_it = {id(f) for pairs in fixing.values() for f, _ in pairs}
    finding_items = [item for f, item in zip(fleet.findings, finding_items) if id(f) not in on_it]
    for pairs in fixing.values():
        run = pairs[0][1]
        info.append(ChecklistItem(kind="finding", severity="info", subject=run.pool, code=pairs[0][0].code,
                                  text=say.findings_a_run_is_on([f.message for f, _ in pairs], run=run.run_id,
                                                                kind=run.kind),
                                  command=say.request_command(run.request_id)))
    for item in finding_items:
        (info if item.severity == "info" else needs).append(item)

    cordons: list[CordonSeen] = []
    for name, node in fleet.nodes.items():
        if not node.cordoned:
            continue
        seen_before = before.cordons.get(name)
        # A person's cordon a run took over (cordoned before it) stays the person's.
        by_gpuops = (node.cordoned_by is not None or node.cordon_run is not None) and not node.cordoned_before_run
        run = runs.get(node.cordon_run) if node.cordon_run else None
        exact = run.cordoned_at(name) if run is not None else None
        cordons.append(CordonSeen(node=name, since=exact or seen_before or now))
        if node.cordoned_before_run and run is not None:
            text = say.cordoned_by_hand_kept_by_run(name, run=run.run_id)
            info.append(_item("cordon", "info", name, text, say.request_command(run.request_id)))
        elif by_gpuops and run is not None:
            text = say.cordoned_for_run(name, run=run.run_id, at=exact, now=now)
            info.append(_item("cordon", "info", name, text, say.request_command(run.request_id)))
        elif by_gpuops:
            text = say.cordon_left_behind(name, by=node.cordoned_by, run=node.cordon_run)
            needs.append(_item("cordon", "warning", name, text, node_command(name)))
        else:
            text = say.cordoned_by_hand(name, since=seen_before, now=now, zone=zone)
            needs.append(_item("cordon", "warning", name, text, node_command(name)))

    windows: list[tuple[dt.datetime, ChecklistItem]] = []
    for request in requests:
        in_shift = request.window_start is not None and shift.contains(request.window_start)
        if request.state == "pending":
            text = say.approval_waiting(
                request_id=request.id, kind=request.kind, pool=_pool_of(request, qualified=bool(clusters)),
                counted=request.approvals_counted, required=request.approvals_required,
                expires_at=request.expires_at, window_start=request.window_start,
                in_shift=in_shift, now=now, zone=zone)
            needs.append(_item("approval", "warning", request.id, text, say.request_command(request.id)))
        elif request.state in _WINDOW_STATES and in_shift:
            assert request.window_start is not None
            approvers = [a.approver_name for a in request.approvals if a.counts]
            text = say.window_coming(
                request_id=request.id, kind=request.kind, pool=_pool_of(request, qualified=bool(clusters)), state=request.state,
                start=request.window_start, end=request.window_end, approvers=approvers, zone=zone)
            windows.append((request.window_start,
                            _item("window", "info", request.id, text, say.request_command(request.id))))
    coming_up = [item for _, item in sorted(windows, key=lambda w: (w[0], w[1].subject))]

    for run in runs_in_flight:
        item = _run_item(run, now=now)
        (needs if run.state == "paused" else in_flight).append(item)

    keys = tuple(
        FindingKey(code=f.code, subject=f.subject, severity=f.severity, command=f.command)
        for f in fleet.findings
    )
    if signals is not None:
        if signals.unavailable is not None:
            needs.append(_item("finding", "warning", "cluster", say.signals_unknown(signals.source,
                                                                                    signals.unavailable),
                               "/gpu findings"))
        # (Not what was raised again: a node read in part raises what it could read.)
        raised = {(key.code, key.subject) for key in keys}
        unchecked = tuple(key for (code, subject), key in before.finding_keys.items()
                          if code in SIGNAL_CODES and not signals.known(subject) and (code, subject) not in raised)
        per_node: dict[str, list[str]] = {}
        for key in unchecked:
            per_node.setdefault(key.subject, []).append(key.code)
        for subject, codes in sorted(per_node.items()):
            needs.append(_item("finding", "warning", subject, say.signals_unchecked(subject, codes),
                               node_command(subject)))
        keys = (*keys, *unchecked)
    return Checklist(
        rotation=rotation.name,
        team=rotation.team,
        shift=shift.name,
        shift_start=shift.start,
        shift_end=shift.end,
        timezone=rotation.timezone,
        generated_at=now,
        late=late,
        missed=missed,
        cluster=ClusterFacts(
            operator=say.operator_fact(fleet.cluster.operator_version,
                                       fleet.cluster.operator_namespace,
                                       fleet.cluster.operator_found),
            cluster_policy=say.cluster_policy_fact(fleet.cluster.cluster_policy,
                                                   fleet.cluster.cluster_policy_state),
            owner=say.owner_fact(fleet.cluster.cluster_policy_owner),
        ),
        needs_action=_most_urgent_first(needs),
        in_flight=tuple(in_flight),
        coming_up=tuple(coming_up),
        for_information=_most_urgent_first(info),
        last_drains=_last_drains(fleet, last_drains, now=now, zone=zone),
        changes=_changes(before, finding_items, keys),
        finding_keys=keys,
        cordons=tuple(cordons),
        history_command=say.history_command(rotation.name),
        failures=tuple(_failure_item(f, fleet=fleet, now=now, zone=zone)
                       for f in sorted(failures, key=lambda f: (f.at, f.run_id))),
    )


def _failure_item(failure: RunFailure, *, fleet: Fleet, now: dt.datetime, zone: zoneinfo.ZoneInfo) -> ChecklistItem:
    # What the run left cordoned, as the fleet has it now: a node someone has given back
    # since is nobody's task any more (one the fleet does not know is kept: fail closed).
    still = tuple(n for n in failure.left_cordoned if (node := fleet.nodes.get(NodeName(n))) is None or node.cordoned)
    text = say.run_failure(what=failure.what, run_id=failure.run_id, request_id=failure.request_id,
                           kind=failure.kind, pool=failure.pool, node=failure.node, step=failure.step,
                           reason=failure.reason, at=failure.at, zone=zone, left_cordoned=failure.left_cordoned,
                           still_cordoned=still, requester=failure.requester_name)
    severity: Severity = "warning" if still else "info"
    return _item("failure", severity, failure.run_id, text, say.request_command(failure.request_id))


def _pool_of(request: RequestView, *, qualified: bool) -> str:
    """The request's pool, as `cluster/pool` where gpuops serves several clusters."""
    return f"{request.cluster}/{request.pool}" if qualified and request.cluster else request.pool


def _item(kind: ItemKind, severity: Severity, subject: str, text: str, command: str) -> ChecklistItem:
    return ChecklistItem(kind=kind, severity=severity, subject=subject, text=text, command=command)


# Findings a run of these kinds, in flight on the finding's pool, is there to fix.
_FIXES: dict[str, tuple[str, ...]] = {"driver-pods-behind-template": ("upgrade",),
                                      "mixed-driver-versions": ("upgrade", "migrate")}


def _finding_item(finding: Finding) -> ChecklistItem:
    return ChecklistItem(kind="finding", severity=finding.severity, subject=finding.subject,
                         text=finding.message, command=finding.command or "/gpu findings",
                         code=finding.code)


def _most_urgent_first(items: Iterable[ChecklistItem]) -> tuple[ChecklistItem, ...]:
    return tuple(sorted(items, key=lambda i: (SEVERITY_ORDER[i.severity], _KIND_ORDER[i.kind], i.subject)))


def _run_item(run: RunInFlight, *, now: dt.datetime) -> ChecklistItem:
    step = run.current_step
    step_text = None
    if step is not None:
        step_text = say.step_line(kind=step.kind, node=step.node, wave=step.wave, state=step.state,
                                  attempt=step.attempt, started_at=step.started_at, now=now,
                                  more_running=max(len(run.running_steps) - 1, 0))
    text = say.run_line(run_id=run.run_id, request_id=run.request_id, kind=run.kind, pool=run.pool,
                        state=run.state, dry_run=run.dry_run, step=step_text, done=run.done,
                        total=len(run.steps), halted_reason=run.halted_reason)
    severity: Severity = "warning" if run.state == "paused" else "info"
    return _item("run", severity, run.run_id, text, say.request_command(run.request_id))


def _last_drains(fleet: Fleet, records: Sequence[NodesDrained], *, now: dt.datetime,
                 zone: zoneinfo.ZoneInfo) -> tuple[PoolDrain, ...]:
    latest: dict[str, NodesDrained] = {}
    for record in records:
        if record.pool not in latest or record.at > latest[record.pool].at:
            latest[record.pool] = record
    pools: list[str] = [p.name for p in fleet.pools if p.name != UNPOOLED]
    pools += sorted(set(latest) - set(pools))
    lines = []
    for pool in pools:
        last = latest.get(pool)
        if last is None:
            lines.append(PoolDrain(pool=pool, text=say.no_drains(), command=pool_command(pool)))
        else:
            text = say.last_drain(request_id=last.request_id, kind=last.kind, at=last.at,
                                  nodes=last.nodes, outcome=last.outcome, now=now, zone=zone)
            lines.append(PoolDrain(pool=pool, text=text, command=say.request_command(last.request_id)))
    return tuple(lines)


def _changes(before: _Previous, items: Sequence[ChecklistItem],
             keys: Sequence[FindingKey]) -> Changes | None:
    if before.shift_start is None:
        return None
    now_keys = {(k.code, k.subject) for k in keys}
    new = [i for i in items if (i.code, i.subject) not in before.finding_keys]
    resolved = [
        _item("finding", key.severity, key.subject, say.resolved(key.code, key.subject),
              key.command or "/gpu findings")
        for (code, subject), key in before.finding_keys.items()
        if (code, subject) not in now_keys
    ]
    return Changes(since=before.shift_start, new=_most_urgent_first(new),
                   resolved=_most_urgent_first(resolved))


@dataclass(frozen=True, slots=True)
class _Previous:
    shift_start: dt.datetime | None = None
    finding_keys: Mapping[tuple[str, str], FindingKey] = field(default_factory=dict)
    cordons: Mapping[str, dt.datetime] = field(default_factory=dict)

    @classmethod
    def read(cls, handover: StoredHandover | None) -> _Previous:
        if handover is None:
            return cls()
        content = handover.content if isinstance(handover.content, dict) else {}
        keys = {}
        for raw in content.get("finding_keys", ()):
            key = FindingKey(code=raw["code"], subject=raw["subject"],
                             severity=raw.get("severity", "warning"), command=raw.get("command"))
            keys[(key.code, key.subject)] = key
        cordons = {raw["node"]: codec.time_from_text(raw["since"]) for raw in content.get("cordons", ())}
        return cls(shift_start=handover.shift_start, finding_keys=keys, cordons=cordons)


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


# --------------------------------------------------------------------------------------
# Templates


class TemplateProblem(Exception):
    """A checklist template cannot be used: the file, the line (when known) and why."""

    def __init__(self, *, path: Path, line: int | None, reason: str) -> None:
        where = f"template {path}" + (f", line {line}" if line else "")
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class ChecklistTemplate:
    """A rotation's own checklist template (`rotations[].template`), compiled, that
    rendered the sample checklist without error when the configuration loaded.

    What it receives:

    - `checklist`, the `Checklist`: `rotation`, `team`, `shift` (the incoming shift's
      name), `shift_start`, `shift_end`, `generated_at` (times), `timezone`, `late`,
      `missed` (earlier shift changes with no handover), `all_clear`; `cluster`
      (`operator`, `cluster_policy`, `owner`); the item lists `needs_action` (most severe
      first), `failures` (what went wrong in runs since the last handover), `in_flight`,
      `coming_up` (windows starting this shift) and `for_information`, each item with
      `kind`, `severity` (critical, warning, info), `subject`, `text`, `command` (the
      `/gpu` command that shows more) and `code` (a finding's); `last_drains` (`pool`,
      `text`, `command`); `changes` (none without an earlier handover, else `since`, `new`
      and `resolved` items); `history_command`.
    - the filters `when` (a time in the rotation's zone: "Sat 07 Jun 14:00 CEST") and `ago`
      (how long before the checklist was made: "2h 5m").

    It runs sandboxed (no Python internals, nothing it is given can be changed), and a
    name the checklist lacks is an error, not an empty string.

    What it writes: the message, one line each (blank lines are skipped):

        # text                        the title (the first one; else "Handover to the <shift> shift")
        ## text                       a new section with this title
        * severity: text | /gpu ...   an item: critical, warning or info, then the command
                                      that shows more (after " | ", optional)
        - text                        a bullet
        ~ text                        a line of the footer
        any other text                text of the current section (before any: the summary)

    Every value is written on the line the template writes it on (a line break inside a
    value becomes a space), so nothing a checklist holds, such as a pod's log in a
    failure's reason, adds a line of its own. The Acknowledge button, who acknowledged
    and the audit head are added after the template's footer, as for gpuops's own layout.
    """

    path: Path
    template: jinja2.Template = field(repr=False, compare=False)

    def render(self, checklist: Checklist) -> str:
        """The template's lines for `checklist`; TemplateProblem (its file, line and why)
        when it fails on this checklist although it rendered the sample."""
        try:
            return self.template.render(checklist=checklist)
        except jinja2.TemplateError as err:
            raise TemplateProblem(path=self.path, line=_template_line(err.__traceback__, self.template),
                                  reason=err.message or type(err).__name__) from None
        except Exception as err:  # noqa: BLE001 - any failure of a team's template is theirs to fix
            raise TemplateProblem(path=self.path, line=_template_line(err.__traceback__, self.template),
                                  reason=f"{type(err).__name__}: {err}") from None


def load_template(path: Path) -> ChecklistTemplate:
    """Compile the template at `path` and render the sample checklist with it, so a
    syntax error, a misspelt field or a failing filter stops the start, not a handover.
    A file is compiled once until it changes."""
    path = Path(path)
    if not path.is_file():
        reason = "no such file" if not path.exists() else "not a file"
        raise TemplateProblem(path=path, line=None, reason=reason)
    stat = path.stat()
    return _load_template(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=64)
def _load_template(path: Path, mtime_ns: int, size: int) -> ChecklistTemplate:
    environment = _environment(str(path.resolve().parent))
    try:
        template = environment.get_template(path.name)
    except jinja2.TemplateSyntaxError as err:
        raise TemplateProblem(path=Path(err.filename or path), line=err.lineno,
                              reason=err.message or "syntax error") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TemplateProblem(path=path, line=None, reason=f"cannot read it: {err}") from None
    compiled = ChecklistTemplate(path=path, template=template)
    compiled.render(sample_checklist())  # a failure is a TemplateProblem: a configuration error
    return compiled


@lru_cache(maxsize=None)
def _environment(folder: str) -> jinja2.Environment:
    # Sandboxed: a team's template is configuration, not code, so it may read the
    # checklist's fields but never reach Python's internals (`__class__`, `__globals__`,
    # `mro()`) nor call methods that change what they are given.
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # plain lines; the renderers escape for their medium
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_one_line,
    )
    environment.filters["when"] = _when
    environment.filters["ago"] = _ago
    return environment


def _one_line(value: Any) -> Any:
    """A value as the template prints it: on one line, whatever it holds (each line the
    template writes is read for what it is, so a value must not start lines)."""
    if not isinstance(value, str):
        return value
    lines = value.splitlines()
    return " ".join(lines) if len(lines) != 1 or lines[0] != value else value


@jinja2.pass_context
def _when(context: jinja2.runtime.Context, at: dt.datetime) -> str:
    """A time in the rotation's zone: "Sat 07 Jun 14:00 CEST"."""
    return when(at, context["checklist"].zone, style="day")


@jinja2.pass_context
def _ago(context: jinja2.runtime.Context, at: dt.datetime) -> str:
    """How long before the checklist was made: "2h 5m"."""
    return format_age(context["checklist"].generated_at - at)


def _template_line(tb: TracebackType | None, template: jinja2.Template) -> int | None:
    # Jinja rewrites tracebacks so that template frames carry the template's file name
    # and line numbers; the deepest such frame is where the render failed.
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == template.filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def sample_checklist() -> Checklist:
    """A checklist with something in every list, to try templates on at start."""
    start = dt.datetime(2025, 6, 7, 6, 0, tzinfo=dt.timezone.utc)

    def item(kind: ItemKind, severity: Severity, subject: str) -> ChecklistItem:
        return ChecklistItem(kind=kind, severity=severity, subject=subject,
                             text=f"sample {kind} about {subject}", command=f"/gpu node {subject}",
                             code="driver-conflict" if kind == "finding" else None)

    return Checklist(
        rotation="sample", team="Sample team", shift="day", shift_start=start,
        shift_end=start + dt.timedelta(hours=12), timezone="UTC",
        generated_at=start + dt.timedelta(minutes=7), late=True, missed=1,
        cluster=ClusterFacts(operator="v26.7.0 in gpu-operator",
                             cluster_policy="cluster-policy (ready)", owner="gpu-platform"),
        needs_action=(item("finding", "critical", "gpu-01"), item("cordon", "warning", "gpu-02")),
        in_flight=(item("run", "info", "run-000000"),),
        coming_up=(item("window", "info", "req-000000"),),
        for_information=(item("finding", "info", "unpooled"),),
        last_drains=(PoolDrain(pool="train-a", text="no drains recorded", command="/gpu status train-a"),),
        changes=Changes(since=start - dt.timedelta(hours=12),
                        new=(item("finding", "critical", "gpu-01"),),
                        resolved=(item("finding", "warning", "gpu-03"),)),
        finding_keys=(FindingKey(code="driver-conflict", subject="gpu-01", severity="critical"),),
        cordons=(CordonSeen(node="gpu-02", since=start),),
        history_command="/gpu handover history sample",
        failures=(item("failure", "warning", "run-000001"),),
    )
