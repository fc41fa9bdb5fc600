"""Step parameters as typed records, and the one codec between them and the JSON a step row
stores (`{"params": ...}` in the steps table's detail, and the plan a person approves).

Each step kind reads one frozen dataclass (`StepParams` or a subclass): a field is a key of
the stored JSON, under the same name. The codec:

- `decode(record, raw, kind=...)` turns stored JSON into the record: numbers stay as they
  were written, lists become tuples, times (fields typed `datetime`) are read from UTC text
  (the storage form `2025-06-07T12:00:00.000000Z` or any ISO-8601 text with a zone). Keys
  the record does not name are left out (rows carry who-and-when notes, such as
  `released_by_user`, that no step reads). A key of the wrong shape is a `StepParamsError`
  naming the step kind and the key.
- `encode(record)` writes the JSON a plan stores: fields left at None are not written, times
  are written in the storage form. A record built by a plan encodes to exactly the params
  plans wrote before records existed, so plan hashes (and the approvals bound to them) do
  not change.

Besides a plan's keys, a step's params carry what is written into them later, each a
`StepControl` record written and read through the same codec, never as loose keys: the
controls people's actions write while the run is under way (`HoldRelease`, `drain done`;
`HoldExtension`, an applied extension; `HandConfirmation`, a person's word that a host
driver is gone or installed), and the marks that tie a plan to an earlier run
(`ContinuesMark`, a continuation's; `TakesOverMark`, a rollback's or a continuation's
cordon). `control.written_into(params)` keeps every key the params have and sets the
control's own, in the storage form rows hold today; `Control.read_from(params, kind=...)`
is the control the params hold (None when it was never written), or a `StepParamsError`.

The records of the step kinds every kind of change shares live here, because plans build
them (`workflows.pools.planning`) and the engine's steps read them. A step kind only one
kind of change uses declares its record next to its logic: the logic's `params` attribute
(`workflows.engine.steps.contract.StepLogic`), in `workflows/<kind>/step_logic.py` for a
kind that brings its own logic.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from storage import codec

_P = TypeVar("_P", bound="StepParams")


class StepParamsError(ValueError):
    """A step's params cannot be used; the step fails with this message."""


def _bad(kind: str, key: str, wanted: str, value: object) -> StepParamsError:
    return StepParamsError(f"{kind} step: params.{key} must be {wanted}, not {value!r}")


@dataclass(frozen=True, kw_only=True)
class StepParams:
    """Keys any step may carry: how long it may take (`timeout_s`; rows of old plans say
    `timeout_seconds`), and `on_failure` (it runs only when a step of its wave fails)."""

    # Keys an older plan wrote under another name: {old name: field}.
    ALIASES: ClassVar[Mapping[str, str]] = {"timeout_seconds": "timeout_s"}

    timeout_s: float | None = None
    on_failure: bool | None = None

    def timeout(self, default: float, *, kind: str = "this") -> dt.timedelta:
        """How long the step may take: `timeout_s` seconds, else `default`."""
        seconds = default if self.timeout_s is None else self.timeout_s
        if seconds <= 0:
            raise _bad(kind, "timeout_s", "more than 0", seconds)
        return dt.timedelta(seconds=seconds)

    @classmethod
    def from_json(cls: type[_P], raw: Mapping[str, Any], *, kind: str) -> _P:
        return cls(**_fields_from_json(cls, raw, kind=kind))

    def to_json(self) -> dict[str, Any]:
        return _fields_to_json(self)


def decode(record: type[_P], raw: object, *, kind: str) -> _P:
    """The record `raw` (a step row's stored params) holds; StepParamsError if it cannot."""
    if not isinstance(raw, Mapping):
        raise StepParamsError(f"{kind} step: params must be a JSON object, not {raw!r}")
    return record.from_json(raw, kind=kind)


def encode(params: StepParams) -> dict[str, Any]:
    """The JSON stored for `params` (what a plan's step carries)."""
    return params.to_json()


# --- the field codec -------------------------------------------------------------------


def _fields_from_json(record: type[Any], raw: Mapping[str, Any], *, kind: str) -> dict[str, Any]:
    hints = _hints(record)
    values: dict[str, Any] = {}
    for old, new in getattr(record, "ALIASES", {}).items():
        if old in raw and new not in raw:
            values[new] = _value(hints[new], raw[old], kind=kind, key=old)
    for f in dataclasses.fields(record):
        if f.name in raw:
            values[f.name] = _value(hints[f.name], raw[f.name], kind=kind, key=f.name)
    return values


def _fields_to_json(params: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if value is not None:
            out[f.name] = _json(value)
    return out


def _json(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return codec.time_to_text(value)
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(record: type) -> dict[str, Any]:
    found = _HINTS.get(record)
    if found is None:
        found = _HINTS[record] = typing.get_type_hints(record)
    return found


def _value(hint: Any, value: Any, *, kind: str, key: str) -> Any:
    """`value` read as `hint` says (the field's type), or StepParamsError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # the option's own words (which key of a map, say)
            return _value(options[0], value, kind=kind, key=key)
        for option in options:
            try:
                return _value(option, value, kind=kind, key=key)
            except StepParamsError:
                continue
        raise _bad(kind, key, " or ".join(_name(o) for o in options), value)
    if hint is Any:
        return _frozen(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value  # as written: 600 stays 600, so the plan's JSON does not change
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint is dt.datetime:
        if isinstance(value, str):
            at = _time(value)
            if at is not None:
                return at
    elif origin is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(_value(args[0], v, kind=kind, key=key) for v in value)
    elif origin in (Mapping, dict) or hint is Mapping:
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            item = args[1] if args else Any
            return types.MappingProxyType({k: _value(item, v, kind=kind, key=f"{key}.{k}") for k, v in value.items()})
    else:  # pragma: no cover - a record with a field type the codec does not know
        raise TypeError(f"no codec for {hint!r}")
    raise _bad(kind, key, _name(hint), value)


def _time(text: str) -> dt.datetime | None:
    """UTC text as storage writes it, or ISO-8601 with a zone (`Z` or an offset)."""
    try:
        at = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None or at.utcoffset() is None:
        return None
    return at.astimezone(dt.timezone.utc)


def _frozen(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: _frozen(v) for k, v in value.items()})
    return value


def _name(hint: Any) -> str:
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text",
             dt.datetime: "a time with its zone (ISO-8601)"}
    if hint in names:
        return names[hint]
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "a list"
    if origin in (Mapping, dict) or hint is Mapping:
        return "a map"
    return "a JSON value"


# --- the step kinds every kind of change shares -----------------------------------------


@dataclass(frozen=True, kw_only=True)
class CordonParams(StepParams):
    """`was_cordoned`: a person had cordoned the node before (a note for people);
    `takes_over`: the run whose cordon mark a rollback takes over."""

    was_cordoned: bool | None = None
    takes_over: str | None = None


@dataclass(frozen=True, kw_only=True)
class UncordonParams(StepParams):
    """`leave_cordoned`: a person had cordoned the node before (a note for people)."""

    leave_cordoned: bool | None = None


@dataclass(frozen=True, kw_only=True)
class EvictParams(StepParams):
    """Which pods (`scope`), how long a PodDisruptionBudget may hold them up (`timeout_s`,
    or a drain plan's `pdb_timeout_s`), then what (`on_timeout`, or a drain plan's
    `pdb_timeout_action`), how often pods that come back are evicted again
    (`evict_retries`)."""

    scope: str | None = None
    pdb_timeout_s: float | None = None
    pdb_timeout_action: str | None = None
    on_timeout: str | None = None
    evict_retries: int | None = None


@dataclass(frozen=True, kw_only=True)
class GpuGateParams(StepParams):
    """A step that changes what GPU pods use (a driver, a MIG layout) waits until none run
    on the node, unless `allow_gpu_pods` is true."""

    allow_gpu_pods: bool | None = None


@dataclass(frozen=True, kw_only=True)
class WaitForParams(StepParams):
    """`conditions` (or one `condition`) that must hold on the node. The other keys are what
    a drain plan notes for people (the node checks it expects)."""

    conditions: tuple[str, ...] | str | None = None
    condition: str | None = None
    node_ready: bool | None = None
    device_plugin_ready: bool | None = None
    validator_ready: bool | None = None
    advertised_gpus: int | None = None


@dataclass(frozen=True, kw_only=True)
class WaitForJobsParams(StepParams):
    """Pods matching `selector` must be gone; at the timeout `on_timeout` (`fail`, `continue`)."""

    selector: str | None = None
    on_timeout: str | None = None


@dataclass(frozen=True, kw_only=True)
class GpuCheckParams(StepParams):
    """The canary pod: where (`namespace`), what (`image`, `command`), which GPU `resource`
    and how many (`count`: a number, or "all" the node advertises; unset: one); `diag` the
    DCGM diagnostics level whose JSON output decides (unset: the exit code alone);
    `purpose` "burn-in" for the pool's burn-in, run as a second check pod."""

    namespace: str | None = None
    image: str | None = None
    command: tuple[str, ...] | None = None
    resource: str | None = None
    count: int | str | None = None
    diag: int | None = None
    # "burn-in": the pool's burn-in after its check (its own pod); unset: the check.
    purpose: str | None = None


@dataclass(frozen=True, kw_only=True)
class HoldParams(StepParams):
    """Hold until `until`; a stored `until` of null is an open-ended hold (`open_ended`,
    ended by `drain done`, for at most `at_most_s`); else for `seconds`; else until the
    request's window ends. Controls written while it runs: `released_at` (`HoldRelease`,
    `drain done`), `extended_until` (`HoldExtension`, an extension applied)."""

    until: dt.datetime | None = None
    open_ended: bool = False
    seconds: float | None = None
    at_most_s: float | None = None
    released_by: str | None = None
    released_at: dt.datetime | None = None
    extended_until: dt.datetime | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], *, kind: str) -> HoldParams:
        # NB: a row with `until` null (or empty text) holds until `drain done`.
        open_ended = "until" in raw and not raw["until"]
        keep = {k: v for k, v in raw.items() if k != "open_ended" and not (open_ended and k == "until")}
        return cls(**_fields_from_json(cls, keep, kind=kind), open_ended=open_ended)

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in _fields_to_json(self).items() if k != "open_ended"}
        if self.open_ended:
            out["until"] = None
        return out


# --- what is written into a step's params besides its plan's keys ------------------------


_C = TypeVar("_C", bound="StepControl")


@dataclass(frozen=True, kw_only=True)
class StepControl:
    """Keys written into a step's params by something other than its plan's own step
    (see the module's docstring). The first field is the one whose presence says the
    control was written; the others say who and when."""

    def written_into(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` (a step row's or a plan step's) with this control's keys set."""
        return {**params, **_fields_to_json(self)}

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def left_out_of(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params` without this control's keys (a mark a new plan does not carry over)."""
        return {k: v for k, v in params.items() if k not in cls.keys()}

    @classmethod
    def read_from(cls: type[_C], params: Mapping[str, Any], *, kind: str) -> _C | None:
        """The control `params` hold; None when its first key is missing or null."""
        if params.get(cls.keys()[0]) is None:
            return None
        return cls(**_fields_from_json(cls, params, kind=kind))


@dataclass(frozen=True, kw_only=True)
class HoldRelease(StepControl):
    """`drain done` (workflows.engine.runs `release_hold`): the hold ends at `released_at`;
    `released_by_user` said it."""

    released_at: dt.datetime
    released_by_user: str | None = None


@dataclass(frozen=True, kw_only=True)
class HoldExtension(StepControl):
    """A running drain's extension, applied (workflows.requests.extension): the hold ends
    no earlier than `extended_until`; `extended_by` asked (or approved last) at `extended_at`."""

    extended_until: dt.datetime
    extended_at: dt.datetime | None = None
    extended_by: str | None = None


@dataclass(frozen=True, kw_only=True)
class HandConfirmation(StepControl):
    """A person's word that a host driver is gone or installed (workflows.engine.runs
    `confirm_host_driver`): `confirmed_by` (a user id, and `confirmed_by_name` as the thread
    names them) at `confirmed_at`."""

    confirmed_by: str
    confirmed_by_name: str | None = None
    confirmed_at: dt.datetime | None = None


@dataclass(frozen=True, kw_only=True)
class ContinuesMark(StepControl):
    """On each node's first step of a continuation's plan: the halted run it continues."""

    continues: str


@dataclass(frozen=True, kw_only=True)
class TakesOverMark(StepControl):
    """On a step that takes over what an earlier run left on its node (a rollback's or a
    continuation's cordon, a kind's own undo): that run."""

    takes_over: str
