"""gpuops configuration: one YAML file, parsed and validated once at start. A bad value
stops the process with the file, the key and the reason (`ConfigError`).

Durations are written as "90s", "30m", "1h", "2d" (or combinations like "1h30m")."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from workflows.access import Actor, Role, UserId
from workflows.handover import RotationConfig
from workflows.inventory import InventorySettings

_DURATION = re.compile(r"^\s*(?:(\d+)d)?\s*(?:(\d+)h)?\s*(?:(\d+)m)?\s*(?:(\d+)s)?\s*$", re.ASCII)


def parse_duration(value: Any) -> dt.timedelta:
    """"1h30m" -> timedelta(hours=1, minutes=30); a bare number is seconds."""
    if isinstance(value, dt.timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return dt.timedelta(seconds=value)
    match = _DURATION.match(str(value)) if isinstance(value, str) and value.strip() else None
    if not match or not any(match.groups()):
        raise ValueError(f"{value!r} is not a duration; write it like 90s, 30m, 1h or 1h30m")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return dt.timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


Duration = Annotated[dt.timedelta, BeforeValidator(parse_duration)]
RequestKind = Literal["drain", "upgrade", "mig"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClusterConfig(_Model):
    # The node label whose value names a node's pool (e.g. a cloud node-group label).
    pool_label: str = "gpuops.io/pool"
    # Where the GPU Operator runs; found from the ClusterPolicy when not set.
    operator_namespace: str | None = None
    # Who owns the ClusterPolicy (a team or channel); else its gpuops.io/owner annotation.
    cluster_policy_owner: str | None = None


class InventoryConfig(_Model):
    upgrade_stuck_after: Duration = dt.timedelta(hours=1)
    mig_pending_stuck_after: Duration = dt.timedelta(minutes=30)


class PoolConfig(_Model):
    kind: Literal["serving", "training"]
    # Approvals a request needs, per kind of request.
    approvals: dict[RequestKind, Annotated[int, Field(ge=0, le=5)]] = Field(default_factory=dict)
    # Who may approve for this pool, besides global approvers: Slack user ids or
    # user groups written as "group:S0123".
    approvers: tuple[str, ...] = ()
    # How long a request waits for approval before it expires.
    request_ttl: Duration = dt.timedelta(hours=24)

    # Drain policy. Parsing lives in workflows.windows / capacity / selectors (imported
    # where used, so they never depend on configuration); their errors say how to fix it.

    class Window(_Model):
        """One allowed maintenance window: on `days` (the days it *starts* on: names,
        ranges like mon-fri, or daily) from `start` to `end`, "HH:MM" wall-clock times
        in the IANA `timezone`. An end at or before the start crosses midnight (equal
        times make a 24-hour window); "24:00" ends at midnight. Quote the times in
        YAML, which reads an unquoted 22:30 as the number 1350."""

        days: tuple[str, ...]
        start: str
        end: str
        timezone: str

        @field_validator("days", mode="before")
        @classmethod
        def _days(cls, value: Any) -> tuple[str, ...]:
            from workflows.windows import DAY_NAMES, parse_days
            return tuple(DAY_NAMES[day] for day in sorted(parse_days(value)))

        @field_validator("start", "end", mode="before")
        @classmethod
        def _clock(cls, value: Any, info: Any) -> str:
            from workflows.windows import parse_clock
            return parse_clock(value, end=info.field_name == "end").strftime("%H:%M")

        @field_validator("timezone", mode="before")
        @classmethod
        def _zone(cls, value: Any) -> str:
            from workflows.windows import parse_zone
            return parse_zone(value).key

        def window(self) -> Any:
            """The `workflows.windows.MaintenanceWindow` this describes."""
            from workflows.windows import MaintenanceWindow
            return MaintenanceWindow.parse(days=list(self.days), start=self.start, end=self.end,
                                           timezone=self.timezone)

    class WaitFor(_Model):
        """Pods (by label selector, e.g. "gpuops.io/must-finish=true") a drain waits for
        to finish, up to `timeout`, before evicting what is left."""

        selector: str
        timeout: Duration

        @field_validator("selector", mode="before")
        @classmethod
        def _selector(cls, value: Any) -> str:
            from workflows.selectors import LabelSelector
            return LabelSelector.parse(value).text

    # When drains may run. No windows (the default) means no drain is allowed at all:
    # gates fail closed. Write a list of windows, or `windows: always` for any time.
    windows: tuple[Window, ...] | Literal["always"] = ()
    # Nodes of the pool out at once, as a count (2) or a percent of its nodes ("25%",
    # rounded down, at least 1 when above 0). Nodes already cordoned or NotReady count.
    max_unavailable: int | str = 1
    # GPUs that must stay Ready (advertised on Ready, schedulable nodes) during a drain.
    min_ready_gpus: Annotated[int, Field(ge=0)] = 0
    # How long an eviction may be held up by a PodDisruptionBudget before
    # `pdb_timeout_action`: wait (the run halts with the node cordoned, for a person to
    # decide), skip (the node is left out: uncordoned, its pods keep running, the run goes
    # on) or delete (the pods, ignoring the PDB; only with allow_delete: true).
    drain_timeout: Duration = dt.timedelta(minutes=30)
    allow_delete: bool = False
    # How long a drained node may take to come back (Ready, driver, device plugin and
    # validator healthy, every physical GPU advertised) before the run halts with it cordoned.
    validate_timeout: Duration = dt.timedelta(minutes=10)
    pdb_timeout_action: Literal["wait", "skip", "delete"] = "wait"
    # The longest a drain with no end (`/gpu drain <nodes>` on a `windows: always` pool,
    # without `for`) holds its nodes; unset, it holds them until someone says `drain done`.
    open_drain_max: Duration | None = None
    # Jobs that must finish rather than be evicted.
    wait_for: WaitFor | None = None

    _window_set: Any = None
    _unavailable_budget: Any = None
    _wait_for_selector: Any = None

    @field_validator("windows", mode="wrap")
    @classmethod
    def _windows(cls, value: Any, handler: Any) -> Any:
        from pydantic import TypeAdapter

        from workflows import drain_messages
        if value is None:
            return ()
        if isinstance(value, str):
            if value.strip().lower() == "always":
                return "always"
            raise ValueError(drain_messages.windows_word(value))
        if not isinstance(value, (list, tuple)):
            raise ValueError(drain_messages.windows_word(value))
        return TypeAdapter(tuple[cls.Window, ...]).validate_python(value)

    @field_validator("max_unavailable", mode="before")
    @classmethod
    def _max_unavailable(cls, value: Any) -> int | str:
        from workflows.capacity import MaxUnavailable
        budget = MaxUnavailable.parse(value)
        return budget.count if budget.count is not None else str(budget)

    @field_validator("pdb_timeout_action")
    @classmethod
    def _delete_needs_consent(cls, value: str, info: Any) -> str:
        from workflows import drain_messages
        if value == "delete" and info.data.get("allow_delete") is not True:
            raise ValueError(drain_messages.delete_not_allowed())
        return value

    def model_post_init(self, context: Any) -> None:
        from workflows.capacity import MaxUnavailable
        from workflows.selectors import LabelSelector
        from workflows.windows import WindowSet
        if self.windows == "always":
            self._window_set = WindowSet.any_time()
        else:
            self._window_set = WindowSet(windows=tuple(w.window() for w in self.windows))
        self._unavailable_budget = MaxUnavailable.parse(self.max_unavailable)
        self._wait_for_selector = (LabelSelector.parse(self.wait_for.selector)
                                   if self.wait_for is not None else None)

    @property
    def window_set(self) -> Any:
        """The pool's windows as a `workflows.windows.WindowSet`."""
        return self._window_set

    @property
    def unavailable_budget(self) -> Any:
        """`max_unavailable` as a `workflows.capacity.MaxUnavailable`."""
        return self._unavailable_budget

    @property
    def wait_for_selector(self) -> Any:
        """`wait_for.selector` as a `workflows.selectors.LabelSelector`, or None."""
        return self._wait_for_selector

    def approvals_required(self, kind: RequestKind) -> int:
        if kind in self.approvals:
            return self.approvals[kind]
        # Defaults: serving pools want two people for upgrades and MIG, one for drains;
        # training pools one for upgrades and MIG and none for drains.
        defaults = {"serving": {"drain": 1, "upgrade": 2, "mig": 2},
                    "training": {"drain": 0, "upgrade": 1, "mig": 1}}
        return defaults[self.kind][kind]


class AccessConfig(_Model):
    # Slack user id -> roles.
    users: dict[str, tuple[Role, ...]] = Field(default_factory=dict)
    # Slack user group id -> roles (members resolved through usergroups.users.list).
    usergroups: dict[str, tuple[Role, ...]] = Field(default_factory=dict)
    # Display names for users, used where Slack is not asked (console, CLI, tests).
    names: dict[str, str] = Field(default_factory=dict)
    # Roles of the local user of the `gpuops` command line.
    cli_roles: tuple[Role, ...] = (Role.VIEWER,)


class GpuopsConfig(_Model):
    cluster: ClusterConfig = ClusterConfig()
    inventory: InventoryConfig = InventoryConfig()
    pools: dict[str, PoolConfig] = Field(default_factory=dict)
    access: AccessConfig = AccessConfig()
    database: Path | None = None
    rotations: tuple[RotationConfig, ...] = ()

    @field_validator("pools")
    @classmethod
    def _pool_names(cls, pools: dict[str, PoolConfig]) -> dict[str, PoolConfig]:
        for name in pools:
            if name == "unpooled":
                raise ValueError("'unpooled' is reserved for GPU nodes that match no pool")
        return pools

    def inventory_settings(self) -> InventorySettings:
        return InventorySettings(
            pool_label_key=self.cluster.pool_label,
            pool_kinds={name: pool.kind for name, pool in self.pools.items()},
            upgrade_stuck_after=self.inventory.upgrade_stuck_after,
            mig_pending_stuck_after=self.inventory.mig_pending_stuck_after,
            cluster_policy_owner=self.cluster.cluster_policy_owner,
        )

    def actor(self, user_id: str, *, groups: tuple[str, ...] = (), via: str = "slack",
              name: str | None = None) -> Actor:
        """The Actor for a user: roles by user id and by the user groups they are in;
        pool-scoped approver rights from each pool's `approvers`."""
        roles: set[Role] = set(self.access.users.get(user_id, ()))
        for group in groups:
            roles.update(self.access.usergroups.get(group, ()))
        pool_roles = {}
        for pool, policy in self.pools.items():
            if user_id in policy.approvers or any(f"group:{g}" in policy.approvers for g in groups):
                pool_roles[pool] = frozenset({Role.APPROVER})
        return Actor(user_id=UserId(user_id), name=name or self.access.names.get(user_id, user_id),
                     roles=frozenset(roles), pool_roles=pool_roles, via=via, groups=tuple(groups))


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file, key and reason."""


def load_config(path: str | Path | None) -> GpuopsConfig:
    if path is None:
        return GpuopsConfig()
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the configuration: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the configuration must be a mapping of keys, not {type(raw).__name__}")
    try:
        return GpuopsConfig.model_validate(raw)
    except ValidationError as err:
        problems = []
        for error in err.errors():
            key = ".".join(str(part) for part in error["loc"])
            problems.append(f"{path}: {key}: {error['msg']}")
        raise ConfigError("\n".join(problems)) from None
