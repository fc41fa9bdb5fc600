"""What every step is given and answers: the engine's `StepContext`, the outcomes
(`Done`, `Waiting` with its `StepNotice`, `LeftOut`, `Failed`), the `StepLogic` protocol
the families implement, and `params_of`, which gives a step its typed params (the record
its logic names, `storage.step_params`; a bad param is a `StepParamsError`, and the step
fails with its words).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from storage.step_params import StepParams, StepParamsError, decode
from storage.steps import StepKind
from workflows.engine.halt_messages import HaltCode
from workflows.fleet.assessment import NodeInventory
from workflows.kube.gateway import KubeGateway

__all__ = ["StepParamsError"]

_P = TypeVar("_P", bound=StepParams)


class LeaseLost(Exception):
    """This replica does not hold the engine lease (any more): it must not act."""


# --- outcomes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    note: str
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepNotice:
    """Something people should hear about while a step waits (a PodDisruptionBudget
    holding up an eviction, a window about to end): posted once per step and `key` in
    the request's thread."""

    key: str
    text: str
    # One notice for the whole run rather than one per node's step.
    per_run: bool = False
    # What makes it news again under the same key (a drain's extended end), if anything.
    again_for: str | None = None


@dataclass(frozen=True)
class Waiting:
    reason: str
    # Look again after this many seconds even without a watch event (None: only on
    # events, plus the engine's slow safety resync).
    retry_in: float | None = None
    # The step handles its own deadline (it escalated and is finishing that off).
    overdue_ok: bool = False
    notice: StepNotice | None = None


@dataclass(frozen=True)
class LeftOut:
    """The node is left out of the run: its remaining steps are skipped, except that a
    node this run cordoned is given back (its `uncordon` step still runs); the run goes
    on with the other nodes."""

    reason: str
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    reason: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    # Why the run halts, as a stable code (its runbook); a kind's step without one of its
    # own halts as "step-failed".
    code: HaltCode = "step-failed"


Outcome = Done | Waiting | Failed | LeftOut


class StepContext(Protocol):
    """What a step may see and do; the engine provides it."""

    run_id: str
    request_id: str
    node: str
    kind: StepKind
    # The step's params: the record its logic names (`StepLogic.params`), decoded from the
    # stored row by the engine; a test may give the stored JSON itself (see `params_of`).
    params: StepParams | Mapping[str, Any]
    # The intent `prepare` returned (stored with the move to running).
    intent: Mapping[str, Any]
    plan_kind: str
    dry_run: bool
    now: dt.datetime
    # The zone times are written in for people (the display zone, `display.timezone`).
    zone: dt.tzinfo
    # How long the step may take, and when that is up (None: no limit).
    timeout: dt.timedelta | None
    deadline: dt.datetime | None
    # Who the cordon mark says asked for the change ("gpuops for alice").
    cordoned_by: str
    window_end: dt.datetime | None
    gateway: KubeGateway

    @property
    def expired(self) -> bool: ...

    def act(self) -> None:
        """Call before every side effect: raises LeaseLost unless this replica holds the lease."""

    def record(self, *, key: str, action: str, target: str, detail: Mapping[str, Any]) -> None:
        """Commit an audit row for this step's intent `key`, unless one was recorded
        already (by this process or before a restart)."""

    def recorded(self, key: str) -> bool: ...

    def recorded_at(self, key: str) -> dt.datetime | None:
        """When the audit row for intent `key` was committed; None if it was not."""

    def node_inventory(self) -> NodeInventory | None:
        """The node as the watch cache sees it now."""

    def step_intent(self, kind: StepKind) -> Mapping[str, Any] | None:
        """The intent of this node's earlier step of `kind` in this run, if any."""

    def run_unfinished(self, run_id: str) -> bool:
        """Whether another run is still pending, running or paused."""


# --- the step kinds ----------------------------------------------------------------------


class StepLogic(Protocol):
    @property
    def params(self) -> type[StepParams]:
        """The record this logic reads its params as (`storage.step_params`)."""

    def timeout(self, ctx: StepContext) -> dt.timedelta | None: ...

    def prepare(self, ctx: StepContext) -> dict[str, Any]: ...

    def advance(self, ctx: StepContext) -> Outcome: ...


def params_of(ctx: StepContext, record: type[_P]) -> _P:
    """The step's params as `record`: the engine gives the decoded record; stored JSON (a
    test's context) goes through the same codec. StepParamsError for a row of another shape."""
    params = ctx.params
    if isinstance(params, record):
        return params
    if isinstance(params, StepParams):
        raise StepParamsError(f"{ctx.kind} step: params are {type(params).__name__}, not {record.__name__}")
    return decode(record, params, kind=ctx.kind)


def pod_ref(pod: str) -> tuple[str, str]:
    """A pod as the intent names it, "namespace/name" (neither part holds a slash)."""
    namespace, _, name = pod.partition("/")
    return namespace, name
