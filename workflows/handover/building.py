"""Building the handover checklist: a pure function of the fleet, the open requests, the
runs in flight, the previous handover, the rotation, the incoming shift and `now`.

Items that need someone to act come first (`needs_action`, most severe first); everything
else follows in fixed groups. Every item names the `/gpu` command that shows more.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from storage import codec
from workflows.drain.history import NodesDrained
from workflows.fleet.assessment import UNPOOLED
from workflows.fleet.clusters import ClusterGlance
from workflows.fleet.drift_messages import note_in_handover
from workflows.fleet.findings import SEVERITY_ORDER, Finding, Severity, node_command, pool_command
from workflows.fleet.notes import Note
from workflows.fleet.summary import Fleet
from workflows.handover import messages as say
from workflows.handover.checklist import (
    Changes,
    Checklist,
    ChecklistItem,
    ClusterFacts,
    CordonSeen,
    FindingKey,
    ItemKind,
    PoolDrain,
    Rotation,
    RunFailure,
    RunInFlight,
    ShiftStint,
    StoredHandover,
)
from workflows.kube.objects import NodeName
from workflows.pools.freezes import Freeze, freeze_sentence
from workflows.requests.views import RequestView
from workflows.signals.findings import SIGNAL_CODES
from workflows.signals.service import Reading

# Within one severity: a change freeze first (it changes what anyone may do this shift),
# the other clusters (one that does not answer hides all of its problems), the cluster's
# own problems, then what people must decide.
_KIND_ORDER: dict[str, int] = {"freeze": 0, "cluster": 1, "finding": 2, "approval": 3, "run": 4, "cordon": 5,
                               "window": 6, "failure": 7, "note": 8}
_WINDOW_STATES = frozenset({"approved", "scheduled"})


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
        needs.append(_item("freeze", "warning", freeze.target, freeze_sentence(freeze, zone=zone), "/gpu freezes"))

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
                                                                      until=note.until, zone=zone),
                          node_command(note.node)))

    # Near-identical findings (one code, one severity) are one line naming what they are
    # on. What a driver change in flight on the finding's pool is there to fix is for
    # information, saying which run is on it.
    alike: dict[tuple[str, Severity, str | None], list[Finding]] = {}
    for finding in fleet.findings:
        run = _run_fixing(finding, runs_in_flight)
        severity: Severity = "info" if run is not None else finding.severity
        alike.setdefault((finding.code, severity, run.run_id if run else None), []).append(finding)
    for (_, severity, run_id), group in alike.items():
        item = _findings_item(group, severity=severity, run=runs[run_id] if run_id else None)
        (info if item.severity == "info" else needs).append(item)
    # (What changed since the last handover is read per finding, and not of those a run is on.)
    finding_items = [_finding_item(f) for (_, _, run_id), group in alike.items() if run_id is None for f in group]

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


def _run_fixing(finding: Finding, runs: Sequence[RunInFlight]) -> RunInFlight | None:
    """The run in flight on the finding's pool that is there to fix it (a critical finding
    stays critical whatever is in flight)."""
    if finding.severity == "critical":
        return None
    return next((r for r in runs if not r.dry_run and r.kind in _FIXES.get(finding.code, ())
                 and r.pool == finding.pool and r.state == "running"), None)


def _finding_item(finding: Finding) -> ChecklistItem:
    return ChecklistItem(kind="finding", severity=finding.severity, subject=finding.subject,
                         text=finding.message, command=finding.command or "/gpu findings",
                         code=finding.code)


def _findings_item(group: Sequence[Finding], *, severity: Severity, run: RunInFlight | None) -> ChecklistItem:
    """One line for findings of one code and severity: the finding itself when alone,
    else what they are on and the first of them; with the run in flight that is on them."""
    first = group[0]
    if run is None and len(group) == 1:
        return _finding_item(first)
    subjects = [f.subject for f in group]
    noun = "pool" if all(f.subject == f.pool for f in group) else "node"
    if run is None:
        text = say.findings_alike(first.code, subjects=subjects, noun=noun, first=first.message)
        command = first.command if len(group) == 1 else say.findings_command()
        return ChecklistItem(kind="finding", severity=severity, subject=first.subject, code=first.code,
                             text=text, command=command or say.findings_command())
    text = say.findings_a_run_is_on(first.code, subjects=subjects, noun=noun, first=first.message,
                                    run=run.run_id, kind=run.kind)
    return ChecklistItem(kind="finding", severity=severity, subject=run.pool, code=first.code, text=text,
                         command=say.request_command(run.request_id))


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
