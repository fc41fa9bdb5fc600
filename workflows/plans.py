"""Plans: what a drain, driver upgrade or MIG change will do, node by node, wave by wave.

A `Plan` is a value. Approvers approve one exact plan, named by `plan_hash(plan)`: the
sha256 of the plan's canonical JSON (sorted keys, no insignificant whitespace, UTF-8),
so the hash is the same in every process and does not depend on dict ordering.

Equality follows the hash: two plans are equal exactly when their canonical JSON is
equal. (Python alone would call `{"force": True}` and `{"force": 1}` equal although they
serialise differently; a plan that compared equal to another but hashed differently
would make "you approved this plan" ambiguous.)

Step parameters are JSON values (str, int, float, bool, None, and lists and maps of
those); they are frozen on construction (maps become read-only, lists become tuples).
Plans build them as typed records (`NodeStep.of`, `storage.step_params`), whose codec
writes the same JSON as the maps plans wrote before records existed: the hash of a plan
does not depend on how it was built.
Times in the summary must be timezone-aware; they are written as UTC text.

A summary's pre-flight (`PreflightNote`s, written by `workflows.preflight`) is part of the
hash like every other fact; a summary without one writes no `preflight` key, so plans
stored before pre-flight existed decode and hash as they did.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from storage import codec
from storage.step_params import StepParams, encode
from storage.steps import NewStep, StepKind
from workflows.kinds import kinds_in_force
from workflows.kube.objects import NodeName

PLAN_FORMAT = 1
# How many hex digits of a plan hash people see ("hash 3f9a1c0e…"); also the shortest
# prefix an approver may type instead of the whole hash.
SHORT_HASH_LENGTH = 8


class PlanFormatError(ValueError):
    """Stored or received plan JSON that does not describe a valid plan."""


def _canonical_text(value: Any) -> str:
    return codec.json_to_text(value)


class _ByCanonicalJson:
    """Equality and hashing by canonical JSON (see the module docstring)."""

    __slots__ = ()

    def to_json(self) -> Any:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return _canonical_text(self.to_json()) == _canonical_text(other.to_json())

    def __hash__(self) -> int:
        return hash(_canonical_text(self.to_json()))


# ------------------------------------------------------------------ the values


@dataclass(frozen=True, eq=False)
class NodeStep(_ByCanonicalJson):
    """One action on one node, e.g. `NodeStep("driver", "gpu-01", {"version": "580.95.05"})`."""

    kind: StepKind
    node: NodeName
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = kinds_in_force().step_kinds
        if self.kind not in known:
            raise ValueError(f"unknown step kind {self.kind!r}; use one of {sorted(known)}")
        if not self.node:
            raise ValueError("a step needs a node name")
        object.__setattr__(self, "params", _freeze_mapping(self.params, where="step params"))

    @classmethod
    def of(cls, kind: StepKind, node: NodeName, params: StepParams) -> NodeStep:
        """The step of `kind` on `node` with a typed record's params, as stored."""
        return cls(kind, node, encode(params))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "node": self.node, "params": _thaw(self.params)}


@dataclass(frozen=True, eq=False)
class Wave(_ByCanonicalJson):
    """Nodes changed together; the next wave starts when this one is done and healthy.
    `steps` run in order per node (all steps of a node are in its wave)."""

    index: int
    nodes: tuple[NodeName, ...]
    steps: tuple[NodeStep, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "steps", tuple(self.steps))
        if self.index < 0:
            raise ValueError(f"wave index must be 0 or more, not {self.index}")
        if len(set(self.nodes)) != len(self.nodes):
            raise ValueError(f"wave {self.index} lists a node twice: {list(self.nodes)}")
        strangers = sorted({s.node for s in self.steps} - set(self.nodes))
        if strangers:
            raise ValueError(f"wave {self.index} has steps for nodes it does not hold: {strangers}")

    def steps_for(self, node: str) -> tuple[NodeStep, ...]:
        return tuple(s for s in self.steps if s.node == node)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "nodes": list(self.nodes),
            "steps": [s.to_json() for s in self.steps],
        }


# How much a pre-flight note matters to an approver: "critical" (the run would halt or
# hurt something unless someone acts), "warning" (it may), "info" (worth knowing).
PreflightSeverity: TypeAlias = Literal["critical", "warning", "info"]
PREFLIGHT_SEVERITIES: tuple[PreflightSeverity, ...] = ("critical", "warning", "info")


@dataclass(frozen=True, eq=False)
class PreflightNote(_ByCanonicalJson):
    """One thing a pre-flight check found, as the plan carries it: which `check` said it
    ("nodes", "budgets", ...), a `code` naming what it found ("left-out", "included",
    "budget-blocks", ...), how much it matters, the `sentence` the approver reads, the
    nodes it is about and its `details` (one line each, e.g. the pods a budget holds)."""

    check: str
    code: str
    severity: PreflightSeverity
    sentence: str
    nodes: tuple[NodeName, ...] = ()
    details: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "details", tuple(self.details))
        if self.severity not in PREFLIGHT_SEVERITIES:
            raise ValueError(f"pre-flight severity {self.severity!r} is not one of {list(PREFLIGHT_SEVERITIES)}")
        if not self.check or not self.code or not self.sentence:
            raise ValueError("a pre-flight note needs its check, its code and its sentence")

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "code": self.code, "severity": self.severity, "sentence": self.sentence,
                "nodes": list(self.nodes), "details": list(self.details)}

    @classmethod
    def from_json(cls, value: Any) -> PreflightNote:
        data = _expect_mapping(value, "pre-flight note")
        return cls(check=data["check"], code=data["code"], severity=data["severity"], sentence=data["sentence"],
                   nodes=tuple(NodeName(n) for n in data["nodes"]), details=tuple(data["details"]))


@dataclass(frozen=True, eq=False)
class PlanSummary(_ByCanonicalJson):
    """The facts an approver reads before approving. All are part of the hash, so a new
    window or driver version needs fresh approvals."""

    target_driver_version: str | None = None
    target_mig_config: str | None = None
    window_start: dt.datetime | None = None
    window_end: dt.datetime | None = None
    evictions_expected: int = 0
    # The most GPUs out of service at once (the largest wave's GPUs).
    max_gpus_unavailable: int = 0
    # Anything else the planner wants the approver to read, one sentence each.
    notes: tuple[str, ...] = ()
    # What the pre-flight checks found (workflows.preflight), in the order they ran.
    preflight: tuple[PreflightNote, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "preflight", tuple(self.preflight))
        for name in ("window_start", "window_end"):
            at = getattr(self, name)
            if at is not None and (at.tzinfo is None or at.utcoffset() is None):
                raise ValueError(f"plan summary {name} must be timezone-aware, not {at.isoformat()}")
        if self.window_start and self.window_end and self.window_end <= self.window_start:
            raise ValueError("plan window must end after it starts")
        if self.evictions_expected < 0 or self.max_gpus_unavailable < 0:
            raise ValueError("plan summary counts cannot be negative")

    def with_preflight(self, *found: PreflightNote) -> PlanSummary:
        """This summary and more pre-flight notes after the ones it has."""
        return dataclasses.replace(self, preflight=(*self.preflight, *found))

    def to_json(self) -> dict[str, Any]:
        written: dict[str, Any] = {
            "target_driver_version": self.target_driver_version,
            "target_mig_config": self.target_mig_config,
            "window_start": codec.optional_time_to_text(self.window_start),
            "window_end": codec.optional_time_to_text(self.window_end),
            "evictions_expected": self.evictions_expected,
            "max_gpus_unavailable": self.max_gpus_unavailable,
            "notes": list(self.notes),
        }
        # NB: only when there is one, so a plan stored before pre-flight hashes as it did.
        if self.preflight:
            written["preflight"] = [note.to_json() for note in self.preflight]
        return written


@dataclass(frozen=True, eq=False)
class Plan(_ByCanonicalJson):
    """What one request will do to one pool, in waves.

    `created_for` is the Slack user id of the person the plan was built for (the
    requester); it is part of the hash, so a plan reviewed as Ada's is not Bob's."""

    kind: str  # a kind of change (workflows/kinds.py)
    pool: str
    waves: tuple[Wave, ...]
    summary: PlanSummary
    created_for: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "waves", tuple(self.waves))
        if self.kind not in kinds_in_force():
            raise ValueError(f"unknown plan kind {self.kind!r}; use one of {sorted(kinds_in_force().names)}")
        if not self.pool:
            raise ValueError("a plan needs a pool")
        indexes = [w.index for w in self.waves]
        if indexes != list(range(len(self.waves))):
            raise ValueError(f"waves must be numbered 0, 1, 2, ... in order; got {indexes}")
        seen: dict[str, int] = {}
        for wave in self.waves:
            for node in wave.nodes:
                if node in seen:
                    raise ValueError(f"node {node} is in wave {seen[node]} and wave {wave.index}")
                seen[node] = wave.index

    @property
    def nodes(self) -> tuple[NodeName, ...]:
        """Every node the plan touches, in the order the waves take them."""
        return tuple(node for wave in self.waves for node in wave.nodes)

    def new_steps(self) -> list[NewStep]:
        """The plan's steps as storage rows for a run (`seq` counts per node from 0)."""
        rows: list[NewStep] = []
        for wave in self.waves:
            for node in wave.nodes:
                for seq, step in enumerate(wave.steps_for(node)):
                    rows.append(
                        NewStep(wave=wave.index, node=node, seq=seq, kind=step.kind,
                                detail=_thaw(step.params))
                    )
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "kind": self.kind,
            "pool": self.pool,
            "waves": [w.to_json() for w in self.waves],
            "summary": self.summary.to_json(),
            "created_for": self.created_for,
        }


# ------------------------------------------------------------------ hashing and JSON


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as a JSON value (what `storage.requests` keeps in its `plan` column)."""
    return plan.to_json()


def plan_hash(plan: Plan) -> str:
    """sha256 (hex) of the plan's canonical JSON; stable across processes."""
    return hashlib.sha256(_canonical_text(plan_to_json(plan)).encode("utf-8")).hexdigest()


def short_hash(full_hash: str) -> str:
    """The first digits of a plan hash, as people see it."""
    return full_hash[:SHORT_HASH_LENGTH]


def plan_from_json(value: object) -> Plan:
    """The plan `plan_to_json` wrote (a mapping, or its JSON text). Raises
    `PlanFormatError` saying what is wrong with anything else."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise PlanFormatError(f"plan is not valid JSON: {err}") from None
    try:
        data = _expect_mapping(value, "plan")
        if data.get("format") != PLAN_FORMAT:
            raise PlanFormatError(
                f"plan format {data.get('format')!r} is not one this gpuops reads ({PLAN_FORMAT})"
            )
        summary = _expect_mapping(data["summary"], "plan summary")
        return Plan(
            kind=data["kind"],
            pool=data["pool"],
            created_for=data["created_for"],
            summary=PlanSummary(
                target_driver_version=summary["target_driver_version"],
                target_mig_config=summary["target_mig_config"],
                window_start=codec.optional_time_from_text(summary["window_start"]),
                window_end=codec.optional_time_from_text(summary["window_end"]),
                evictions_expected=summary["evictions_expected"],
                max_gpus_unavailable=summary["max_gpus_unavailable"],
                notes=tuple(summary["notes"]),
                preflight=tuple(PreflightNote.from_json(n) for n in summary.get("preflight", ())),
            ),
            waves=tuple(
                Wave(
                    index=wave["index"],
                    nodes=tuple(NodeName(n) for n in wave["nodes"]),
                    steps=tuple(
                        NodeStep(kind=s["kind"], node=NodeName(s["node"]), params=s["params"])
                        for s in wave["steps"]
                    ),
                )
                for wave in (_expect_mapping(w, "wave") for w in data["waves"])
            ),
        )
    except PlanFormatError:
        raise
    except KeyError as err:
        raise PlanFormatError(f"plan JSON lacks the field {err.args[0]!r}") from None
    except (TypeError, ValueError) as err:
        raise PlanFormatError(f"plan JSON does not describe a valid plan: {err}") from None


def _expect_mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PlanFormatError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


# ------------------------------------------------------------------ freezing params


def _freeze_mapping(value: Any, *, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} must be a mapping, not {type(value).__name__}")
    frozen = _freeze(value, where=where)
    assert isinstance(frozen, Mapping)
    return frozen


def _freeze(value: Any, *, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} cannot hold {value!r}: JSON has no NaN or infinity")
        return value
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{where} keys must be text, not {key!r}")
        return types.MappingProxyType({k: _freeze(v, where=where) for k, v in value.items()})
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return tuple(_freeze(v, where=where) for v in value)
    raise TypeError(f"{where} hold JSON values only, not {type(value).__name__}")


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value
