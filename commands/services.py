"""What commands may call: the fleet view, configuration, the request service, the drain
use case, the run controls, change freezes and the database the audit log lives in.
Entry points (Slack app, console, command line) build one and pass it in; everything but
`config` and `fleet` is optional, and a command that needs a missing service answers
that it is not available here."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from storage.database import Database
from workflows.config import GpuopsConfig
from workflows.engine.cordons import Cordons
from workflows.engine.runs import RunService
from workflows.fleet.clusters import ClusterGlance, ClusterSource
from workflows.fleet.node_detail import NodeReads
from workflows.fleet.notes import NoteService
from workflows.fleet.summary import FleetSource
from workflows.kinds import ChangeService, ServiceInputs, kinds_in_force
from workflows.requests.records import RoleLookup
from workflows.requests.service import RequestService
from workflows.pools.freezes import FreezeService
from workflows.quotas.service import QuotaService
from workflows.signals.service import SignalsService


S = TypeVar("S")


class ClusterDirectory(Protocol):
    """Every cluster one gpuops serves, by name (commands.clusters.Clusters)."""

    @property
    def home(self) -> str: ...

    @property
    def config(self) -> GpuopsConfig: ...

    @property
    def sources(self) -> Mapping[str, ClusterSource]: ...

    def names(self) -> list[str]: ...

    def default_for(self, channel: str | None) -> str: ...

    def others(self, now: dt.datetime) -> list[ClusterGlance]: ...

    def services_for(self, name: str, home: Services) -> Services: ...


@dataclass
class Services:
    config: GpuopsConfig
    fleet: FleetSource
    requests: RequestService | None = None
    # Start, pause, resume and abort runs, and read the audit log (workflows.engine.runs).
    runs: RunService | None = None
    # The connection the services above use (one per thread, see storage.database).
    database: Database | None = None
    # gpuops' cordon marks outside a run (`/gpu uncordon`); needs the Kubernetes API.
    cordons: Cordons | None = None
    # Each kind of change's service by the kind's name (workflows/kinds.py): drains,
    # driver upgrades, MIG layout changes, moves from host drivers to the GPU Operator.
    changes: Mapping[str, ChangeService] = field(default_factory=dict)
    # GPU quotas against the pools (workflows.quotas.service); needs the Kubernetes API.
    quotas: QuotaService | None = None
    # GPU health from DCGM, through Prometheus or from the exporter pods (workflows.signals); None: not configured,
    # and the views say nothing about it.
    signals: SignalsService | None = None
    # Change freezes of a pool or the cluster (workflows.pools.freezes); needs the database.
    freezes: FreezeService | None = None
    # What `/gpu node` reads when asked (who set the node's labels and taints, the budgets
    # of its GPU pods); needs the Kubernetes API. None: `/gpu node` says it is not read.
    node_reads: NodeReads | None = None
    # Operators' notes on nodes (workflows.fleet.notes); needs the database.
    notes: NoteService | None = None
    # With several clusters (`clusters:` in the configuration): the one these services
    # address, and every cluster by name (commands.clusters). None: one cluster.
    cluster: str | None = None
    clusters: ClusterDirectory | None = None
    # The Slack delivery these services answer (storage.inbox's key), None outside Slack:
    # what they create carries it, so running the delivery again finds it and files nothing.
    delivery: str | None = None

    def change(self, kind: str, service: type[S]) -> S | None:
        """The service of the kind of change `kind`, as the class its command works with;
        None when this entry point has none."""
        found = self.changes.get(kind)
        return found if isinstance(found, service) else None

    @classmethod
    def on_database(cls, *, config: GpuopsConfig, fleet: FleetSource, database: Database,
                    wake_engine: Callable[[], None] | None = None, roles: RoleLookup | None = None,
                    on_approved: Callable[[], None] | None = None,
                    readers: Sequence[object] = (), signals: SignalsService | None = None,
                    delivery: str | None = None) -> Services:
        """Every service on one database connection; `wake_engine` (Engine.wake) makes an
        engine in this process notice run controls at once; `roles` says who holds which
        role now (default: the configuration alone, without Slack user groups);
        `on_approved` is told when a request becomes approved (so its run can start at
        once if its window is open); `readers` what the kinds of change read of the cluster
        besides the fleet (the Kubernetes gateway; each kind's service takes the one answering
        the protocol it needs: without it a drain plan lists no workloads, MIG changes are
        refused, an upgrade plan names no pods, a move finds no hand-set label); each kind
        in force gets its service from its registry line (workflows/kinds.py `service`);
        `signals` the process's one DCGM reader (it remembers counters for their
        rates; without it one is made from the configuration, over `fleet`'s pods);
        `delivery` the Slack delivery they answer (a request it files is found again
        when the delivery runs again, see storage.inbox)."""
        requests = RequestService(database, config, roles=roles, on_approved=on_approved, delivery=delivery)
        inputs = ServiceInputs(requests=requests, config=config, readers=tuple(readers))
        changes = [service for kind in kinds_in_force() if (service := kind.build_service(inputs)) is not None]
        return cls(config=config, fleet=fleet, requests=requests,
                   changes={service.kind: service for service in changes},
                   runs=RunService(database, wake=wake_engine, names=config.names, cluster=config.cluster_name,
                                   requests=requests, zone=config.display_zone),
                   database=database,
                   freezes=FreezeService(database, pools=config.pools, names=config.names, wake=wake_engine,
                                         cluster=config.cluster_name, zone=config.display_zone, delivery=delivery),
                   notes=NoteService(database, names=config.names, cluster=config.cluster_name, delivery=delivery),
                   delivery=delivery,
                   signals=signals if signals is not None else (
                       config.signals.service(cluster=fleet) if config.signals is not None else None))
