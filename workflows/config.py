"""gpuops configuration: one YAML file, parsed and validated once at start. A bad value
stops the process with the file, the key and the reason (`ConfigError`). The file is read
within bounds (`CONFIG_MAX_BYTES`, `CONFIG_MAX_DEPTH`, `CONFIG_MAX_VALUES`), so a hostile
one is refused where it crosses them, in a second, whatever it holds.

Durations are written as "90s", "30m", "1h", "2d" (or combinations like "1h30m")."""

from __future__ import annotations

import datetime as dt
import os
import re
import zoneinfo
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from storage.locations import BadDatabaseLocation, database_location
from workflows.access import Actor, Role, UserId
from workflows.durations import Duration
from workflows.fleet.settings import InventorySettings
from workflows.fleet.platform import KubernetesRange, release_line, shipped_operator_support
from workflows.handover.rotations import RotationConfig
from workflows.pools.config import GpuCheck, PoolConfig, PoolKey
from workflows.pools.messages import analysis_needs_prometheus
from workflows.pools.windows import parse_zone
from workflows.signals.config import SignalsConfig, http_address
from workflows.upgrade.scope import ClusterPolicyScope, DriverVersion, UpgradeRefused
from workflows.wording import duration_text, quoted, shown


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClusterConfig(_Model):
    name: str | None = Field(default=None, description=(
        "What people call the cluster; with `clusters:`, each cluster's key (set here by gpuops). "
        "Requests keep it, so a request says which cluster it changes."))
    pool_label: str = Field(default="gpuops.io/pool", description=(
        "The node label whose value names a node's pool (e.g. a cloud node-group label)."))
    operator_namespace: str | None = Field(default=None, description=(
        "Where the GPU Operator runs; found from the ClusterPolicy when not set."))
    cluster_policy_owner: str | None = Field(default=None, description=(
        "Who owns the ClusterPolicy (a team or channel); else its gpuops.io/owner annotation."))


class OperatorSupportRow(_Model):
    kubernetes: str = Field(description=(
        "Kubernetes minor versions the release line supports, \"1.30-1.35\" (or one, \"1.31\")."))
    source: str = Field(default="gpuops configuration (inventory.operator_support)", description=(
        "Where this comes from (a vendor's validation, NVIDIA's page for a newer release)."))

    @field_validator("kubernetes")
    @classmethod
    def _range(cls, value: str) -> str:
        KubernetesRange.parse(value)  # raises ValueError with the reason
        return value


class InventoryConfig(_Model):
    upgrade_stuck_after: Duration = Field(default=dt.timedelta(hours=1), description=(
        "How long a node may stay in one state of the GPU Operator's driver upgrade before the "
        "`upgrade-stuck` finding."))
    mig_pending_stuck_after: Duration = Field(default=dt.timedelta(minutes=30), description=(
        "How long a node's MIG change may stay unfinished before the `mig-change-stuck` finding."))
    forgotten_after: Duration = Field(default=dt.timedelta(days=7), description=(
        "How long a person's cordon or taint on a GPU node may stand, counted from when gpuops first saw "
        "it, with no gpuops run on the node and no note (`/gpu note`), before the `restriction-forgotten` "
        "finding."))
    operator_support: dict[str, OperatorSupportRow] = Field(default_factory=dict, description=(
        "GPU Operator release line (\"25.10\") -> the Kubernetes versions it supports; over the table "
        "gpuops ships (workflows/fleet/operator_support.yaml), row by row."))

    @field_validator("operator_support")
    @classmethod
    def _release_lines(cls, rows: dict[str, OperatorSupportRow]) -> dict[str, OperatorSupportRow]:
        for line in rows:
            if release_line(line) != line:
                raise ValueError(f"release line {line!r} is not YY.MM such as \"25.10\"")
        return rows

    def operator_support_table(self) -> dict[str, KubernetesRange]:
        table = dict(shipped_operator_support())
        for line, row in self.operator_support.items():
            table[line] = KubernetesRange.parse(row.kubernetes, source=row.source)
        return table


class EngineConfig(_Model):
    max_parallel_nodes: int = Field(default=4, ge=1, le=500, description=(
        "Nodes of one wave the engine changes at once; a plan's waves (max_unavailable, "
        "min_ready_gpus) decide what may be out together, this caps it for the API's sake."))


class DisplayConfig(_Model):
    timezone: str | None = Field(default=None, description=(
        "The IANA time zone every time gpuops shows is written in, with its zone "
        "(\"Europe/Berlin\"). Unset: the zone of the first rotation, else UTC."))

    @field_validator("timezone")
    @classmethod
    def _zone_name(cls, name: str | None) -> str | None:
        if name is not None:
            parse_zone(name)
        return name


class UpgradesConfig(_Model):
    allowed_versions: tuple[str, ...] = Field(default=(), description=(
        "Driver versions an upgrade may ask for (empty: any well-formed version). A rollback to the "
        "version a run replaced is always allowed."))
    cluster_policy_scope: ClusterPolicyScope = Field(default="pool", description=(
        "What an upgrade of a pool whose driver the ClusterPolicy sets may reach: `pool` (the "
        "default) refuses it while the ClusterPolicy drives other pools too; `all-pools` accepts that "
        "their driver moves with it (on their next driver restart, or held back until upgraded in "
        "turn when autoUpgrade is on) and the plan says so."))
    gpu_check: GpuCheck | None = Field(default=None, description=(
        "The canary pod every upgraded node runs before it is given back (a pool's own `gpu_check` "
        "replaces it; unset here and there: no check pod)."))

    @field_validator("allowed_versions")
    @classmethod
    def _versions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for version in value:
            try:
                DriverVersion.parse(version)  # refuses "latest", "v580", "580.95.05-ubuntu22.04"
            except UpgradeRefused as err:
                raise ValueError(err.reason) from None
        return value


class AccessConfig(_Model):
    users: dict[str, tuple[Role, ...]] = Field(default_factory=dict, description="Slack user id -> roles.")
    usergroups: dict[str, tuple[Role, ...]] = Field(default_factory=dict, description=(
        "Slack user group id -> roles (members resolved through usergroups.users.list)."))
    names: dict[str, str] = Field(default_factory=dict, description=(
        "Display names for users, used where Slack is not asked (console, CLI, tests)."))
    cli_roles: tuple[Role, ...] = Field(default=(Role.VIEWER,), description=(
        "Roles of the local user of the `gpuops` command line."))


CLUSTER_NAME = r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$"


class ClusterEntry(_Model):
    """One cluster of several (`clusters:`): how to reach it and what is in it. Pools,
    policies and operator settings are per cluster; access, rotations, the engine and the
    database are gpuops-wide."""

    home: bool = Field(default=False, description=(
        "The cluster whose API holds the engine's Lease and where runs change nodes."))
    kubeconfig: Path | None = Field(default=None, description=(
        "Where its credentials are: a kubeconfig file (and context), or the pod's own service account "
        "(in_cluster, the home cluster only). Neither: the kubeconfig and context gpuops was started "
        "with (the home cluster only)."))
    context: str | None = Field(default=None, description=(
        "The kubeconfig context to use (unset: the file's current context)."))
    in_cluster: bool = Field(default=False, description=(
        "Use the pod's own service account (the home cluster only)."))
    channels: tuple[str, ...] = Field(default=(), description=(
        "Slack channel ids where commands address this cluster unless they name another."))
    cluster: ClusterConfig = ClusterConfig()
    inventory: InventoryConfig = InventoryConfig()
    pools: dict[PoolKey, PoolConfig] = Field(default_factory=dict)
    upgrades: UpgradesConfig = UpgradesConfig()
    signals: SignalsConfig | None = Field(default=None, description=(
        "Its GPU health from DCGM (unset: the top-level `signals` for the home cluster, nothing for "
        "the others). Another cluster's reads through Prometheus: its exporter pods' IPs are on its "
        "own network."))

    @model_validator(mode="after")
    def _one_source(self) -> ClusterEntry:
        if self.in_cluster and (self.kubeconfig is not None or self.context is not None):
            raise ValueError("give in_cluster or a kubeconfig/context, not both")
        if not self.home and self.signals is not None and self.signals.exporters is not None:
            raise ValueError("signals.exporters is for the home cluster (its exporter pods' IPs are on its network); "
                             "read another cluster's DCGM series through signals.prometheus")
        return self


class GpuopsConfig(_Model):
    cluster: ClusterConfig = Field(default=ClusterConfig(), description=(
        "The cluster gpuops serves: its name, the node label naming pools, the GPU Operator's "
        "namespace and the ClusterPolicy's owner."))
    inventory: InventoryConfig = Field(default=InventoryConfig(), description=(
        "How the fleet's inventory judges what it reads: when an upgrade or a MIG change counts as "
        "stuck, and which Kubernetes versions each GPU Operator release supports."))
    pools: dict[PoolKey, PoolConfig] = Field(default_factory=dict, description=(
        "Each pool by name (the value of its nodes' `cluster.pool_label`): its kind, approvers and "
        "operators, windows, capacity rules and timeouts."))
    access: AccessConfig = Field(default=AccessConfig(), description=(
        "Who may do what: roles per Slack user and user group, display names, and the command line's "
        "roles."))
    upgrades: UpgradesConfig = Field(default=UpgradesConfig(), description=(
        "Driver upgrades across the fleet: the versions allowed, what a ClusterPolicy's upgrade may "
        "reach, and the check pod every upgraded node runs."))
    engine: EngineConfig = Field(default=EngineConfig(), description=(
        "The run engine's settings."))
    database: str | None = Field(default=None, description=(
        "The database: a SQLite file's path, or a PostgreSQL URL (postgresql://USER@HOST:PORT/DATABASE) "
        "without its password, which comes from PGPASSWORD or ~/.pgpass (unset: `--database`, else "
        "./.gpuops/gpuops.db, or /var/lib/gpuops/gpuops.db in a pod). A URL with its password is a secret: "
        "give it in GPUOPS_DATABASE_URL, or in a file named by `database_url_file` or GPUOPS_DATABASE_URL_FILE "
        "(a mounted Secret)."))
    database_url_file: Path | None = Field(default=None, description=(
        "A file holding the PostgreSQL URL, password included (a mounted Secret): read at start, never "
        "logged (its password shown as ***). GPUOPS_DATABASE_URL or GPUOPS_DATABASE_URL_FILE take its place."))
    rotations: tuple[RotationConfig, ...] = Field(default=(), description=(
        "On-call rotations that get the shift handover checklist at every shift change."))
    display: DisplayConfig = Field(default_factory=DisplayConfig, description=(
        "How gpuops writes what people read (the time zone of its times)."))
    signals: SignalsConfig | None = Field(default=None, description=(
        "GPU health from DCGM (unset: gpuops says nothing about it)."))
    docs_url: str | None = Field(default=None, description=(
        "Where the gpuops documentation site is served, e.g. https://gpuops.example.com/docs/ "
        "(`make docs` builds it): each finding and each halted run in Slack links to its runbook "
        "there. Unset: no links."))

    clusters: dict[str, ClusterEntry] = Field(default_factory=dict, description=(
        "Several clusters served by one gpuops (unset: one cluster, described by the keys above). "
        "Set, `cluster`, `inventory`, `pools` and `upgrades` go under each cluster."))

    @field_validator("database")
    @classmethod
    def _database(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            location = database_location(value)
        except BadDatabaseLocation as err:
            raise ValueError(str(err)) from None
        if location.has_password:
            raise ValueError(_say_database_password(location.shown))
        return value

    @model_validator(mode="after")
    def _one_database(self) -> GpuopsConfig:
        if self.database is not None and self.database_url_file is not None:
            raise ValueError("give `database` or `database_url_file`, not both")
        return self

    @field_validator("docs_url")
    @classmethod
    def _docs_url(cls, value: str | None) -> str | None:
        return http_address(value) if value is not None else None

    def runbook_url(self, page: str) -> str | None:
        """The runbook `page` ("findings/gpu-xid", "halts/evict") on the documentation site,
        or None when `docs_url` is unset."""
        return f"{self.docs_url.rstrip('/')}/runbooks/{page}/" if self.docs_url else None

    def finding_runbook_url(self, code: str | None) -> str | None:
        """The runbook of the finding `code` wherever a finding is shown (`/gpu findings`,
        `/gpu status`, `/gpu node`, the handover); None without a code or `docs_url`."""
        return self.runbook_url(f"findings/{code}") if code else None

    def halt_runbook_url(self, code: str) -> str | None:
        """The runbook of the reason a run halted (its `HaltCode`); None without `docs_url`."""
        return self.runbook_url(f"halts/{code}")

    @field_validator("clusters")
    @classmethod
    def _cluster_names(cls, clusters: dict[str, ClusterEntry]) -> dict[str, ClusterEntry]:
        channels: dict[str, str] = {}
        for name, entry in clusters.items():
            if not re.match(CLUSTER_NAME, name):
                raise ValueError(f"cluster name {name!r}: lower-case letters, digits and '-', at most 32")
            if entry.in_cluster and not entry.home:
                raise ValueError(f"{name}: in_cluster is for the home cluster (where gpuops runs)")
            for channel in entry.channels:
                if channel in channels:
                    raise ValueError(f"channel {channel} defaults to both {channels[channel]} and {name}")
                channels[channel] = name
        homes = [name for name, entry in clusters.items() if entry.home]
        if clusters and len(homes) != 1:
            raise ValueError("exactly one cluster must be the home cluster (home: true), where the engine runs; "
                             f"found {len(homes)}" + (f": {', '.join(homes)}" if homes else ""))
        for name, entry in clusters.items():
            if not entry.home and entry.kubeconfig is None:
                raise ValueError(f"{name}: a cluster other than the home cluster needs its kubeconfig")
        return clusters

    @model_validator(mode="after")
    def _per_cluster_keys(self) -> GpuopsConfig:
        if self.clusters:
            flat = [key for key in ("cluster", "inventory", "pools", "upgrades") if key in self.model_fields_set]
            if flat:
                raise ValueError(f"with clusters: set, {', '.join(flat)} go under each cluster "
                                 f"(clusters.<name>.{flat[0]}), not at the top")
        return self

    @model_validator(mode="after")
    def _pools_know_their_signals(self) -> GpuopsConfig:
        # Each pool learns how its GPU signals are read (its plans say whether nodes are
        # compared before and after), and its analysis queries, PromQL, need a Prometheus:
        # an exporter's page cannot answer them.
        views = ([(None, self.pools, self.signals)] if not self.clusters else
                 [(name, entry.pools, entry.signals if entry.signals is not None else
                   (self.signals if entry.home else None)) for name, entry in self.clusters.items()])
        for cluster, pools, signals in views:
            for pool, policy in pools.items():
                policy.with_signals(None if signals is None else
                                    "prometheus" if signals.prometheus is not None else "exporters")
                if policy.analysis and (signals is None or signals.prometheus is None):
                    raise ValueError(analysis_needs_prometheus(pool, cluster=cluster,
                                                               exporters=signals is not None))
        return self

    @property
    def home_cluster(self) -> str | None:
        """The home cluster's name (None: one cluster, unnamed)."""
        return next((name for name, entry in self.clusters.items() if entry.home), None)

    def for_cluster(self, name: str) -> GpuopsConfig:
        """The configuration as one cluster sees it: its own cluster, inventory, pools and
        upgrades keys, and the gpuops-wide rest. Without `clusters:`, this one."""
        if not self.clusters:
            return self
        entry = self.clusters[name]
        signals = entry.signals if entry.signals is not None else (self.signals if entry.home else None)
        return self.model_copy(update={"cluster": entry.cluster.model_copy(update={"name": name}),
                                       "inventory": entry.inventory, "signals": signals,
                                       "pools": entry.pools, "upgrades": entry.upgrades, "clusters": {}})

    def cluster_of_channel(self, channel: str | None) -> str | None:
        """The cluster commands in `channel` address unless they name one."""
        if channel is None:
            return None
        return next((name for name, entry in self.clusters.items() if channel in entry.channels), None)

    @property
    def display_zone(self) -> zoneinfo.ZoneInfo:
        """The zone times are shown in: `display.timezone`, else the first rotation's, else UTC."""
        if self.display.timezone is not None:
            return parse_zone(self.display.timezone)
        return self.rotations[0].zone if self.rotations else zoneinfo.ZoneInfo("UTC")

    @property
    def cluster_name(self) -> str | None:
        """The name of the cluster this configuration is about (None: one unnamed cluster)."""
        return self.cluster.name

    @property
    def names(self) -> dict[str, str]:
        """Display names for users (`access.names`), where Slack is not asked."""
        return self.access.names

    def inventory_settings(self) -> InventorySettings:
        return InventorySettings(
            pool_label_key=self.cluster.pool_label,
            pool_kinds={name: pool.kind for name, pool in self.pools.items()},
            upgrade_stuck_after=self.inventory.upgrade_stuck_after,
            mig_pending_stuck_after=self.inventory.mig_pending_stuck_after,
            cluster_policy_owner=self.cluster.cluster_policy_owner,
            placement={name: pool.workloads.placement() for name, pool in self.pools.items() if pool.workloads},
            operator_support=self.inventory.operator_support_table(),
        )

    def actor(self, user_id: str, *, groups: tuple[str, ...] = (), via: str = "slack",
              name: str | None = None, unread_groups: tuple[str, ...] = ()) -> Actor:
        """The Actor for a user: roles by user id and by the user groups they are in;
        pool-scoped rights from each pool's `approvers` and `operators`. A fleet operator
        operates every pool but those whose `global_operators` is false (then the role is
        held pool by pool, and only the pool's own operators, and admins, operate it)."""
        roles: set[Role] = set(self.access.users.get(user_id, ()))
        for group in groups:
            roles.update(self.access.usergroups.get(group, ()))

        def named(people: tuple[str, ...]) -> bool:
            return user_id in people or any(f"group:{g}" in people for g in groups)

        own = {pool: not policy.global_operators for pool, policy in self.pools.items()}
        fleet_operator = Role.OPERATOR in roles and Role.ADMIN not in roles and any(own.values())
        if fleet_operator:
            roles.discard(Role.OPERATOR)
            roles.add(Role.VIEWER)  # what the operator role also grants, everywhere
        pool_roles = {}
        for pool, policy in self.pools.items():
            here = set()
            if named(policy.approvers):
                here.add(Role.APPROVER)
            if named(policy.operators) or (fleet_operator and not own[pool]):
                here.add(Role.OPERATOR)
            if here:
                pool_roles[pool] = frozenset(here)
        return Actor(user_id=UserId(user_id), name=name or self.access.names.get(user_id, user_id),
                     roles=frozenset(roles), pool_roles=pool_roles, via=via, groups=tuple(groups),
                     unread_groups=tuple(unread_groups))


class _ConfigSchema(GenerateJsonSchema):
    """The schema as the file is written: a duration is "90s", "30m", "1h30m" or a number of
    seconds (not ISO 8601), and its default is shown that way."""

    def timedelta_schema(self, schema: core_schema.TimedeltaSchema) -> JsonSchemaValue:
        return {"anyOf": [{"type": "string", "pattern": DURATION_PATTERN}, {"type": "number", "minimum": 0}]}

    def encode_default(self, dft: Any) -> Any:
        if isinstance(dft, dt.timedelta):
            return duration_text(dft)
        return super().encode_default(dft)


# What parse_duration reads (workflows/durations.py), for editors: days, hours, minutes, seconds.
DURATION_PATTERN = r"^\s*(?:\d+d)?\s*(?:\d+h)?\s*(?:\d+m)?\s*(?:\d+s)?\s*$"


def config_json_schema() -> dict[str, Any]:
    """The configuration file's JSON Schema (`gpuops config schema`; the chart's
    values.schema.json holds it under `config`): every key with its type, default and the
    meaning its field description gives."""
    schema = GpuopsConfig.model_json_schema(schema_generator=_ConfigSchema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "gpuops configuration",
            "description": "The gpuops configuration file (deploy/config.example.yaml).",
            **{key: value for key, value in schema.items() if key != "title"}}


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file, key and reason."""


# How much gpuops reads as its configuration. A configuration is a few kilobytes nested
# about ten levels deep, whose aliases repeat a few windows or pools; YAML lets a kilobyte
# stand for a billion values (aliases of aliases) and nesting exhaust the stack, so a file
# past these bounds is refused where it crosses them, before it costs memory or time.
CONFIG_MAX_BYTES = 1024 * 1024
CONFIG_MAX_DEPTH = 32
# Values (mappings, lists and scalars) the document stands for, each alias counting all
# its anchor holds again: what validating it walks (a megabyte of one-character values
# would be half a million).
CONFIG_MAX_VALUES = 50_000
# Problems a refusal lists (the rest are counted), and how long a reason may run.
_PROBLEMS_LISTED = 20
_REASON_AT_MOST = 300


def load_config(path: str | Path | None, *, max_bytes: int = CONFIG_MAX_BYTES) -> GpuopsConfig:
    """The configuration in `path` (defaults without one), or ConfigError naming every
    problem as `file:line:column: key: reason` (`gpuops config check` prints the same).
    The YAML is parsed once, into nodes that keep their positions for the messages, and
    every value a message quotes is cut short with its control characters escaped."""
    if path is None:
        return GpuopsConfig()
    path = Path(path)
    data = _read(path, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line, column = _byte_position(data, err.start)
        raise ConfigError(f"{path}:{line}:{column}: {_say_not_utf8(data[err.start], err.reason)}") from None
    tree, raw = _parse(path, data, text)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:1:1: the configuration must be a mapping of keys, not {type(raw).__name__}")
    try:
        return GpuopsConfig.model_validate(raw)
    except ValidationError as err:
        errors = err.errors()
        problems = []
        for error in errors[:_PROBLEMS_LISTED]:
            loc = tuple(error["loc"])
            line, column = _position(tree, loc)
            problems.append(f"{path}:{line}:{column}: {_key(loc)}: {_reason(error)}")
        if len(errors) > _PROBLEMS_LISTED:
            problems.append(f"{path}: {_say_more_problems(len(errors) - _PROBLEMS_LISTED)}")
        raise ConfigError("\n".join(problems)) from None


def _read(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, never more than `max_bytes` of them read (a FIFO or /dev/zero too)."""
    try:
        with path.open("rb") as stream:
            data = stream.read(max_bytes + 1)
            size = os.fstat(stream.fileno()).st_size
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the configuration: {err.strerror}") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{path}:1:1: {_say_too_large(size if size > max_bytes else None, max_bytes)}")
    return data


def _parse(path: Path, data: bytes, text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree and the values built from it, or ConfigError at the place
    the YAML breaks or crosses a bound."""
    loader = None
    try:
        loader = _Loader(text)
        tree = loader.get_single_node()
        raw = loader.construct_document(tree) if tree is not None else None
    except _Refused as err:
        raise ConfigError(f"{path}:{err.mark.line + 1}:{err.mark.column + 1}: {err.reason}") from None
    except yaml.reader.ReaderError as err:  # a character YAML does not allow in a file
        line, column = (_byte_position(data, err.position) if _Loader.counts_bytes
                        else _char_position(text, err.position))
        raise ConfigError(f"{path}:{line}:{column}: not valid YAML: {_say_character(err.character)}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{where}: not valid YAML: {_cut(shown(problem))}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return tree, raw or {}


class _Refused(Exception):
    """The YAML crosses a bound, or holds a value it cannot be built into, at `mark`."""

    def __init__(self, mark: Any, reason: str) -> None:  # PyYAML's Mark or libyaml's (no common base)
        super().__init__(reason)
        self.mark, self.reason = mark, reason


class _Bounded(Composer):
    """PyYAML's composer and constructor, counting as they go: the values composed so far
    with every alias expanded, and how deep they nest. Each node's reach (its values with
    aliases expanded, and their depth) is known once it is composed, so an alias is refused
    where it would take the count past the bound or nest too deep, or where it names the
    anchor it is inside of (a value holding itself), before anything walks the expansion."""

    counts_bytes = False  # where the parser says a bad character is: in characters (PyYAML's) or bytes

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0  # the levels above the node being composed
        self._values = 0  # so far, aliases expanded
        self._reach: dict[int, tuple[int, int]] = {}  # id(node) -> (values, depth)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[attr-defined]  # the parser's, beside this class in each loader
        if isinstance(event, AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined one PyYAML refuses
                self._repeat(target, event)
            return super().compose_node(parent, index)
        if self._depth >= CONFIG_MAX_DEPTH:
            raise _Refused(event.start_mark, _say_too_deep(CONFIG_MAX_DEPTH))
        self._values += 1
        if self._values > CONFIG_MAX_VALUES:
            raise _Refused(event.start_mark, _say_too_many_values(CONFIG_MAX_VALUES))
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is None:  # PyYAML's composer always makes one; its stubs allow None
            return None
        if isinstance(node, yaml.ScalarNode):
            self._reach[id(node)] = (1, 1)
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
            reach = [self._reach[id(child)] for child in children]
            self._reach[id(node)] = (1 + sum(values for values, _ in reach), 1 + max((d for _, d in reach), default=0))
        return node

    def _repeat(self, target: yaml.Node, event: AliasEvent) -> None:
        reach = self._reach.get(id(target))
        if reach is None:  # still being composed: the alias is inside its own anchor
            raise _Refused(event.start_mark, _say_alias_inside_itself(str(event.anchor)))
        values, depth = reach
        if self._depth + depth > CONFIG_MAX_DEPTH:
            raise _Refused(event.start_mark, _say_alias_too_deep(str(event.anchor), CONFIG_MAX_DEPTH))
        self._values += values
        if self._values > CONFIG_MAX_VALUES:
            raise _Refused(event.start_mark, _say_alias_repeats_too_much(str(event.anchor), values, CONFIG_MAX_VALUES))

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)  # type: ignore[misc]  # SafeConstructor's, next in each loader's MRO
        except (ValueError, OverflowError) as err:  # "2025-13-45", an int of 5,000 digits
            raise _Refused(node.start_mark, _say_cannot_build(node.value, node.tag, err)) from None


class _PythonLoader(Reader, Scanner, Parser, _Bounded, SafeConstructor, Resolver):
    """PyYAML's parser in Python, our composer, PyYAML's safe constructor."""

    def __init__(self, text: str) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        _Bounded.__init__(self)


_Loader: type[_PythonLoader | _LibyamlLoader] = _PythonLoader
if yaml.__with_libyaml__:  # as PyYAML's wheels are built: events at C speed
    from yaml._yaml import CParser

    class _LibyamlLoader(_Bounded, CParser, SafeConstructor, Resolver):
        """libyaml's parser, our composer, PyYAML's safe constructor."""

        counts_bytes = True

        def __init__(self, text: str) -> None:
            CParser.__init__(self, text)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            _Bounded.__init__(self)

    _Loader = _LibyamlLoader


def _byte_position(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of the byte at `offset`."""
    start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, len(data[start:offset].decode("utf-8", "replace")) + 1


def _char_position(text: str, index: int) -> tuple[int, int]:
    return text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1


def _key(loc: tuple[Any, ...]) -> str:
    """The dotted key of a problem, each part cut short and printable ("[key]", pydantic's
    mark of a mapping key's own problem, left out: the position says it)."""
    parts = [str(part) for part in loc if part != "[key]"]
    return ".".join(shown(_cut(part, 40)) for part in parts) or "(top)"


def _reason(error: Mapping[str, Any]) -> str:
    """pydantic's message without its "Value error, " prefix (our validators' own words),
    the value it quotes cut short, and printable."""
    text = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    if isinstance(value, str):
        text = text.replace(repr(value), quoted(value))
    return _cut(shown(text), _REASON_AT_MOST)


def _cut(text: str, at_most: int = _REASON_AT_MOST) -> str:
    return text if len(text) <= at_most else text[:at_most] + "…"


def _position(tree: yaml.Node | None, loc: tuple[Any, ...]) -> tuple[int, int]:
    """Where in the file the value at `loc` is (1-based line and column): the deepest
    node that exists along the path (a missing key points at the map it belongs in, a
    key's own problem at the key)."""
    node = tree
    if node is None:
        return 1, 1
    key_node = None
    for part in loc:
        if part == "[key]" and key_node is not None:
            node = key_node
            break
        found = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    # An unknown key is the key's own fault; a bad value the value's.
                    found, key_node = (value if value.start_mark is not None else key), key
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            found, key_node = node.value[part], None
        if found is None:
            break
        node = found
    return node.start_mark.line + 1, node.start_mark.column + 1


# ------------------------------------------------------------------ what a refused file is told


def _size_text(size: int) -> str:
    mib = size / (1024 * 1024)
    return f"{mib:g} MiB" if mib == int(mib) else f"{mib:.1f} MiB"


def _say_too_large(size: int | None, at_most: int) -> str:
    what = f"the file is {_size_text(size)}" if size is not None else "the file goes on"
    return (f"{what}, past the {_size_text(at_most)} gpuops reads as its configuration (a configuration is "
            "a few kilobytes: is this the right file?)")


def _say_not_utf8(byte: int, reason: str) -> str:
    return f"not UTF-8 (byte 0x{byte:02x}: {reason}); gpuops reads its configuration as UTF-8: save the file as UTF-8"


def _say_character(character: int | str) -> str:
    char = chr(character) if isinstance(character, int) else character
    return (f"the character {quoted(char)} may not be written in a YAML file "
            "(inside double quotes, an escape such as \"\\t\" or \"\\x1b\" can stand for it)")


def _say_too_deep(at_most: int) -> str:
    return (f"values nested more than {at_most} levels deep; a gpuops configuration nests about ten "
            "(is this the right file?)")


def _say_alias_too_deep(anchor: str, at_most: int) -> str:
    return f"the alias *{_cut(anchor, 40)} would nest values more than {at_most} levels deep"


def _say_alias_inside_itself(anchor: str) -> str:
    return f"the alias *{_cut(anchor, 40)} is inside the value its anchor names (a value cannot hold itself)"


def _say_too_many_values(at_most: int) -> str:
    return (f"more than {at_most:,} values; a gpuops configuration has a few thousand "
            "(is this the right file?)")


def _say_alias_repeats_too_much(anchor: str, values: int, at_most: int) -> str:
    return (f"the alias *{_cut(anchor, 40)} takes the configuration past {at_most:,} values (it repeats "
            f"{values:,}: an alias stands for all its anchor holds, so aliases of aliases multiply)")


def _say_cannot_build(value: object, tag: str, err: Exception) -> str:
    kind = tag.rsplit(":", 1)[-1]
    return f"not valid YAML: {quoted(value)} cannot be read as {kind} ({_cut(shown(str(err)), 80)}); quote it to keep it text"


def _say_more_problems(count: int) -> str:
    return f"and {count:,} more problem{'s' if count != 1 else ''} (fix these and check again)"


def _say_database_password(shown_url: str) -> str:
    return (f"{shown_url} carries its password, which does not belong in the configuration file: leave it out "
            "(PGPASSWORD or ~/.pgpass supplies it), or put the whole URL in a Secret and name its file in "
            "`database_url_file` or GPUOPS_DATABASE_URL_FILE, or give it in GPUOPS_DATABASE_URL")
