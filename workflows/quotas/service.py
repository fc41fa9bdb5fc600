"""The quota report on demand: ResourceQuotas read through the gateway when asked (one
LIST; quotas change rarely and the command is rare, so they are not watched), nodes and
GPU pods from the watch cache's snapshot. The same report answers a plan's pre-flight
(`quota_limits`, the `preflight.facts.QuotaLimits` a kind's service reads through)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol

from workflows.fleet.settings import InventorySettings
from workflows.kube.errors import Forbidden, KubeError
from workflows.kube.objects import ClusterSnapshot, ResourceQuotaObject
from workflows.preflight.facts import QuotaLimit, QuotaReading
from workflows.quotas import messages as say
from workflows.quotas.report import QuotaReport, evaluate


class QuotaReader(Protocol):
    """What reads the cluster's ResourceQuotas (the Kubernetes gateway)."""

    identity: str

    def list_resource_quotas(self) -> list[ResourceQuotaObject]: ...


class SnapshotSource(Protocol):
    """What holds nodes and GPU pods (the watch cache)."""

    def snapshot(self, now: dt.datetime) -> ClusterSnapshot: ...


class QuotasUnreadable(Exception):
    """The ResourceQuotas could not be listed; the message says why and what to grant."""


@dataclass
class QuotaService:
    reader: QuotaReader
    cluster: SnapshotSource
    settings: InventorySettings

    def report(self, now: dt.datetime) -> QuotaReport:
        try:
            quotas = self.reader.list_resource_quotas()
        except Forbidden as err:
            raise QuotasUnreadable(say.unreadable(self.reader.identity, err.api_message, forbidden=True)) from None
        except KubeError as err:
            raise QuotasUnreadable(say.unreadable(self.reader.identity, str(err), forbidden=False)) from None
        snapshot = self.cluster.snapshot(now)
        return evaluate(nodes=snapshot.nodes, pods=snapshot.pods, quotas=quotas, settings=self.settings)

    def quota_limits(self, now: dt.datetime) -> QuotaReading:
        """Every namespace's enforced GPU quota and the pools its pods can land on, for a
        plan's pre-flight; quotas that cannot be read say why (a plan is not refused for it)."""
        try:
            report = self.report(now)
        except QuotasUnreadable as err:
            return QuotaReading(unread=str(err))
        return QuotaReading(limits=tuple(
            QuotaLimit(namespace=n.namespace, resource=resource, hard=hard, pools=tuple(str(p) for p in n.pools))
            for n in report.namespaces for resource, hard in sorted(n.quota.items())))
