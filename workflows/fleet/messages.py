"""Every sentence of the fleet's reads at command time (`fleet.node_detail`): why a part
of `/gpu node` is unknown, and how a taint or a budget is written."""

from __future__ import annotations

import datetime as dt
from typing import Any

from workflows.wording import when


def managed_fields_shape(where: str) -> str:
    return f"the API server's answer is not shaped as documented ({where}): who set what is unknown"


def answer_shape(error: str) -> str:
    return f"the API server's answer is not shaped as documented ({error})"


def read_late(deadline: float) -> str:
    return f"the API server did not answer within {deadline:g}s"


def read_failed(error: str) -> str:
    return f"the API server refused or failed the read: {error}"


def budgets_unknown(namespace: str, reason: str) -> str:
    return f"budgets of namespace {namespace} not read: {reason}"


def spec_taint_text(key: str, *, value: Any, effect: str) -> str:
    """As kubectl writes a taint: key=value:effect (key:effect without a value)."""
    return f"{key}={value}:{effect}" if value not in (None, "") else f"{key}:{effect}"


def budget_text(name: str, *, expressions: bool, allowed: int) -> str:
    note = ", by its matchLabels; its matchExpressions not read" if expressions else ""
    return f"{name} ({allowed} disruption{'' if allowed == 1 else 's'} allowed{note})"


def cluster_not_answered(cluster: str, *, since: dt.datetime | None, reason: str | None, zone: dt.tzinfo) -> str:
    """Why a cluster never listed has nothing to show: since when gpuops has tried, in
    the reader's zone, and the last word it had."""
    since_text = f" since {when(since, zone)}" if since is not None else ""
    why = f": {reason}" if reason else ""
    return f"cluster {cluster} has not answered{since_text}{why}"
