"""A pool's policy as configured (`pools.<name>` in the configuration file): its kind,
approvals, windows, capacity rules, drain timeouts and the jobs a drain waits for.
Parsed and validated once at start; the values parse into the pool package's own types
(`WindowSet`, `MaxUnavailable`, `LabelSelector`), whose errors say how to fix the file."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

from storage.requests import RequestKind
from workflows.durations import Duration
from workflows.fleet.assessment import UNPOOLED
from workflows.fleet.settings import PodMatch, PoolPlacement
from workflows.kinds import kinds_in_force
from workflows.kube.objects import is_gpu_resource
from workflows.pools import messages as say
from workflows.pools.capacity import MaxUnavailable
from workflows.pools.selectors import LabelSelector
from workflows.pools.windows import DAY_NAMES, MaintenanceWindow, WindowSet, parse_clock, parse_days, parse_zone


# A namespace name (RFC 1123 label).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A Kubernetes label value (not empty: an empty pool label is no pool).
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def _pool_name(name: str) -> str:
    # A node's pool is the value of its pool label (cluster.pool_label), and a run, a
    # request or a freeze names a pool as `cluster/pool`: a name that is no label value
    # would be a pool no node is ever in.
    if name == UNPOOLED:
        raise ValueError(say.pool_name_reserved(name))
    if "/" in name:
        raise ValueError(say.pool_name_has_slash(name))
    if not _LABEL_VALUE.fullmatch(name):
        raise ValueError(say.pool_name_not_a_label_value(name))
    return name


# A key of `pools`: a pool's name, checked where it is written.
PoolKey = Annotated[str, AfterValidator(_pool_name)]


def _change_kind(name: str) -> str:
    kinds = kinds_in_force()
    if name not in kinds:
        raise ValueError(say.unknown_change_kind(name, known=kinds.names))
    return name


# A key of a pool's `approvals`: a kind of change (workflows/kinds.py).
ChangeKindName = Annotated[str, AfterValidator(_change_kind)]


def _valid_image(value: str) -> str:
    """A check pod's image (the pool's check or its burn-in): a reference with no space."""
    if not value.strip() or any(c.isspace() for c in value):
        raise ValueError(say.check_image(value))
    return value


def _valid_command(value: tuple[str, ...]) -> tuple[str, ...]:
    """A check pod's command: a program first."""
    if not value or not value[0].strip():
        raise ValueError(say.check_command())
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The DCGM image a `diag` check runs in: the version whose `dcgmi diag -j` output
# `workflows.engine.dcgm_diag` reads (DCGM 4's shape; DCGM 3's is read too), and the
# image the GPU Operator's own chart (v26.7.0) runs its standalone host engine from.
DIAG_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.6.0-1-ubuntu24.04"
# How long each level takes on a node, as DCGM's guide puts it (level 1 about a minute,
# level 2 a few, level 3 up to half an hour on 8 GPUs): what a plan's time estimate counts
# at the least (`workflows.preflight.duration`).
DIAG_EXPECTED: dict[int, dt.timedelta] = {1: dt.timedelta(minutes=1), 2: dt.timedelta(minutes=3),
                                          3: dt.timedelta(minutes=30)}
# How long each level may take before the run halts, when `timeout` is not set.
DIAG_TIMEOUTS: dict[int, dt.timedelta] = {1: dt.timedelta(minutes=5), 2: dt.timedelta(minutes=15),
                                          3: dt.timedelta(minutes=60)}


class BurnIn(_Model):
    """A pool's own burn-in, run after its check on each node: `command` in `image` (a
    single-node NCCL all-reduce, say) holding every GPU the node advertises of the check's
    `resource`; exit 0 passes, anything else (or no end within `timeout`) halts the run
    with the node cordoned."""

    image: str = Field(description="The burn-in pod's image.")
    command: tuple[str, ...] = Field(description="What the burn-in pod runs; exit 0 passes.")
    timeout: Duration = Field(default=dt.timedelta(minutes=30), description=(
        "How long the burn-in may take (at least 10s) before the run halts."))

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        return _valid_image(value)

    @field_validator("command")
    @classmethod
    def _command(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _valid_command(value)

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: dt.timedelta) -> dt.timedelta:
        if value < dt.timedelta(seconds=10):
            raise ValueError(say.check_timeout(value))
        return value


class GpuCheck(_Model):
    """The canary pod a driver upgrade runs on each node before giving it back: one pod in
    `namespace`, bound to the node, asking for `count` of `resource` (one, or `all` the node
    advertises), running `command` in `image`; exit code 0 passes, anything else (or no
    answer within `timeout`) halts the run with the node cordoned. `enabled: false` on a
    pool turns a fleet-wide check off.

    `diag: 1|2|3` makes it DCGM's diagnostics instead: the pod holds every GPU of the node,
    starts a host engine and runs `dcgmi diag -r <level> -j` in the pinned DCGM image (no
    `command` then); its JSON decides, test by test and GPU by GPU. A pool whose check has
    `diag` runs it after every kind of change (drains and MIG changes too, a MIG change on
    its new devices); a check without it runs after upgrades and moves only. `burn_in` adds
    the pool's own burn-in as a second check (and runs both after every kind of change)."""

    enabled: bool = Field(default=True, description=(
        "false on a pool turns a fleet-wide check off there."))
    namespace: str = Field(default="gpuops", description=(
        "The namespace needs the bot's pod-create Role (deploy/rbac.yaml puts it in gpuops)."))
    image: str = Field(default="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", description=(
        "The check pod's image."))
    command: tuple[str, ...] = Field(default=("nvidia-smi",), description=(
        "What the check pod runs; exit 0 passes."))
    resource: str = Field(default="nvidia.com/gpu", description=(
        "A MIG pool with the mixed strategy asks for one of its MIG devices instead."))
    timeout: Duration = Field(default=dt.timedelta(minutes=5), description=(
        "How long the check pod may take (at least 10s) before the run halts (with `diag`, "
        "unset: 5m, 15m or 60m for levels 1, 2 and 3)."))
    count: int | Literal["all"] = Field(default=1, description=(
        "How many of `resource` the pod holds: a number, or `all` the node advertises."))
    diag: Literal[1, 2, 3] | None = Field(default=None, description=(
        "Run DCGM's diagnostics at this level (`dcgmi diag -r`) instead of `command`; the pod "
        "holds `all` the node's GPUs."))
    burn_in: BurnIn | None = Field(default=None, description=(
        "A second check after this one: the pool's own burn-in (image, command, timeout) on "
        "every GPU of the node."))

    @property
    def every_kind(self) -> bool:
        """Whether the check runs after every kind of change (drains and MIG changes too):
        a `diag` check or one with a burn-in; a plain command check runs after upgrades
        and moves only."""
        return self.enabled and (self.diag is not None or self.burn_in is not None)

    @model_validator(mode="before")
    @classmethod
    def _diag_defaults(cls, raw: Any) -> Any:
        # NB: a diag check runs DCGM's own command in DCGM's image on every GPU; a command
        # written beside it would be silently ignored, so it is refused instead.
        if not isinstance(raw, dict) or raw.get("diag") is None:
            return raw
        if "command" in raw:
            raise ValueError(say.check_diag_and_command())
        out = dict(raw)
        out.setdefault("image", DIAG_IMAGE)
        out.setdefault("count", "all")
        if out.get("diag") in DIAG_TIMEOUTS:
            out.setdefault("timeout", DIAG_TIMEOUTS[out["diag"]])
        return out

    @field_validator("count")
    @classmethod
    def _count(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(say.check_count(value))
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _DNS_LABEL.fullmatch(value):
            raise ValueError(say.check_namespace(value))
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        return _valid_image(value)

    @field_validator("command")
    @classmethod
    def _command(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _valid_command(value)

    @field_validator("resource")
    @classmethod
    def _resource(cls, value: str) -> str:
        if not is_gpu_resource(value):
            raise ValueError(say.check_resource(value))
        return value

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: dt.timedelta) -> dt.timedelta:
        if value < dt.timedelta(seconds=10):
            raise ValueError(say.check_timeout(value))
        return value


class WorkloadRule(_Model):
    """Which workloads a placement rule allows: pods in one of `namespaces` (any when
    empty) whose labels match `selector` (any when unset)."""

    namespaces: tuple[str, ...] = Field(default=(), description=(
        "Namespaces the rule allows (empty: any)."))
    selector: str | None = Field(default=None, description=(
        "A label selector the pods must match (unset: any)."))

    @field_validator("selector", mode="before")
    @classmethod
    def _selector(cls, value: Any) -> str | None:
        return None if value is None else LabelSelector.parse(value).text

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _DNS_LABEL.fullmatch(name):
                raise ValueError(say.workload_namespace(name))
        return value

    def text(self) -> str:
        parts = []
        if self.namespaces:
            parts.append(f"namespace{'s' if len(self.namespaces) > 1 else ''} {', '.join(self.namespaces)}")
        if self.selector:
            parts.append(f"pods matching {self.selector}")
        return " and ".join(parts) or "any workload"

    def match(self) -> PodMatch:
        selector = LabelSelector.parse(self.selector) if self.selector else None
        return PodMatch(text=self.text(), namespaces=frozenset(self.namespaces),
                        labels=selector.matches if selector is not None else None)


class Workloads(_Model):
    """Which workloads may land on MIG slices and which on whole GPUs in a pool (the
    seed's "document which workloads are allowed to land on MIG slices versus full
    GPUs"): `/gpu status <pool>` shows it and a finding flags running pods that break it."""

    mig: WorkloadRule | None = Field(default=None, description=(
        "The workloads that may use MIG slices (unset: any)."))
    full_gpu: WorkloadRule | None = Field(default=None, description=(
        "The workloads that may use whole GPUs (unset: any)."))

    def placement(self) -> PoolPlacement:
        return PoolPlacement(mig=self.mig.match() if self.mig else None,
                             full_gpu=self.full_gpu.match() if self.full_gpu else None)


class AnalysisQuery(_Model):
    """One service-health query the pool's runs hold between waves: after each wave, the
    PromQL `query` (read through `signals.prometheus`) must stay at or below `max` (or at
    or above `min`) for `for` before the next wave starts. It must answer one number: no
    answer, several series or an unreadable one is a failure, not a pass."""

    name: str = Field(min_length=1, max_length=63, description=(
        "What the query measures, as the thread names it (e.g. checkout-errors)."))
    query: str = Field(min_length=1, max_length=2000, description=(
        "A PromQL instant query answering one number, e.g. "
        "sum(rate(http_requests_total{code=~\"5..\"}[1m])) / sum(rate(http_requests_total[1m]))."))
    max: float | None = Field(default=None, description=(
        "The highest value that passes (give max or min, exactly one)."))
    min: float | None = Field(default=None, description=(
        "The lowest value that passes (give max or min, exactly one)."))
    for_: Duration = Field(default=dt.timedelta(minutes=5), alias="for", description=(
        "How long the query must keep passing after a wave before the next one starts (at most 2h)."))

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _one_bound(self) -> AnalysisQuery:
        if (self.max is None) == (self.min is None):
            raise ValueError(say.analysis_one_bound(self.name))
        if not dt.timedelta(0) <= self.for_ <= dt.timedelta(hours=2):
            raise ValueError(say.analysis_for_range(self.name))
        return self


class PoolConfig(_Model):
    kind: Literal["serving", "training"] = Field(description=(
        "serving (live traffic: stricter default approvals) or training."))
    approvals: dict[ChangeKindName, Annotated[int, Field(ge=0, le=5)]] = Field(default_factory=dict, description=(
        "Approvals a request needs, per kind of request."))
    approvers: tuple[str, ...] = Field(default=(), description=(
        "Who may approve for this pool, besides global approvers: Slack user ids or user groups "
        "written as \"group:S0123\"."))
    operators: tuple[str, ...] = Field(default=(), description=(
        "Who may ask for and control this pool's changes (drains, upgrades, MIG changes, moves; "
        "pause, resume, abort, continue, drain done, migrate confirm, uncordon, note, rollback) "
        "besides the fleet's operators: Slack user ids or user groups written as \"group:S0123\" "
        "(members read from Slack like approvers' groups). They operate this pool only; "
        "`/gpu status <pool>` names them, and a refusal on the pool says who may act."))
    global_operators: bool = Field(default=True, description=(
        "Whether the fleet's operators (the operator role of access.users / access.usergroups) "
        "operate this pool too. true (the default): they keep every pool, and `operators` only adds "
        "people. false: the pool's `operators` list is exclusive, only they and admins operate it "
        "(teams sharing a cluster); the fleet's operators still read it, and operate the pools that "
        "keep this true."))
    request_ttl: Duration = Field(default=dt.timedelta(hours=24), description=(
        "How long a request waits for approval before it expires."))

    # Drain policy. Parsing lives in pools.windows / capacity / selectors; their errors
    # say how to fix it.

    class Window(_Model):
        """One allowed maintenance window: on `days` (the days it *starts* on: names,
        ranges like mon-fri, or daily) from `start` to `end`, "HH:MM" wall-clock times
        in the IANA `timezone`. An end at or before the start crosses midnight (equal
        times make a 24-hour window); "24:00" ends at midnight. Quote the times in
        YAML, which reads an unquoted 22:30 as the number 1350."""

        # A list or one string ("mon-fri"): the schema says both, as the validator reads both.
        days: tuple[str, ...] = Field(json_schema_extra={"type": ["array", "string"]}, description=(
            "The days the window starts on: names, ranges like mon-fri (a list, or one string), or "
            "daily."))
        start: str = Field(description=(
            "Its start, \"HH:MM\" wall-clock time in `timezone` (quote it in YAML)."))
        end: str = Field(description=(
            "Its end, \"HH:MM\"; at or before the start crosses midnight, \"24:00\" ends at midnight."))
        timezone: str = Field(description=(
            "An IANA time zone, e.g. Europe/Berlin."))

        @field_validator("days", mode="before")
        @classmethod
        def _days(cls, value: Any) -> tuple[str, ...]:
            return tuple(DAY_NAMES[day] for day in sorted(parse_days(value)))

        @field_validator("start", "end", mode="before")
        @classmethod
        def _clock(cls, value: Any, info: Any) -> str:
            return parse_clock(value, end=info.field_name == "end").strftime("%H:%M")

        @field_validator("timezone", mode="before")
        @classmethod
        def _zone(cls, value: Any) -> str:
            return parse_zone(value).key

        def window(self) -> MaintenanceWindow:
            """The `MaintenanceWindow` this describes."""
            return MaintenanceWindow.parse(days=list(self.days), start=self.start, end=self.end,
                                           timezone=self.timezone)

    class WaitFor(_Model):
        """Pods (by label selector, e.g. "gpuops.io/must-finish=true") a drain waits for
        to finish, up to `timeout`, before evicting what is left."""

        selector: str = Field(description=(
            "A label selector of the pods to wait for, e.g. \"gpuops.io/must-finish=true\"."))
        timeout: Duration = Field(description=(
            "How long to wait for them before the run halts with the node cordoned."))

        @field_validator("selector", mode="before")
        @classmethod
        def _selector(cls, value: Any) -> str:
            return LabelSelector.parse(value).text

    windows: tuple[Window, ...] | Literal["always"] = Field(default=(), description=(
        "When drains may run. No windows (the default) means no drain is allowed at all: gates fail "
        "closed. Write a list of windows, or `windows: always` for any time."))
    max_unavailable: int | str = Field(default=1, description=(
        "Nodes of the pool out at once, as a count (2) or a percent of its nodes (\"25%\", rounded "
        "down, at least 1 when above 0). Nodes already cordoned or NotReady count."))
    min_ready_gpus: Annotated[int, Field(ge=0)] = Field(default=0, description=(
        "GPUs that must stay Ready (advertised on Ready, schedulable nodes) during a drain."))
    drain_timeout: Duration = Field(default=dt.timedelta(minutes=30), description=(
        "How long an eviction may be held up by a PodDisruptionBudget before `pdb_timeout_action`: "
        "halt (the run halts with the node cordoned, for a person to decide; `wait`, its former name, "
        "still reads as halt), skip (the node is left "
        "out: uncordoned, its pods keep running, the run goes on) or delete (the pods, ignoring the "
        "PDB; only with allow_delete: true)."))
    allow_delete: bool = Field(default=False, description=(
        "Whether `pdb_timeout_action: delete` may delete pods a PodDisruptionBudget protects (needs "
        "deploy/rbac-pod-delete.yaml)."))
    validate_timeout: Duration = Field(default=dt.timedelta(minutes=10), description=(
        "How long a drained node may take to come back (Ready, driver, device plugin and validator "
        "healthy, every physical GPU advertised) before the run halts with it cordoned."))
    pdb_timeout_action: Literal["halt", "skip", "delete"] = Field(default="halt", description=(
        "What happens when a PodDisruptionBudget still blocks an eviction at `drain_timeout`: halt, "
        "skip or delete (`wait` is the former name of halt and still accepted)."))
    evict_retries: Annotated[int, Field(ge=0, le=20)] = Field(default=3, description=(
        "Pods that come straight back to the cordoned node after eviction (they tolerate "
        "node.kubernetes.io/unschedulable) before a driver or MIG change: evicted again this many "
        "times, then the run halts naming them and their owners (0: halt at once)."))
    open_drain_max: Duration | None = Field(default=None, description=(
        "The longest a drain with no end (`/gpu drain <nodes>` on a `windows: always` pool, without "
        "`for`) holds its nodes; unset, it holds them until someone says `drain done`."))
    wait_for: WaitFor | None = Field(default=None, description="Jobs that must finish rather than be evicted.")
    canary: str | None = Field(default=None, description=(
        "Driver upgrades: the node that takes a new driver first (unset: the node running the fewest "
        "GPU pods), and how long the pool waits after it before the other waves."))
    upgrade_soak: Duration = Field(default=dt.timedelta(minutes=10), description=(
        "Driver upgrades: how long the pool waits after the canary node before the other waves."))
    driver_version_source: Literal["auto", "patch", "git"] = Field(default="auto", description=(
        "Driver upgrades: how the new version reaches the driver object. `patch`: gpuops sets it; `git`: "
        "the run says what to change in Git and waits (inside the window) for the object to name the "
        "approved version; `auto`: git where Argo CD or Flux owns the version field, else patch."))
    workloads: Workloads | None = Field(default=None, description=(
        "Which workloads may use MIG slices and which whole GPUs here (unset: not documented)."))
    host_driver_timeout: Duration = Field(default=dt.timedelta(hours=8), description=(
        "How long a node being moved to the operator waits for a person to remove its host driver (or "
        "until the window ends, if sooner) before the run halts with it cordoned."))
    host_driver_evidence: bool = Field(default=False, description=(
        "Let the node's own evidence stand for that person's word: the host driver that worked when "
        "the step began stops (the validator waits for a driver, no GPU advertised, no operator "
        "driver pod), or, on the way back, a driver starts working with no operator pod. Off by "
        "default: a driver that stops is not proof its packages are gone (a leftover install loads "
        "again at the next boot); with it off the evidence is shown."))
    migrate_at_once: Annotated[int, Field(ge=1)] = Field(default=1, description=(
        "Nodes a move to (or from) the operator takes at once: each needs a person at the node. Never "
        "more than max_unavailable allows; the first node always goes alone."))
    mig_timeout: Duration = Field(default=dt.timedelta(minutes=30), description=(
        "How long a node's MIG change may take (the MIG manager's pending, a reboot, the device "
        "plugin re-advertising) before the run halts with the node cordoned."))
    gpu_check: GpuCheck | None = Field(default=None, description=(
        "The canary pod each upgraded node runs before it is given back (unset: the fleet's "
        "`upgrades.gpu_check`, if any)."))

    analysis: tuple[AnalysisQuery, ...] = Field(default=(), description=(
        "Service health that must hold between waves: after each wave, every query is read "
        "through signals.prometheus until its `for` has passed, and the run halts (naming the query "
        "and its value) when one fails or cannot be read. Needs signals.prometheus."))

    # How gpuops reads this pool's GPU signals (`signals:` of its cluster; None: it does
    # not), set once the whole configuration is read (workflows.config): the plan says
    # whether each node's signals are compared before and after its change.
    _signals_source: Literal["prometheus", "exporters"] | None = None
    _window_set: WindowSet | None = None
    _unavailable_budget: MaxUnavailable | None = None
    _wait_for_selector: LabelSelector | None = None

    @field_validator("windows", mode="wrap")
    @classmethod
    def _windows(cls, value: Any, handler: Any) -> Any:
        if value is None:
            return ()
        if isinstance(value, str):
            if value.strip().lower() == "always":
                return "always"
            raise ValueError(say.windows_word(value))
        if not isinstance(value, (list, tuple)):
            raise ValueError(say.windows_word(value))
        return TypeAdapter(tuple[PoolConfig.Window, ...]).validate_python(value)

    @field_validator("analysis")
    @classmethod
    def _analysis_names(cls, value: tuple[AnalysisQuery, ...]) -> tuple[AnalysisQuery, ...]:
        names = [q.name for q in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(say.analysis_name_twice(twice[0]))
        return value

    @field_validator("max_unavailable", mode="before")
    @classmethod
    def _max_unavailable(cls, value: Any) -> int | str:
        budget = MaxUnavailable.parse(value)
        return budget.count if budget.count is not None else str(budget)

    @field_validator("pdb_timeout_action", mode="before")
    @classmethod
    def _wait_is_halt(cls, value: object) -> object:
        # `wait` was this value's first name; the run never waited: it halted.
        return "halt" if value == "wait" else value

    @field_validator("pdb_timeout_action")
    @classmethod
    def _delete_needs_consent(cls, value: str, info: Any) -> str:
        if value == "delete" and info.data.get("allow_delete") is not True:
            raise ValueError(say.delete_not_allowed())
        return value

    def model_post_init(self, context: Any) -> None:
        if self.windows == "always":
            self._window_set = WindowSet.any_time()
        else:
            self._window_set = WindowSet(windows=tuple(w.window() for w in self.windows))
        self._unavailable_budget = MaxUnavailable.parse(self.max_unavailable)
        self._wait_for_selector = (LabelSelector.parse(self.wait_for.selector)
                                   if self.wait_for is not None else None)

    @property
    def signals_source(self) -> Literal["prometheus", "exporters"] | None:
        """How this pool's GPU signals are read (None: not at all)."""
        return self._signals_source

    def with_signals(self, source: Literal["prometheus", "exporters"] | None) -> None:
        """Say how this pool's GPU signals are read (the configuration, once read whole)."""
        self._signals_source = source

    @property
    def window_set(self) -> WindowSet:
        """The pool's windows."""
        assert self._window_set is not None  # set by model_post_init
        return self._window_set

    @property
    def unavailable_budget(self) -> MaxUnavailable:
        """`max_unavailable`, parsed."""
        assert self._unavailable_budget is not None  # set by model_post_init
        return self._unavailable_budget

    @property
    def wait_for_selector(self) -> LabelSelector | None:
        """`wait_for.selector`, parsed, or None."""
        return self._wait_for_selector

    def approvals_required(self, kind: RequestKind) -> int:
        if kind in self.approvals:
            return self.approvals[kind]
        # Defaults are the kind's (workflows/kinds.py): serving pools want two people for
        # upgrades, MIG changes and moves to the operator, one for drains; training pools
        # one for those and none for drains.
        return kinds_in_force()[kind].approvals_for(self.kind)
