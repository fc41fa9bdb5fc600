"""The sentences about several clusters: /gpu clusters and --cluster (commands/clusters.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from workflows.fleet.findings import format_age

CLUSTER_COLUMNS = ("cluster", "API", "nodes ready", "GPUs adv/physical", "problems")


def clusters_title() -> str:
    return "Clusters"


def in_cluster(title: str, cluster: str) -> str:
    return f"{title} · {cluster}"


def cluster_reach(state: str, *, since: dt.datetime | None, now: dt.datetime, reason: str | None) -> str:
    """A cluster's API in a table cell: up, or down/not reached yet with since when."""
    if state == "up":
        return "up"
    age = f" for {format_age(now - since)}" if since is not None else ""
    why = f" ({reason})" if reason else ""
    if state == "connecting":
        return f"not reached yet{age}{why}"
    return f"DOWN{age}{why}; figures as last seen"


def problem_counts(*, critical: int, warning: int) -> str:
    parts = [f"{critical} critical"] if critical else []
    if warning:
        parts.append(f"{warning} warning")
    return ", ".join(parts) or "none"


def cluster_flag_without_name() -> str:
    return "--cluster needs a cluster name, e.g. `--cluster west`"


def one_cluster_only() -> str:
    return ("this gpuops serves one cluster; --cluster and cluster/ names need `clusters:` in its "
            "configuration")


def unknown_cluster(name: str, known: Sequence[str]) -> str:
    return f"there is no cluster {name!r}; gpuops serves {', '.join(known)}"


def two_clusters(named: Sequence[str]) -> str:
    return f"the command names two clusters ({' and '.join(named)}); one command addresses one cluster"


def cluster_unreachable_title() -> str:
    return "Cluster not reached"


def id_of_other_cluster(stored_id: str, cluster: str, named: str) -> str:
    return f"{stored_id} is about cluster {cluster}, not {named}; leave --cluster out, or name {cluster}"
