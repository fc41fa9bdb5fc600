"""What the engine's parts (workflows.engine.loop, .waves, .wave_gates, .transitions) share:
what the parts may ask of the engine (`EngineCore`: its clock, lease, transactions and
records), a run in flight's request and plan (`RunInfo`), what this process knows about a
step in flight beyond the database (`LiveStep`), the context a step's logic sees for one
evaluation (`EngineStepContext`, the engine's `workflows.engine.steps.StepContext`), and
`Changed`, a compare-and-set that lost."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from storage import audit, outbox
from storage import runs as stored_runs
from storage.database import Database
from storage.ids import RunId, StepId
from storage.requests import Request
from storage.runs import Run
from storage.step_params import StepParams, StepParamsError, decode
from storage.steps import Step, StepKind
from workflows.engine.runs import step_intent, step_params
from workflows.engine.steps.table import logic_for
from workflows.fleet.assessment import NodeInventory
from workflows.kube.gateway import KubeGateway
from workflows.plans import Plan


class Changed(Exception):
    """A compare-and-set lost: someone (an abort, another replica) moved the row first."""


@dataclass
class RunInfo:
    request: Request
    plan: Plan


@dataclass
class LiveStep:
    """What this process knows about a step in flight, beyond the database."""

    step_id: StepId
    # Per-object intents on record (their audit rows' keys), with when each was recorded.
    intents: dict[str, dt.datetime] = field(default_factory=dict)
    evaluate_now: bool = True
    due: float | None = None
    failures: int = 0
    reason: str | None = None
    # Notices already posted for this step (their outbox dedupe keys).
    noticed: set[str] = field(default_factory=set)
    # The extension control's end last evaluated (`runs.extended_by_control`; a new one is
    # looked at at once).
    extended_until: dt.datetime | str | None = None


class NodeSource(Protocol):
    """What the engine reads from the watch cache (workflows.fleet.watchcache.FleetCache)."""

    def add_listener(self, listener: Callable[[str, str, Any], None]) -> None: ...

    def fleet(self, now: dt.datetime) -> Any: ...


class EngineTimings(Protocol):
    """The settings the engine's parts read (`workflows.engine.loop.EngineSettings`)."""

    @property
    def max_parallel_nodes(self) -> int: ...

    @property
    def resync(self) -> dt.timedelta: ...

    @property
    def api_retry_max(self) -> dt.timedelta: ...

    @property
    def display_zone(self) -> dt.tzinfo: ...


class EngineCore(Protocol):
    """What the engine's parts ask of the engine (`workflows.engine.loop.Engine`): its
    clocks, its transactions (each checks the lease), the records every move writes, and
    what it knows beyond the database."""

    @property
    def db(self) -> Database: ...

    @property
    def gateway(self) -> KubeGateway: ...

    @property
    def cache(self) -> NodeSource: ...

    @property
    def replica(self) -> str: ...

    @property
    def settings(self) -> EngineTimings: ...

    @property
    def clock(self) -> Callable[[], dt.datetime]: ...

    @property
    def monotonic(self) -> Callable[[], float]: ...

    @property
    def live(self) -> dict[StepId, LiveStep]: ...

    def commit(self) -> AbstractContextManager[None]: ...

    def check_lease(self) -> None: ...

    def audit(self, run: Run, info: RunInfo, *, action: str, target: str, before: Any, after: Any,
              detail: Mapping[str, Any]) -> audit.AuditEntry: ...

    def notify(self, run: Run, info: RunInfo, *, event: str, state: str, text: str, kind: outbox.MessageKind,
               dedupe: str | None, node: str | None = None, halted_on: str | None = None) -> None: ...

    def fail_run(self, run: Run, info: RunInfo, now: dt.datetime, *, stopped: str,
                 text: Callable[[tuple[str, ...]], str], detail: Mapping[str, Any]) -> None: ...

    def unfinished(self) -> list[Run]: ...

    def ours(self, request: Request) -> bool: ...

    def look_again(self, step_id: StepId, *, at: float) -> None: ...

    def in_flight(self, step_id: StepId) -> bool: ...

    def record_intent(self, run: Run, info: RunInfo, step: Step, live: LiveStep, *, key: str, action: str,
                      target: str, detail: Mapping[str, Any]) -> None: ...

    def node_inventory(self, node: str, now: dt.datetime) -> NodeInventory | None: ...


def _typed_params(step: Step) -> StepParams | Mapping[str, Any]:
    """The step's stored params as the record its logic reads. A row the codec refuses
    stays as stored: the logic's first read of it (`params_of`) raises the same
    `StepParamsError` inside the engine's call, and the step fails with its words."""
    raw = step_params(step)
    try:
        return decode(logic_for(step.kind).params, raw, kind=step.kind)
    except StepParamsError:
        return raw


class EngineStepContext:
    """`workflows.engine.steps.StepContext` for one evaluation of one step."""

    def __init__(self, engine: EngineCore, run: Run, info: RunInfo, step: Step, live: LiveStep,
                 steps: Sequence[Step], *, intent: Mapping[str, Any]) -> None:
        self._engine = engine
        self._run = run
        self._info = info
        self._step = step
        self._live = live
        self._steps = steps
        # Annotated as the protocol has them (its attributes are invariant).
        self.run_id: str = run.id
        self.request_id: str = info.request.id
        self.node = step.node
        self.kind: StepKind = step.kind
        self.params: StepParams | Mapping[str, Any] = _typed_params(step)
        self.intent = intent
        self.plan_kind: str = info.plan.kind
        self.dry_run = run.dry_run
        self.now = engine.clock()
        self.zone: dt.tzinfo = engine.settings.display_zone
        self.timeout: dt.timedelta | None = None
        self.deadline: dt.datetime | None = None
        self.cordoned_by = f"gpuops for {info.request.requester_name}"
        self.window_end = info.request.window_end
        self.gateway = engine.gateway

    @property
    def expired(self) -> bool:
        return self.deadline is not None and self.now >= self.deadline

    def act(self) -> None:
        self._engine.check_lease()

    def record(self, *, key: str, action: str, target: str, detail: Mapping[str, Any]) -> None:
        self._engine.record_intent(self._run, self._info, self._step, self._live, key=key, action=action,
                                   target=target, detail=detail)

    def recorded(self, key: str) -> bool:
        return key in self._live.intents

    def recorded_at(self, key: str) -> dt.datetime | None:
        return self._live.intents.get(key)

    def node_inventory(self) -> NodeInventory | None:
        return self._engine.node_inventory(self.node, self.now)

    def step_intent(self, kind: StepKind) -> Mapping[str, Any] | None:
        for step in self._steps:
            if step.node == self.node and step.kind == kind and step.seq < self._step.seq:
                return step_intent(step)
        return None

    def run_unfinished(self, run_id: str) -> bool:
        other = stored_runs.get(self._engine.db, id=RunId(run_id))
        return other is not None and not other.finished
