"""The kinds of change gpuops makes (drain, driver upgrade, MIG change, move to the
operator), each described once: its name, how people read it, the steps its plans use,
the approvals a pool wants by default, and whether a rollback or a person's confirmation
applies to it.

Everything that needs to know the kinds reads the registry in force here
(`kinds_in_force()`): plans (which kinds a plan may
be), the request service's and the cards' wording, a pool's default approvals, the
commands that offer Roll back or a person's confirmation, and the database, whose
reference rows of request and step kinds are these (`storage_kinds`, written when the
database opens: a database refuses a request or step of a kind nobody registered), and
the engine, which runs a step kind only one kind of change uses with the logic that
kind's package gives (`step_logic`).

A kind's own behaviour stays in its package (`workflows/drain`, `workflows/upgrade`, ...):
its service answers the one `ChangeService` protocol below, and its `step_logic` module
maps the step kinds only it uses to the engine logic that runs them. Its registry line
names, by module path, where each layer finds the rest (this module imports none of them):
`service`, the class an entry point builds the kind's service from (`ServiceInputs`);
`commands`, its `/gpu` commands module (commands.catalog imports it); `form`, its request
form in bot/ (bot.request_forms reads it), for a kind with one.

`KINDS` is the product's list. A process's composition root may put another registry in
force (`put_in_force(KINDS.with_kind(...))`, before it reads its configuration or opens
its database): the tests' own kinds are added that way, and every layer above reads the
one in force, so a new kind edits none of them. This module sits at
the bottom of the domain (it imports nothing of gpuops: a kind names its step logic's
module, read when the engine first asks) so every layer may read it.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

# The kinds of pool a default number of approvals is given for (workflows/pools/config.py).
PoolKind = Literal["serving", "training"]


def logic_in(module: str) -> Callable[[], Mapping[str, Any]]:
    """A kind's step logic, as its registry line names it: the `STEP_LOGIC` mapping (step
    kind -> the engine's `StepLogic`) of `module`, imported the first time it is asked for."""

    @functools.cache
    def step_logic() -> Mapping[str, Any]:
        logic: Mapping[str, Any] = importlib.import_module(module).STEP_LOGIC
        return logic

    return step_logic


def _no_step_logic() -> Mapping[str, Any]:
    return {}


def named(path: str) -> Any:
    """What a registry line's dotted path names: `"workflows.drain.service.DrainService"` is
    the class `DrainService` of that module, imported when first asked for."""
    module, _, attribute = path.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class ServiceInputs:
    """What an entry point builds every kind's service from (commands.services
    `Services.on_database`): the request service on its database connection
    (`workflows.requests.service.RequestService`), the configuration
    (`workflows.config.GpuopsConfig`), and what it can read of the cluster besides the
    fleet (`readers`: the Kubernetes gateway, or a test's stand-in; none without a
    cluster). A kind's service takes the reader it needs by the protocol it needs."""

    requests: Any
    config: Any
    readers: tuple[object, ...] = ()

    def reader(self, wanted: Callable[..., _R]) -> _R | None:
        """The first reader that is a `wanted` (a runtime-checkable protocol), or None."""
        # NB: typed as a callable: mypy refuses a protocol where `type[...]` is asked for.
        found: _R | None = next((r for r in self.readers if isinstance(r, wanted)), None)  # type: ignore[arg-type, assignment]
        return found


@dataclass(frozen=True, slots=True)
class ChangeKind:
    """One kind of change, as every layer reads it."""

    # The word stored with each request and plan ("drain"), also the `/gpu` command's.
    name: str
    # How a sentence names one: "Requesting a drain on pool ..." (with its article).
    noun: str
    # How a card's title names one: "Drain request req-7f3a2c".
    title: str
    # The step kinds its plans use, in the order a node meets them.
    step_kinds: tuple[str, ...]
    # Approvals a pool of each kind wants when its configuration names none for this kind.
    default_approvals: Mapping[PoolKind, int]
    # Whether a halted run may be rolled back (`/gpu rollback`, the Roll back button).
    rollback: bool = False
    # Whether its runs wait for a person to confirm something by hand (a host driver).
    confirmation: bool = False
    # The logic of the step kinds only this kind uses ({step kind: engine StepLogic}),
    # usually `logic_in("workflows.<kind>.step_logic")`; the step kinds every kind shares
    # (cordon, evict, validate, hold, uncordon, ...) are the engine's own.
    step_logic: Callable[[], Mapping[str, Any]] = _no_step_logic
    # The codes of the node findings (workflows/fleet/findings.py) a change of this kind is
    # expected to clear on a node: its plans keep such a node (workflows/preflight/nodes.py);
    # a node with any other open critical or warning finding is left out unless named.
    fixes: tuple[str, ...] = ()
    # Its service's class ("workflows.drain.service.DrainService"): `Built.built(inputs)`
    # makes it for an entry point; None for a kind no entry point can ask for.
    service: str | None = None
    # Its `/gpu` commands module ("commands.drain"), imported by commands.catalog.
    commands: str | None = None
    # Its request form (bot.request_forms `RequestForm`), as "module.NAME"; None: no form.
    form: str | None = None

    def approvals_for(self, pool_kind: PoolKind) -> int:
        return self.default_approvals[pool_kind]

    def build_service(self, inputs: ServiceInputs) -> ChangeService | None:
        """The kind's service for an entry point, None when it has none."""
        if self.service is None:
            return None
        made: ChangeService = named(self.service).built(inputs)
        return made


@dataclass(frozen=True, slots=True)
class StorageKinds:
    """The reference rows the database keeps: every request kind and every step kind."""

    request_kinds: tuple[str, ...]
    step_kinds: tuple[str, ...]


class ChangeService(Protocol):
    """What every kind's service does (workflows/<kind>/service.py): say which kind it
    serves, and ask for a change (a request waiting for approvals). `ask` is the kind's
    own record of what was asked for; the kinds that preview a plan or roll back a halted
    run also answer `Previews` and `RollsBack`."""

    @property
    def kind(self) -> str: ...

    def request(self, actor: Any, ask: Any, *, fleet: Any, now: dt.datetime, channel: str | None = None) -> Any: ...


class Built(Protocol):
    """How a kind's service class is made from what an entry point has (its registry line's `service`)."""

    @classmethod
    def built(cls, inputs: ServiceInputs) -> ChangeService: ...


@runtime_checkable
class Previews(Protocol):
    """Plans a change without storing it (`--dry-run`)."""

    def preview(self, actor: Any, ask: Any, *, fleet: Any, now: dt.datetime) -> Any: ...


@runtime_checkable
class RollsBack(Protocol):
    """Asks to put back what a halted run of its kind changed (a kind whose `rollback` is true)."""

    def rollback(self, actor: Any, run: Any, *, fleet: Any, now: dt.datetime, channel: str | None = None) -> Any: ...


@dataclass(frozen=True)
class KindRegistry:
    """The kinds of change, by name, in the order they were registered."""

    kinds: tuple[ChangeKind, ...] = ()
    # Step kinds no kind's plans use any more but runs in a database may still hold.
    retired_step_kinds: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        names = [kind.name for kind in self.kinds]
        if len(set(names)) != len(names):
            raise ValueError(f"a kind of change is registered twice: {names}")

    def __iter__(self) -> Iterator[ChangeKind]:
        return iter(self.kinds)

    def __contains__(self, name: object) -> bool:
        return any(kind.name == name for kind in self.kinds)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(kind.name for kind in self.kinds)

    def get(self, name: str) -> ChangeKind | None:
        return next((kind for kind in self.kinds if kind.name == name), None)

    def __getitem__(self, name: str) -> ChangeKind:
        kind = self.get(name)
        if kind is None:
            raise KeyError(f"unknown kind of change {name!r}; known: {list(self.names)}")
        return kind

    @property
    def step_kinds(self) -> tuple[str, ...]:
        """Every step kind some kind's plans use (or runs may still hold), each once."""
        seen = dict.fromkeys(step for kind in self.kinds for step in kind.step_kinds)
        seen.update(dict.fromkeys(self.retired_step_kinds))
        return tuple(seen)

    def with_kind(self, kind: ChangeKind) -> KindRegistry:
        """This registry and one more kind (what a new kind's registry line does)."""
        return KindRegistry(kinds=(*self.kinds, kind), retired_step_kinds=self.retired_step_kinds)

    def storage_kinds(self) -> StorageKinds:
        return StorageKinds(request_kinds=self.names, step_kinds=self.step_kinds)


KINDS = KindRegistry(
    kinds=(
        ChangeKind(name="drain", noun="a drain", title="Drain",
                   step_kinds=("cordon", "wait-for-jobs", "evict", "validate", "hold", "gpu-check", "uncordon"),
                   # A drain changes nothing on the node: it clears no finding.
                   default_approvals={"serving": 1, "training": 0},
                   service="workflows.drain.service.DrainService", commands="commands.drain",
                   form="bot.drain_form.DRAIN_REQUEST_FORM"),
        ChangeKind(name="upgrade", noun="a driver upgrade", title="Driver upgrade",
                   step_kinds=("operator-hold", "cordon", "wait-for-jobs", "evict", "driver", "driver-version",
                               "operator-upgrade", "hold", "validate", "gpu-check", "uncordon"),
                   default_approvals={"serving": 2, "training": 1}, rollback=True,
                   step_logic=logic_in("workflows.upgrade.step_logic"),
                   # It replaces the node's driver pod with the new version: a driver that
                   # crash-loops or an upgrade that failed or stuck is tried afresh (and
                   # validated). GPUs missing, two driver sources or NotReady it does not touch.
                   fixes=("driver-crash-loop", "upgrade-failed", "upgrade-stuck"),
                   service="workflows.upgrade.service.UpgradeService", commands="commands.upgrade",
                   form="bot.upgrade_form.UPGRADE_REQUEST_FORM"),
        ChangeKind(name="mig", noun="a MIG change", title="MIG change",
                   step_kinds=("wait-for-jobs", "cordon", "evict", "mig", "validate", "gpu-check", "uncordon"),
                   default_approvals={"serving": 2, "training": 1}, rollback=True,
                   step_logic=logic_in("workflows.mig.step_logic"),
                   # It applies a layout afresh: a MIG change that failed or stuck is retried.
                   fixes=("mig-change-failed", "mig-change-stuck"),
                   service="workflows.mig.service.MigService", commands="commands.mig",
                   form="bot.mig_form.MIG_REQUEST_FORM"),
        ChangeKind(name="migrate", noun="a move between host drivers and the operator", title="Driver move",
                   step_kinds=("snapshot", "cordon", "wait-for-jobs", "evict", "host-driver-removed", "node-labels",
                               "wait-for", "host-driver-installed", "gpu-check", "validate", "uncordon", "restore"),
                   default_approvals={"serving": 2, "training": 1}, rollback=True, confirmation=True,
                   step_logic=logic_in("workflows.migrate.step_logic"),
                   # Its point: the host driver goes and the operator's stays, one source.
                   fixes=("driver-conflict",),
                   service="workflows.migrate.service.MigrateService", commands="commands.migrate"),
    ),
    # Plans once drained a node in one step; the engine still runs one a run holds.
    retired_step_kinds=("drain",),
)


# The registry every layer reads; a composition root replaces it (`put_in_force`).
_in_force: list[KindRegistry] = [KINDS]


def kinds_in_force() -> KindRegistry:
    """The kinds of change this process knows: `KINDS`, unless its composition root put
    another registry in force."""
    return _in_force[0]


def put_in_force(kinds: KindRegistry) -> KindRegistry:
    """Make `kinds` the registry plans, pool configurations, wording, commands, the engine
    and the database read from now on; returns the one it replaces (to put back).

    NB: one per process, set by its composition root before it parses its configuration
    (a pool's `approvals` name kinds) or opens its database (the reference rows)."""
    replaced = _in_force[0]
    _in_force[0] = kinds
    return replaced
