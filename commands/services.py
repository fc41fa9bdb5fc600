"""What commands may call: the fleet view, configuration, the request service, the run
controls, the database the audit log lives in, and (optional) the pods and PDBs a
drain preview lists. Entry points (Slack app, console,
command line) build one and pass it in; everything but `config` and `fleet` is optional,
and a command that needs a missing service answers that it is not available here."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from storage.database import Database
from workflows.config import GpuopsConfig
from workflows.drain.plan import PdbView
from workflows.engine.cordons import Cordons
from workflows.engine.runs import RunService
from workflows.fleet.summary import Fleet
from workflows.kube.objects import NodeName, PodObject
from workflows.requests.service import RequestService, RoleLookup


class FleetSource(Protocol):
    def fleet(self, now: dt.datetime) -> Fleet: ...


class WorkloadSource(Protocol):
    """The pods and PodDisruptionBudgets a drain preview reads (the fleet's inventory
    only counts GPUs). Entry points adapt the watch cache; tests pass plain values."""

    def pods_on(self, node: NodeName) -> Sequence[PodObject]: ...

    def pdbs(self, namespace: str) -> Sequence[PdbView]: ...


@dataclass
class Services:
    config: GpuopsConfig
    fleet: FleetSource
    requests: RequestService | None = None
    # Start, pause, resume and abort runs, and read the audit log (workflows.runs).
    runs: RunService | None = None
    # The connection the services above use (one per thread, see storage.database).
    database: Database | None = None
    # Pods and PDBs for drain previews; without it a drain plan lists no workloads.
    cluster: WorkloadSource | None = None
    # gpuops' cordon marks outside a run (`/gpu uncordon`); needs the Kubernetes API.
    cordons: Cordons | None = None

    @classmethod
    def on_database(cls, *, config: GpuopsConfig, fleet: FleetSource, database: Database,
                    wake_engine: Callable[[], None] | None = None, roles: RoleLookup | None = None,
                    on_approved: Callable[[], None] | None = None) -> Services:
        """Every service on one database connection; `wake_engine` (Engine.wake) makes an
        engine in this process notice run controls at once; `roles` says who holds which
        role now (default: the configuration alone, without Slack user groups);
        `on_approved` is told when a request becomes approved (so its run can start at
        once if its window is open)."""
        return cls(config=config, fleet=fleet,
                   requests=RequestService(database, config, roles=roles, on_approved=on_approved),
                   runs=RunService(database, wake=wake_engine, names=config.access.names), database=database)
