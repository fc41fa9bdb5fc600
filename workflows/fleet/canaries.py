"""The last verdict of gpuops' canary pod on each node, from its own records.

A driver upgrade ends each node with a `gpu-check` step: a pod that asks for one GPU and
runs a command (`workflows.engine.check_pod`). A passing pod is deleted, a failing one is
kept for its logs, so the cluster alone cannot say which came last; the steps table can.
The fleet summary sets each node's last verdict beside what the node shows now: a device
plugin that is Ready and advertises GPUs says nothing about whether a container can use
them, and a failed canary does.

Only a pod's own end counts: a check step stopped by an aborted run, or one that timed out
before its pod answered, has no verdict and is passed over.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Mapping
from typing import Any
from dataclasses import dataclass
from types import MappingProxyType

from storage import steps as stored_steps
from storage.database import Database
from workflows.kube.objects import NodeName

# How long a read of the steps table serves `fleet(now)` calls; a verdict shows within it.
REREAD_AFTER = dt.timedelta(seconds=5)


@dataclass(frozen=True, slots=True, kw_only=True)
class CanaryVerdict:
    """One check pod's end on a node."""

    node: NodeName
    passed: bool
    at: dt.datetime  # when the step ended
    run_id: str
    pod: str | None = None  # namespace/name, kept on the node when it failed
    exit_code: int | None = None
    reason: str | None = None  # the kubelet's or the container's word (Error, DeadlineExceeded)
    message: str | None = None  # the pod's own last words (its termination message)


def verdict_of(step: stored_steps.Step) -> CanaryVerdict | None:
    """The verdict a finished `gpu-check` step records, or None when it has none."""
    if step.ended_at is None:
        return None
    detail = step.detail if isinstance(step.detail, dict) else {}
    intent = detail.get("intent")
    pod = intent.get("pod") if isinstance(intent, dict) else None
    common: dict[str, Any] = {"node": NodeName(step.node), "at": step.ended_at, "run_id": str(step.run_id),
                              "pod": pod if isinstance(pod, str) else None}
    if step.state == "done":
        return CanaryVerdict(passed=True, **common)
    result = detail.get("result")
    if not isinstance(result, dict) or not ({"exit_code", "reason"} & result.keys()):
        return None  # stopped or timed out before the pod said anything
    exit_code, reason, message = result.get("exit_code"), result.get("reason"), result.get("message")
    if exit_code is None and reason is None:
        return None
    return CanaryVerdict(passed=False, exit_code=exit_code if isinstance(exit_code, int) else None,
                         reason=reason if isinstance(reason, str) else None,
                         message=message if isinstance(message, str) else None, **common)


def last_verdicts(steps: list[stored_steps.Step]) -> dict[NodeName, CanaryVerdict]:
    """Per node, the newest verdict among `steps` (newest first, as the store gives them)."""
    found: dict[NodeName, CanaryVerdict] = {}
    for step in steps:
        if NodeName(step.node) in found:
            continue
        verdict = verdict_of(step)
        if verdict is not None:
            found[verdict.node] = verdict
    return found


class LastCanaries:
    """Thread-safe; `database` gives the calling thread's connection. The steps table is
    read at most once per `REREAD_AFTER` of the callers' own time."""

    def __init__(self, database: Callable[[], Database], *, cluster: str | None = None) -> None:
        self._database = database
        # With several clusters, the cluster whose runs' checks count (a node name is its
        # cluster's own); None with one cluster: every run's.
        self._cluster = cluster
        self._lock = threading.Lock()
        self._read_at: dt.datetime | None = None
        self._verdicts: Mapping[NodeName, CanaryVerdict] = MappingProxyType({})

    def verdicts(self, now: dt.datetime) -> Mapping[NodeName, CanaryVerdict]:
        with self._lock:
            if self._read_at is not None and dt.timedelta(0) <= now - self._read_at < REREAD_AFTER:
                return self._verdicts
            found = last_verdicts(stored_steps.finished_of_kind(
                self._database(), kind="gpu-check", cluster=None if self._cluster is None else (self._cluster,)))
            self._verdicts, self._read_at = MappingProxyType(found), now
            return self._verdicts
