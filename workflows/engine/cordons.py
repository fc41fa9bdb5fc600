"""gpuops' cordon marks outside a run: stale marks cleared, and `/gpu uncordon`.

A run that cordons a node writes the mark `gpuops.io/cordoned-by` (which run, for whom,
whether the node was cordoned before) in the same patch; its uncordon step removes it.
The mark is meant to live exactly as long as that cordon:

- A mark on a schedulable node whose run is finished is **stale**: a person uncordoned
  the node by hand, as gpuops' messages advise. Left there, it would make a later human
  cordon read as "cordoned by gpuops for alice". The leader clears such marks
  (`clear_stale_marks`, one patch guarded by the node's resourceVersion, audited). A
  mark whose run is unfinished is that run's to remove, and stays.
- `/gpu uncordon <node>` gives back a node a finished gpuops run left cordoned (a failed
  validation, an abort), so nobody has to leave gpuops to undo its cordons. An operator
  of the node's pool may; it is refused, changing nothing, when the node is not cordoned,
  was not cordoned by gpuops, was cordoned by someone before the run (gpuops only marked
  that cordon), or its run is still unfinished (`drain done` or abort that run instead).
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
from collections.abc import Iterable, Mapping
from typing import Protocol

from storage import audit
from storage import requests as stored_requests
from storage import runs as stored_runs
from storage.database import Database
from storage.ids import RunId
from workflows.access import Actor, Role, require
from workflows.engine import cordon_messages as say
from workflows.engine.kube_events import queue_person_event
from workflows.engine.steps.cordoning import CordonMark
from workflows.kube.errors import Conflict, KubeError, NotFound
from workflows.kube.labels import ANNOTATION_CORDONED_BY
from workflows.kube.objects import NodeObject

log = logging.getLogger("gpuops.cordons")


class UncordonRefused(Exception):
    """`/gpu uncordon` would undo what is not gpuops' to undo; the message says why."""


class ClusterNodes(Protocol):
    """What the cordon marks read and write of a cluster's nodes, as whom
    (`kube.gateway.KubeGateway` is one)."""

    @property
    def identity(self) -> str: ...

    def get_node(self, name: str) -> NodeObject: ...

    def annotate_node(self, name: str, *, annotations: Mapping[str, str | None],
                      resource_version: str | None, dry_run: bool) -> NodeObject: ...

    def uncordon_node(self, name: str, *, annotations: Mapping[str, str | None],
                      resource_version: str | None, dry_run: bool) -> NodeObject: ...


class Cordons:
    """Cordon marks on one database connection and one Kubernetes API."""

    def __init__(self, db: Database, gateway: ClusterNodes) -> None:
        self._db = db
        self._gateway = gateway

    def _cluster_of(self, run_id: str) -> str | None:
        """The cluster of the run's request (None: the home cluster), whose Event sender
        sends what is queued about its nodes."""
        run = stored_runs.get(self._db, id=RunId(run_id))
        request = stored_requests.get(self._db, id=run.request_id) if run is not None else None
        return request.cluster if request is not None else None

    def _run_unfinished(self, run_id: str) -> bool:
        run = stored_runs.get(self._db, id=RunId(run_id))
        return run is not None and not run.finished

    def clear_stale_marks(self, nodes: Iterable[str], *, now: dt.datetime) -> list[str]:
        """Remove the stale mark of each of `nodes` (candidates, e.g. the inventory's
        `stale_mark_run`), after reading the node again; returns the nodes cleared. A
        node that changed meanwhile is left for the next look."""
        cleared: list[str] = []
        for name in nodes:
            try:
                node = self._gateway.get_node(name)
            except NotFound:
                continue
            mark = CordonMark.of(node)
            if mark is None or node.unschedulable or self._run_unfinished(mark.run):
                continue
            try:
                with self._db.transaction():  # NB: the audit row is rolled back if the patch fails
                    audit.append(self._db, actor=audit.GPUOPS_ACTOR, k8s_identity=self._gateway.identity,
                                 action="node.mark_cleared", target=name, at=now, run_id=RunId(mark.run),
                                 before=mark.to_text(), after=None,
                                 detail={"text": say.stale_mark_cleared(name, mark.run, mark.by)})
                    self._gateway.annotate_node(name, annotations={ANNOTATION_CORDONED_BY: None},
                                                resource_version=node.resource_version, dry_run=False)
            except Conflict:
                continue
            except KubeError as err:
                log.warning("could not clear the stale cordon mark of %s: %s", name, err)
                continue
            log.info("%s", say.stale_mark_cleared(name, mark.run, mark.by))
            cleared.append(name)
        return cleared

    def uncordon(self, actor: Actor, name: str, *, pool: str | None, now: dt.datetime) -> str:
        """Give back `name`, which a finished gpuops run left cordoned; returns what was
        done. Raises AccessDenied (not an operator of `pool`) or UncordonRefused."""
        require(actor, Role.OPERATOR, action="Uncordoning a node", pool=pool)
        node = self._gateway.get_node(name)
        mark = CordonMark.of(node)
        if not node.unschedulable:
            raise UncordonRefused(say.uncordon_not_cordoned(name))
        if mark is None:
            raise UncordonRefused(say.uncordon_not_ours(name))
        if self._run_unfinished(mark.run):
            raise UncordonRefused(say.uncordon_run_unfinished(name, mark.run))
        if mark.prior_unschedulable:
            raise UncordonRefused(say.uncordon_cordoned_before(name, mark.run))
        text = say.uncordoned_by_person(name, actor.name, mark.run)
        try:
            with self._db.transaction():  # NB: the audit row is rolled back if the patch fails
                audit.append(self._db, actor=actor.user_id, k8s_identity=self._gateway.identity,
                             action="node.uncordoned", target=name, at=now, run_id=RunId(mark.run),
                             before={"unschedulable": True, "mark": mark.to_text()},
                             after={"unschedulable": False}, detail={"text": text})
                queue_person_event(self._db, run_id=mark.run, node=name, what=text, cluster=self._cluster_of(mark.run),
                                   replica=socket.gethostname(), at=now)
                self._gateway.uncordon_node(name, annotations={ANNOTATION_CORDONED_BY: None},
                                            resource_version=node.resource_version, dry_run=False)
        except Conflict:
            raise UncordonRefused(say.uncordon_changed(name)) from None
        log.info("%s", text)
        return text
