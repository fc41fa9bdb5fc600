"""Kubernetes Events (events.k8s.io/v1) for what the engine does to an object, so
`kubectl describe node`, `kubectl get events` and event exporters tell the story too.

Where they come from, and why there: the engine already audits every action it takes in
one place (`Engine.audit`, which `record_intent` goes through too). An Event is queued
there, from the audit action, in the same transaction, for every kind of change at once:
a new kind of change whose steps are audited gets Events without a line here (a step kind
this table does not name still says "StepDone"-like words, `<Kind>Done`). The table below
maps an audit action (and, for a step's moves, the step's kind) to the Event's reason (a
CamelCase word), its type (Normal, Warning) and the object it regards: the node; the
ClusterPolicy or NVIDIADriver a driver version was set on, and its node; the nodes of a
wave a gate holds or lets go; the node a halted run stopped on. Nothing here is sent from
a step: the step never waits on the events API, and a refused or unanswered Event never
blocks or fails it.

Sending is the Lease holder's (`KubeEventSender`, run beside the notifier and the engine
by bot/wiring.py): it reads the queue (storage.kube_events), creates each Event, and a
repeat of one (the same run, object and reason: a pod evicted again, a gate held again)
becomes the Event's series (`series.count`, `lastObservedTime`), patched on the Event
already created, not a new Event per retry. An API that refuses Events (403: the grant
is missing; 422) gives that Event up; one that does not answer is tried again with a
backoff; either is logged once when it starts and once when Events flow again, not per
try. The queue is pruned of Events older than the API's own event lifetime.

Dry runs change nothing, so they report nothing here.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Protocol

from storage import approvals as stored_approvals
from storage import codec
from storage import kube_events as queued
from storage.database import Database
from storage.kube_events import KubeEventRow
from storage.runs import Run
from workflows.engine import event_messages as say
from workflows.engine.context import RunInfo
from workflows.kube.errors import Conflict, Forbidden, Invalid, KubeError, NotFound

log = logging.getLogger("gpuops.events")

REPORTING_CONTROLLER = "gpuops"
# Where Events about cluster-scoped objects (nodes, the operator's CRs) live, as the
# kubelet's do.
EVENTS_NAMESPACE = "default"
# A gate holding a wave of many nodes tells at most this many of them.
_WAVE_NODES_AT_MOST = 100

EventType = Literal["Normal", "Warning"]
# What an Event regards: the step's node, the changed object (and its node), the nodes of
# the wave in question, the node a halted run stopped on.
About = Literal["node", "object", "wave", "halted-node"]


@dataclass(frozen=True)
class EventRule:
    reason: str
    type: EventType
    about: About


# Audit actions that are Events whatever the step's kind.
BY_ACTION: dict[str, EventRule] = {
    "pod.evict": EventRule("PodEvicted", "Normal", "node"),
    "pod.delete": EventRule("PodDeleted", "Warning", "node"),
    "pods.returned": EventRule("PodsReturned", "Warning", "node"),
    "step.pdb-blocked": EventRule("EvictionBlocked", "Warning", "node"),
    "driver-version.set": EventRule("DriverVersionSet", "Normal", "object"),
    "driver-version.set-back": EventRule("DriverVersionSetBack", "Warning", "object"),
    "gpu-check.passed": EventRule("GpuCheckPassed", "Normal", "node"),
    "node.left_out": EventRule("NodeLeftOut", "Warning", "node"),
    "node.restore": EventRule("NodeRestored", "Normal", "node"),
    "run.failed": EventRule("Halted", "Warning", "halted-node"),
    "run.waiting": EventRule("GateHeld", "Normal", "wave"),
    "run.frozen": EventRule("GateHeld", "Normal", "wave"),
    "run.unfrozen": EventRule("GateReleased", "Normal", "wave"),
    "run.wave": EventRule("WaveStarted", "Normal", "wave"),
}
# A step's moves by its kind: (action, kind) -> rule; None: no Event (another action
# tells it). Any other `step.done` is `<Kind>Done`, any other `step.failed` StepFailed.
BY_STEP: dict[tuple[str, str], EventRule | None] = {
    ("step.done", "cordon"): EventRule("Cordoned", "Normal", "node"),
    ("step.running", "evict"): EventRule("EvictionStarted", "Normal", "node"),
    ("step.running", "drain"): EventRule("EvictionStarted", "Normal", "node"),
    ("step.done", "evict"): EventRule("Drained", "Normal", "node"),
    ("step.done", "drain"): EventRule("Drained", "Normal", "node"),
    ("step.done", "driver"): EventRule("DriverPodRestarted", "Normal", "node"),
    ("step.done", "mig"): EventRule("MigLayoutSet", "Normal", "node"),
    ("step.done", "validate"): EventRule("NodeValidated", "Normal", "node"),
    ("step.done", "gpu-check"): None,  # gpu-check.passed
    ("step.done", "driver-version"): None,  # driver-version.set
    ("step.failed", "gpu-check"): EventRule("GpuCheckFailed", "Warning", "node"),
    ("step.done", "uncordon"): EventRule("Uncordoned", "Normal", "node"),
    ("step.done", "hold"): EventRule("HoldEnded", "Normal", "node"),
    ("step.done", "wait-for-jobs"): EventRule("JobsFinished", "Normal", "node"),
}

# The operator's custom resources a driver version is set on, by the kind an audit
# target names ("ClusterPolicy cluster-policy").
_OBJECT_API_VERSIONS = {"ClusterPolicy": "nvidia.com/v1", "NVIDIADriver": "nvidia.com/v1alpha1"}


@dataclass(frozen=True)
class Regarding:
    """The object an Event is about (cluster-scoped, as every object gpuops changes)."""

    kind: str
    name: str
    api_version: str

    def to_json(self) -> dict[str, str]:
        # NB: a node's uid is its name here, as the kubelet's Events have it: `kubectl
        # describe node` looks for both, and no read of the node is needed.
        uid = {"uid": self.name} if self.kind == "Node" else {}
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, **uid}


@dataclass(frozen=True)
class EventDraft:
    """One Event an audited action makes: its reason, type, object and what it did."""

    reason: str
    type: EventType
    action: str
    regarding: Regarding
    what: str


def _camel(kind: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in kind.replace("_", "-").split("-") if part)


def _node(name: str) -> Regarding:
    return Regarding("Node", name, "v1")


def rule_for(action: str, kind: str | None) -> EventRule | None:
    """The Event rule of an audit action (a step's move by its kind), or None."""
    if action in BY_ACTION:
        return BY_ACTION[action]
    if action in ("step.done", "step.running", "step.failed") and kind is not None:
        if (action, kind) in BY_STEP:
            return BY_STEP[(action, kind)]
        if action == "step.done":
            return EventRule(f"{_camel(kind)}Done", "Normal", "node")
        if action == "step.failed":
            return EventRule("StepFailed", "Warning", "node")
    return None


def drafts_for(action: str, *, target: str, detail: Mapping[str, Any], node: str | None,
               wave_nodes: Sequence[str] = ()) -> list[EventDraft]:
    """The Events an audited action makes (none for most): pure, from the action, its
    target and detail, the node of the step it belongs to, and the nodes of the wave in
    question (for a gate or a wave)."""
    kind = detail.get("kind") if isinstance(detail.get("kind"), str) else None
    rule = rule_for(action, kind)
    if rule is None:
        return []
    objects: list[Regarding] = []
    if rule.about == "node" and node:
        objects = [_node(node)]
    elif rule.about == "object":
        object_kind, _, name = target.partition(" ")
        if object_kind in _OBJECT_API_VERSIONS and name:
            objects.append(Regarding(object_kind, name, _OBJECT_API_VERSIONS[object_kind]))
        if node:
            objects.append(_node(node))
    elif rule.about == "halted-node":
        halted = detail.get("node")
        objects = [_node(halted)] if isinstance(halted, str) and halted else []
    elif rule.about == "wave":
        objects = [_node(n) for n in list(dict.fromkeys(wave_nodes))[:_WAVE_NODES_AT_MOST]]
    what = say.event_what(rule.reason, kind=kind, detail=detail)
    machine_action = (kind or action)[:128]
    return [EventDraft(rule.reason, rule.type, machine_action, regarding, what) for regarding in objects]


def event_key(run_id: str, draft: EventDraft) -> str:
    """What makes two Events the same one (a repeat, counted in its series): the run, the
    object and the reason."""
    return f"{run_id}/{draft.regarding.kind}/{draft.regarding.name}/{draft.reason}"


def event_name(key: str, regarding: Regarding) -> str:
    """The Event's metadata.name: the object's name and a hash of the key, so a create
    repeated after a crash finds the one it made (409) instead of making a second."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{regarding.name[:200]}.gpuops-{digest}".lower()


def event_body(draft: EventDraft, *, name: str, note: str, replica: str, at: dt.datetime,
               run_id: str) -> dict[str, Any]:
    """The Event as created (its series is added when it is sent, if it repeated)."""
    return {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": EVENTS_NAMESPACE, "labels": {"gpuops.io/run": run_id}},
        "eventTime": codec.time_to_text(at),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": replica[:128],
        "action": draft.action, "reason": draft.reason, "type": draft.type, "note": note,
        "regarding": draft.regarding.to_json(),
    }


def queue_events_for(db: Database, run: Run, info: RunInfo, *, action: str, target: str, after: Any,
                     detail: Mapping[str, Any], node: str | None, replica: str, zone: dt.tzinfo,
                     at: dt.datetime, people: Mapping[str, str] = MappingProxyType({})) -> int:
    """Inside the transaction that audits `action`: queue the Events it makes (a repeat
    counts in the Event's series). Returns how many were queued or counted. `people`: the
    configured names of approvers, by user id (else the id names them)."""
    if run.dry_run:
        return 0
    wave_nodes: Sequence[str] = ()
    if isinstance(nodes := detail.get("nodes"), list):
        wave_nodes = [str(n) for n in nodes]
    else:
        wave = detail.get("wave")
        if not isinstance(wave, int):
            wave = after if isinstance(after, int) else (run.current_wave or 0)
        if 0 <= wave < len(info.plan.waves):
            wave_nodes = [str(n) for n in info.plan.waves[wave].nodes]
    drafts = drafts_for(action, target=target, detail=detail, node=node, wave_nodes=wave_nodes)
    if not drafts:
        return 0
    request = info.request
    approvers = [people.get(a.approver, a.approver) for a in stored_approvals.for_request(db, request_id=request.id,
                                                                   plan_hash=request.plan_hash)
                 if a.decision == "approve"]
    for draft in drafts:
        note = say.event_note(draft.what, run_id=run.id, request_id=request.id, request_kind=request.kind,
                              pool=request.pool, approvers=approvers, window_start=request.window_start,
                              window_end=request.window_end, zone=zone)
        key = event_key(run.id, draft)
        name = event_name(key, draft.regarding)
        queued.queue_kube_event(db, key=key, cluster=request.cluster, namespace=EVENTS_NAMESPACE, name=name,
                                body=event_body(draft, name=name, note=note, replica=replica, at=at, run_id=run.id),
                                at=at)
    return len(drafts)


def queue_person_event(db: Database, *, run_id: str, node: str, what: str, cluster: str | None, replica: str,
                       at: dt.datetime) -> None:
    """Inside the transaction that audits it: the Event of a node given back by a person
    through gpuops (`/gpu uncordon`, outside any run's steps), about the run whose cordon
    it ends; `what` says who did it."""
    draft = EventDraft("Uncordoned", "Normal", "uncordon", _node(node), what)
    key = event_key(run_id, draft)
    name = event_name(key, draft.regarding)
    queued.queue_kube_event(db, key=key, cluster=cluster, namespace=EVENTS_NAMESPACE, name=name,
                            body=event_body(draft, name=name, note=say.person_note(what), replica=replica, at=at,
                                            run_id=run_id), at=at)


# --- sending -----------------------------------------------------------------------------


class EventWrites(Protocol):
    """What the sender needs of the gateway (`workflows.kube.gateway.KubeGateway`)."""

    def create_kube_event(self, namespace: str, body: dict[str, Any]) -> None: ...

    def patch_kube_event_series(self, namespace: str, name: str, *, count: int,
                                last_observed: dt.datetime) -> None: ...


SenderState = Literal["flowing", "refused", "unreachable"]


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class KubeEventSender:
    """Sends the queued Events of one cluster's API (`clusters`: the cluster names whose
    Events go there; None for requests that name none), on the replica holding the Lease.
    `send_due` is one pass; `run` passes until stopped."""

    BATCH = 50
    RETRY_MAX = dt.timedelta(seconds=60)

    def __init__(self, *, db: Database, gateway: EventWrites, clusters: Sequence[str | None] = (None,),
                 clock: Callable[[], dt.datetime] = _utc_now) -> None:
        self._db = db
        self._gateway = gateway
        self._clusters = tuple(clusters)
        self._clock = clock
        # Logged once per change, never per try: whether Events flow, are refused, or the
        # API does not answer.
        self.state: SenderState = "flowing"

    def send_due(self) -> int:
        """Prune old Events, then send those due; returns how many were sent."""
        now = self._clock()
        with self._db.transaction():
            queued.prune_kube_events(self._db, now=now)
        sent = 0
        for row in queued.kube_events_due(self._db, now=now, limit=self.BATCH, clusters=self._clusters):
            if self._send(row, now):
                sent += 1
            elif self.state == "unreachable":
                break  # one unanswered call is enough: the rest wait for the next pass, not a deadline each
        return sent

    def run(self, stop: threading.Event, *, gate: Callable[[], bool], every: float = 1.0) -> None:
        """Pass every `every` seconds until `stop`, only while `gate()` (the Lease is held)."""
        while not stop.is_set():
            if gate():
                self.send_due()
            stop.wait(every)

    def _send(self, row: KubeEventRow, now: dt.datetime) -> bool:
        try:
            if row.sent_count == 0:
                body = dict(row.body) if isinstance(row.body, dict) else {}
                if row.count > 1:
                    body["series"] = {"count": row.count, "lastObservedTime": codec.time_to_text(row.last_at)}
                try:
                    self._gateway.create_kube_event(row.namespace, body)
                except Conflict:
                    # Made before (the process stopped before marking it): count from there.
                    with self._db.transaction():
                        queued.mark_kube_event_sent(self._db, id=row.id, count=1)
                    return False
            else:
                try:
                    self._gateway.patch_kube_event_series(row.namespace, row.name, count=row.count,
                                                          last_observed=row.last_at)
                except NotFound:
                    with self._db.transaction():  # expired or deleted: made again with its series
                        queued.mark_kube_event_gone(self._db, id=row.id)
                    return False
        except (Forbidden, Invalid, ValueError) as err:
            with self._db.transaction():
                queued.mark_kube_event_failed(self._db, id=row.id, error=str(err), retry_at=None)
            self._now_in("refused", say.events_refused(str(err)))
            return False
        except KubeError as err:
            delay = min(self.RETRY_MAX, dt.timedelta(seconds=2 ** min(row.attempts, 6)))
            with self._db.transaction():
                queued.mark_kube_event_failed(self._db, id=row.id, error=str(err), retry_at=now + delay)
            self._now_in("unreachable", say.events_unreachable(str(err)))
            return False
        with self._db.transaction():
            queued.mark_kube_event_sent(self._db, id=row.id, count=row.count)
        self._now_in("flowing", say.events_flowing())
        return True

    def _now_in(self, state: SenderState, text: str) -> None:
        if state != self.state:
            (log.info if state == "flowing" else log.warning)("%s", text)
        self.state = state
