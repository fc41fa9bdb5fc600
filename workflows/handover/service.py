"""Handovers: post the checklist at each shift change, record who acknowledges it, and
chase the incoming shift until someone does.

`HandoverService(db, config)` works on one database connection. Every change writes, in
ONE transaction: the handover (or ack) row, an audit row (target = the rotation) and,
where Slack should hear of it, an outbox message. What was posted is in storage, unique
per (rotation, shift start), so a restart between two shift changes neither loses a post
(nothing stored: still due) nor repeats one (stored: not due); a scheduler that fires
twice posts once.

The bot drives it: every minute, `post_due(fleet_source, now=...)` then
`send_reminders(now)`; a click on "Acknowledge" calls `acknowledge(...)`.

Outbox payloads are JSON objects with `event`, `handover_id`, `rotation` and `text` (a
one-line fallback from `workflows.handover.messages`):

- `handover.posted` (kind "post", to the rotation's channel; the stored content carries
  the audit chain head as it stood, which the post shows): render the stored
  checklist (`commands.handover.handover_message(view, config)`), post it, then call
  `record_message(handover_id, ts=..., now=...)` with the message's ts;
- `handover.acknowledged` (kind "update"; `ts` is the message to update): render it
  again, now showing who acknowledged, without the button;
- `handover.reminder`, `handover.escalation` (kind "post", in the handover's thread
  when its ts is known): `mentions` = {"users": [...], "groups": [...]} to notify.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from storage import audit, codec, kv, outbox
from storage import handovers as stored_handovers
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage import steps as stored_steps
from storage.codec import JsonValue
from storage.database import Database
from storage.handovers import Handover
from storage.ids import HandoverId
from storage.steps import Step
from workflows.access import Actor
from workflows.drain.history import NodesDrained, last_drains
from workflows.fleet.clusters import ClusterGlance
from workflows.fleet.findings import sort_findings
from workflows.fleet.summary import Fleet, FleetSource
from workflows.handover import messages as say
from workflows.handover.building import build_checklist
from workflows.handover.checklist import (
    Checklist,
    FailureKind,
    RunFailure,
    RunInFlight,
    checklist_from_json,
    checklist_to_json,
)
from workflows.handover.rotations import (
    ON_TIME_WITHIN,
    DueHandover,
    RotationConfig,
    ShiftOnDuty,
    due_handovers,
    is_member,
    split_members,
)
from workflows.pools import freezes
from storage import notes as stored_notes
from workflows.requests.records import RequestSettings
from workflows.requests.service import RequestService
from workflows.signals.service import SignalsService

ReminderAction = Literal["remind", "escalate"]
# How many recent requests `last_drains` reads to find each pool's latest drain.


class HandoverError(Exception):
    """A handover action cannot be done; the message is shown to the user verbatim."""


class UnknownHandover(HandoverError):
    pass


class UnknownRotation(HandoverError):
    pass


@dataclass(frozen=True, slots=True)
class AckView:
    user: str
    name: str
    at: dt.datetime
    counted: bool


@dataclass(frozen=True, slots=True)
class HandoverView:
    id: HandoverId
    rotation: str
    shift: str
    shift_start: dt.datetime
    channel: str
    ts: str | None  # the Slack message, once posted
    late: bool
    missed: int
    queued_at: dt.datetime  # when gpuops queued the post
    posted_at: dt.datetime | None  # when Slack took it
    acked_by: str | None  # the first counted acknowledgement
    acked_by_name: str | None
    acked_at: dt.datetime | None
    acks: tuple[AckView, ...]  # every acknowledgement, counted or not, oldest first
    reminded_at: dt.datetime | None
    escalated_at: dt.datetime | None
    members: tuple[str, ...]  # the incoming shift as posted
    content: JsonValue
    checklist: Checklist
    # The audit chain head (`SEQ:HASH`) when the handover was posted, published with it so
    # that `gpuops audit verify --expected` can later catch a rewritten database.
    audit_head: str | None = None

    @property
    def acknowledged(self) -> bool:
        return self.acked_by is not None

    @property
    def counted_acks(self) -> int:
        return sum(a.counted for a in self.acks)


@dataclass(frozen=True, slots=True)
class AckOutcome:
    handover: HandoverView
    counted: bool  # the actor is on the incoming shift
    first: bool  # this ack acknowledged the handover
    text: str  # what to tell the person who clicked


class HandoverSettings(RequestSettings, Protocol):
    """What the handover service reads of the configuration (`workflows.config.GpuopsConfig`):
    the rotations, besides what the request service it asks for open requests reads."""

    @property
    def rotations(self) -> Sequence[RotationConfig]: ...


class HandoverService:
    """Handovers on one database connection (one per thread, see `storage.database`)."""

    def __init__(self, db: Database, config: HandoverSettings, *, signals: SignalsService | None = None,
                 others: Callable[[dt.datetime], Sequence[ClusterGlance]] | None = None) -> None:
        names = [r.name for r in config.rotations]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"rotation names must be unique; repeated: {', '.join(repeated)}")
        self._db = db
        self._config = config
        # GPU health from DCGM, read once per checklist (None: not configured).
        self._signals = signals
        # The other clusters gpuops serves, at a glance (None: one cluster).
        self._others = others

    # -------------------------------------------------------------- reading

    def rotation(self, name: str | None = None) -> RotationConfig:
        """The rotation called `name`; without a name, the only one configured."""
        rotations = self._config.rotations
        known = [r.name for r in rotations]
        if not rotations:
            raise UnknownRotation(say.no_rotations())
        if name is None:
            if len(rotations) > 1:
                raise UnknownRotation(say.which_rotation(known))
            return rotations[0]
        found = next((r for r in rotations if r.name == name), None)
        if found is None:
            raise UnknownRotation(say.unknown_rotation(name, known))
        return found

    def get(self, handover_id: int) -> HandoverView:
        stored = stored_handovers.get(self._db, id=HandoverId(handover_id))
        if stored is None:
            raise UnknownHandover(say.unknown_handover(handover_id))
        return self._view(stored)

    def for_shift(self, rotation: str, shift_start: dt.datetime) -> HandoverView | None:
        stored = stored_handovers.for_shift(self._db, rotation=rotation, shift_start=shift_start)
        return None if stored is None else self._view(stored)

    def latest(self, rotation: str) -> HandoverView | None:
        stored = stored_handovers.latest(self._db, rotation=rotation)
        return None if stored is None else self._view(stored)

    def history(self, rotation: str, n: int) -> list[HandoverView]:
        """The rotation's newest `n` handovers, newest first."""
        return [self._view(h) for h in stored_handovers.recent(self._db, rotation=rotation, limit=n)]

    def due(self, rotation: RotationConfig, *, now: dt.datetime) -> list[DueHandover]:
        """What `post_due` would post for `rotation` at `now`. Before its first handover,
        a rotation is due from when gpuops began watching it (`post_due` notes that), so
        a first shift change missed while the bot was down is still posted, late."""
        latest = stored_handovers.latest(self._db, rotation=rotation.name)
        if latest is not None:
            return due_handovers(rotation, latest.shift_start, now)
        watched = kv.get(self._db, key=_watched_key(rotation.name))
        since = codec.time_from_text(watched) - ON_TIME_WITHIN if watched else None
        return due_handovers(rotation, since, now)

    # -------------------------------------------------------------- the checklist

    def checklist(self, rotation: RotationConfig, shift: ShiftOnDuty, *, fleet: Fleet,
                  now: dt.datetime, late: bool = False, missed: int = 0) -> Checklist:
        """The checklist for `shift`, from the fleet and what storage holds now."""
        earlier = stored_handovers.recent(self._db, rotation=rotation.name, limit=1,
                                          before=shift.start)
        reading = None
        if self._signals is not None:
            reading = self._signals.read()
            found = self._signals.findings(reading, pools={name: node.pool for name, node in fleet.nodes.items()})
            if found:
                fleet = dataclasses.replace(fleet, findings=sort_findings((*fleet.findings, *found)))
        since = earlier[0].shift_start if earlier else shift.start - (shift.end - shift.start)
        return build_checklist(
            fleet=fleet,
            failures=self.failures(since=since),
            signals=reading,
            requests=RequestService(self._db, self._config).open_requests(every_cluster=True),
            runs_in_flight=self.runs_in_flight(),
            previous=earlier[0] if earlier else None,
            rotation=rotation,
            shift=shift,
            now=now,
            last_drains=self.last_drains(),
            freezes=freezes.all_in_force(self._db, now=now),
            notes=stored_notes.in_force(self._db, now=now, every_cluster=True),
            clusters=self._others(now) if self._others is not None else (),
            late=late,
            missed=missed,
        )

    def runs_in_flight(self) -> list[RunInFlight]:
        found = []
        for run in stored_runs.unfinished(self._db):  # every cluster's
            request = stored_requests.get(self._db, id=run.request_id)
            pool = request.pool if request else "?"
            if request is not None and request.cluster and self._others is not None:
                pool = f"{request.cluster}/{pool}"  # several clusters: which one's pool
            found.append(RunInFlight(
                run_id=run.id,
                request_id=run.request_id,
                kind=request.kind if request else "?",
                pool=pool,
                state=run.state,
                dry_run=run.dry_run,
                halted_reason=run.halted_reason,
                steps=tuple(stored_steps.for_run(self._db, run_id=run.id)),
            ))
        return found

    def failures(self, *, since: dt.datetime) -> list[RunFailure]:
        """What went wrong in real (not dry) runs that ended at or after `since`, every
        cluster's: each halt with its step, node and reason (a PodDisruptionBudget that
        blocked an eviction and a failed canary named as such), and each node a run left
        out because a budget still blocked it, from the runs' audit rows."""
        found: list[RunFailure] = []
        for run in stored_runs.ended_since(self._db, since=since, states=("failed", "succeeded")):
            request = stored_requests.get(self._db, id=run.request_id)
            if run.dry_run or request is None:
                continue
            pool = f"{request.cluster}/{request.pool}" if request.cluster and self._others is not None else request.pool
            about: dict[str, Any] = {"run_id": run.id, "request_id": request.id, "kind": request.kind, "pool": pool,
                     "requester_name": request.requester_name}
            steps = {s.id: s for s in stored_steps.for_run(self._db, run_id=run.id)}
            for entry in audit.for_run(self._db, run.id):
                detail = entry.detail if isinstance(entry.detail, dict) else {}
                if entry.action == "node.left_out":
                    found.append(RunFailure(what="left-out", at=entry.at, node=entry.target, step=_text(detail.get("kind")),
                                            reason=str(detail.get("reason") or ""), **about))
                elif entry.action == "run.failed":
                    node, kind = _text(detail.get("node")), _text(detail.get("kind"))
                    failed = next((s for s in steps.values() if s.node == node and s.kind == kind
                                   and s.state == "failed"), None)
                    found.append(RunFailure(
                        what=_failure_kind(kind, failed), at=entry.at, node=node, step=kind,
                        reason=str(detail.get("reason") or run.halted_reason or ""),
                        left_cordoned=tuple(str(n) for n in _list(detail.get("left_cordoned"))), **about))
        return found

    def last_drains(self) -> list[NodesDrained]:
        """Per pool, the latest finished drain or evict step of a real (not dry) run; the
        pools of the cluster the checklist is about (the home one, with several)."""
        return last_drains(self._db, cluster=self._config.cluster_name)

    # -------------------------------------------------------------- posting

    def post(self, rotation: str | RotationConfig, shift_start: dt.datetime,
             checklist: Checklist, *, late: bool, now: dt.datetime,
             missed: int | None = None) -> HandoverView:
        """Store the handover for this shift, audit it and queue its Slack post; if the
        shift already has one, return that one and change nothing."""
        config = rotation if isinstance(rotation, RotationConfig) else self.rotation(rotation)
        if checklist.shift_start != shift_start or checklist.rotation != config.name:
            raise ValueError("the checklist was built for another rotation or shift")
        shift = config.incoming_shift(shift_start)
        missed = checklist.missed if missed is None else missed
        content: dict[str, Any] = {
            **checklist_to_json(checklist),
            "late": late,
            "missed": missed,
            "members": list(shift.shift.members),
            "queued_at": codec.time_to_text(now),
        }
        with self._db.transaction():
            # Read under the write lock: the newest entry before this post's own row.
            content["audit_head"] = audit.head_of(self._db).text
            created = stored_handovers.create(self._db, rotation=config.name,
                                              shift_start=shift_start, channel=config.channel,
                                              content=content)
            if created is None:
                existing = stored_handovers.for_shift(self._db, rotation=config.name,
                                                      shift_start=shift_start)
                assert existing is not None
                return self._view(existing)
            audit.append(
                self._db, actor=audit.GPUOPS_ACTOR, k8s_identity=None, action="handover.posted",
                target=config.name, at=now, before=None, after="posted",
                detail={"handover_id": created.id, "shift": shift.name,
                        "shift_start": codec.time_to_text(shift_start), "late": late,
                        "missed": missed, "needs_action": len(checklist.needs_action),
                        "channel": config.channel})
            outbox.enqueue(
                self._db, channel=config.channel, kind="post", at=now,
                dedupe_key=f"handover/{created.id}/posted",
                payload=self._payload(created, "handover.posted", say.posted_text(
                    rotation=config.name, shift=shift.name, shift_start=shift_start, late=late,
                    needs_action=len(checklist.needs_action), zone=config.zone)))
            return self._view(created)

    def post_due(self, fleet_source: FleetSource, *, now: dt.datetime) -> list[HandoverView]:
        """Post every rotation's due handover (at most one each); the fleet is read only
        when something is due. What the scheduler calls every minute."""
        posted = []
        fleet: Fleet | None = None
        for rotation in self._config.rotations:
            self._watch(rotation, now=now)
            for due in self.due(rotation, now=now):
                fleet = fleet or fleet_source.fleet(now)
                checklist = self.checklist(rotation, due.shift, fleet=fleet, now=now,
                                           late=due.late, missed=due.missed)
                posted.append(self.post(rotation, due.shift_start, checklist, late=due.late,
                                        missed=due.missed, now=now))
        return posted

    def record_message(self, handover_id: int, *, ts: str, now: dt.datetime) -> bool:
        """The notifier posted the handover as message `ts`; an acknowledgement that came
        before this is now queued as an update. False if it was recorded already."""
        with self._db.transaction():
            stored = self._load(handover_id)
            first = stored_handovers.mark_posted(self._db, id=stored.id, ts=ts, posted_at=now,
                                                 late=bool(_content(stored).get("late")))
            if first and kv.delete(self._db, key=_key(stored.id, "update-pending")):
                self._queue_update(self._load(handover_id), now=now)
        return first

    # -------------------------------------------------------------- acknowledging

    def acknowledge(self, actor: Actor, handover_id: int, *, now: dt.datetime,
                    actor_groups: Sequence[str] = ()) -> AckOutcome:
        """Record `actor`'s acknowledgement. It counts only if they are on the incoming
        shift (by user id or one of `actor_groups`, their Slack user groups); the first
        one that counts acknowledges the handover and updates its message."""
        with self._db.transaction():
            stored = self._load(handover_id)
            counted = is_member(self._members(stored), actor.user_id, actor_groups)
            first = counted and stored.acked_by is None
            # Anyone in the workspace can press the button: a click that would record what
            # this person's earlier click already did writes nothing, so clicking on and
            # on (above all by someone not on the shift) cannot flood the acks or the audit.
            repeated = not first and any(
                a.user == actor.user_id and a.counted == counted
                for a in stored_handovers.acks(self._db, handover_id=stored.id))
            if not repeated:
                self._record_ack(stored, actor, counted=counted, first=first, now=now)
        view = self.get(handover_id)
        zone = self._zone(view.rotation)
        if first:
            text = say.acknowledged(name=actor.name, shift=view.shift)
        elif not counted:
            text = say.ack_not_counted(name=actor.name, shift=view.shift)
        elif view.acked_by == actor.user_id:
            assert view.acked_at is not None
            text = say.ack_already_yours(name=actor.name, acked_at=view.acked_at, zone=zone)
        else:
            assert view.acked_by_name is not None and view.acked_at is not None
            text = say.ack_already(name=actor.name, acked_by=view.acked_by_name,
                                   acked_at=view.acked_at, zone=zone)
        return AckOutcome(handover=view, counted=counted, first=first, text=text)

    def _record_ack(self, stored: Handover, actor: Actor, *, counted: bool, first: bool,
                    now: dt.datetime) -> None:
        """The ack row, its audit row and (the first that counts) the message update; in
        the caller's transaction."""
        stored_handovers.record_ack(self._db, handover_id=stored.id, user=actor.user_id,
                                    at=now, counted=counted)
        before = "waiting" if stored.acked_by is None else "acknowledged"
        audit.append(
            self._db, actor=actor.user_id, k8s_identity=None,
            action="handover.acknowledged" if first else "handover.ack-recorded",
            target=stored.rotation, at=now, before=before,
            after="acknowledged" if first else before,
            detail={"handover_id": stored.id, "shift": _content(stored).get("shift"),
                    "shift_start": codec.time_to_text(stored.shift_start),
                    "counted": counted, "first": first})
        if first:
            self._queue_update(self._load(stored.id), now=now)

    # -------------------------------------------------------------- chasing

    def reminders_due(self, now: dt.datetime) -> list[tuple[HandoverView, ReminderAction]]:
        """For each rotation's latest handover nobody on the shift acknowledged: "remind"
        once `ack_timeout` after it was queued, then "escalate" once `escalate_after`
        after the reminder (if the rotation has an escalation target). Reads only."""
        due = []
        for rotation in self._config.rotations:
            stored = stored_handovers.latest(self._db, rotation=rotation.name)
            if stored is None:
                continue
            action = self._reminder_due(rotation, stored, now)
            if action is not None:
                due.append((self._view(stored), action))
        return due

    def send_reminders(self, now: dt.datetime) -> list[tuple[HandoverView, ReminderAction]]:
        """Fire what `reminders_due` lists: record it (so each fires once), audit it and
        queue the thread message. Returns what was fired."""
        fired = []
        for view, action in self.reminders_due(now):
            rotation = self.rotation(view.rotation)
            with self._db.transaction():
                stored = self._load(view.id)
                if self._reminder_due(rotation, stored, now) != action:
                    continue  # another replica or an acknowledgement got there first
                self._fire(rotation, stored, action, now=now)
            fired.append((self.get(view.id), action))
        return fired

    def _reminder_due(self, rotation: RotationConfig, stored: Handover,
                      now: dt.datetime) -> ReminderAction | None:
        if stored.acked_by is not None:
            return None
        reminded = self._stamp(stored.id, "reminded")
        if reminded is None:
            queued = codec.time_from_text(_content(stored)["queued_at"])
            return "remind" if now >= queued + rotation.ack_timeout else None
        if rotation.escalation is None or self._stamp(stored.id, "escalated") is not None:
            return None
        return "escalate" if now >= reminded + rotation.escalate_after else None

    def _fire(self, rotation: RotationConfig, stored: Handover, action: ReminderAction, *,
              now: dt.datetime) -> None:
        content = _content(stored)
        waited = now - codec.time_from_text(content["queued_at"])
        shift = str(content.get("shift"))
        if action == "remind":
            members: Sequence[str] = self._members(stored)
            text = say.reminder(shift=shift, waited=waited)
        else:
            assert rotation.escalation is not None
            members = (rotation.escalation,)
            text = say.escalation(rotation=rotation.name, shift=shift, waited=waited)
        stamp = "reminded" if action == "remind" else "escalated"
        kv.put(self._db, key=_key(stored.id, stamp), value=codec.time_to_text(now))
        audit.append(
            self._db, actor=audit.GPUOPS_ACTOR, k8s_identity=None, action=f"handover.{stamp}",
            target=rotation.name, at=now, before="waiting", after="waiting",
            detail={"handover_id": stored.id, "shift": shift, "mentions": list(members),
                    "waited_seconds": int(waited.total_seconds())})
        payload = self._payload(stored, "handover.reminder" if action == "remind"
                                else "handover.escalation", text)
        assert isinstance(payload, dict)
        users, groups = split_members(members)
        payload["mentions"] = {"users": list(users), "groups": list(groups)}
        outbox.enqueue(self._db, channel=stored.channel, thread_ts=stored.ts, kind="post", at=now,
                       dedupe_key=f"handover/{stored.id}/{action}", payload=payload)

    # -------------------------------------------------------------- privately

    def _watch(self, rotation: RotationConfig, *, now: dt.datetime) -> None:
        """Note when gpuops first looked after `rotation` (the first tick wins)."""
        key = _watched_key(rotation.name)
        if kv.get(self._db, key=key) is not None:
            return  # the usual case: no write lock taken every minute
        with self._db.transaction():
            if kv.get(self._db, key=key) is None:
                kv.put(self._db, key=key, value=codec.time_to_text(now))

    def _load(self, handover_id: int) -> Handover:
        stored = stored_handovers.get(self._db, id=HandoverId(handover_id))
        if stored is None:
            raise UnknownHandover(say.unknown_handover(handover_id))
        return stored

    def _members(self, stored: Handover) -> tuple[str, ...]:
        """Who counts for this handover: the shift as configured now (a fixed roster
        takes effect at once), else as it was posted."""
        content = _content(stored)
        rotation = next((r for r in self._config.rotations if r.name == stored.rotation), None)
        shift = rotation.shift_named(str(content.get("shift"))) if rotation else None
        if shift is not None:
            return shift.members
        return tuple(content.get("members", ()))

    def _queue_update(self, stored: Handover, *, now: dt.datetime) -> None:
        if stored.ts is None:
            # Not in Slack yet: `record_message` queues the update once the ts is known.
            kv.put(self._db, key=_key(stored.id, "update-pending"), value=codec.time_to_text(now))
            return
        name = self._name(stored.acked_by) if stored.acked_by else "?"
        payload = self._payload(stored, "handover.acknowledged", say.acknowledged(
            name=name, shift=str(_content(stored).get("shift"))))
        assert isinstance(payload, dict)
        payload["ts"] = stored.ts
        outbox.enqueue(self._db, channel=stored.channel, kind="update", at=now,
                       dedupe_key=f"handover/{stored.id}/acknowledged", payload=payload)

    def _payload(self, stored: Handover, event: str, text: str) -> JsonValue:
        return {"event": event, "handover_id": stored.id, "rotation": stored.rotation,
                "shift_start": codec.time_to_text(stored.shift_start), "text": text}

    def _stamp(self, handover_id: int, what: str) -> dt.datetime | None:
        text = kv.get(self._db, key=_key(handover_id, what))
        return None if text is None else codec.time_from_text(text)

    def _name(self, user: str) -> str:
        return self._config.names.get(user, user)

    def _zone(self, rotation: str) -> dt.tzinfo:
        found = next((r for r in self._config.rotations if r.name == rotation), None)
        return found.zone if found else dt.timezone.utc

    def _view(self, stored: Handover) -> HandoverView:
        content = _content(stored)
        return HandoverView(
            id=stored.id,
            rotation=stored.rotation,
            shift=str(content.get("shift")),
            shift_start=stored.shift_start,
            channel=stored.channel,
            ts=stored.ts,
            late=bool(content.get("late")),
            missed=int(content.get("missed", 0)),
            queued_at=codec.time_from_text(content["queued_at"]),
            posted_at=stored.posted_at,
            acked_by=stored.acked_by,
            acked_by_name=self._name(stored.acked_by) if stored.acked_by else None,
            acked_at=stored.acked_at,
            acks=tuple(AckView(user=a.user, name=self._name(a.user), at=a.at, counted=a.counted)
                       for a in stored_handovers.acks(self._db, handover_id=stored.id)),
            reminded_at=self._stamp(stored.id, "reminded"),
            escalated_at=self._stamp(stored.id, "escalated"),
            members=tuple(content.get("members", ())),
            content=stored.content,
            checklist=checklist_from_json(content),
            audit_head=content.get("audit_head"),
        )


def _text(value: JsonValue) -> str | None:
    """A text field of an audit entry's detail (None when absent)."""
    return value if isinstance(value, str) else None


def _list(value: JsonValue) -> list[JsonValue]:
    """A list field of an audit entry's detail (empty when absent)."""
    return value if isinstance(value, list) else []


def _failure_kind(kind: str | None, failed: Step | None) -> FailureKind:
    """A halted run's failure as the handover names it: an eviction a budget still
    blocked at the timeout, a failed canary (the check pod), or any other halt."""
    result = (failed.detail or {}).get("result") if failed is not None and isinstance(failed.detail, dict) else None
    if kind == "evict" and isinstance(result, dict) and result.get("blocked"):
        return "pdb-blocked"
    if kind == "gpu-check":
        return "canary-failed"
    return "halted"


def _content(stored: Handover) -> dict[str, Any]:
    return stored.content if isinstance(stored.content, dict) else {}


def _key(handover_id: int, what: str) -> str:
    return f"handover.{handover_id}.{what}"


def _watched_key(rotation: str) -> str:
    return f"handover.rotation.{rotation}.watched-since"
