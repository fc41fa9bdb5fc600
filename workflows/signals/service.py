"""Reads the DCGM series when a command asks: an instant query to Prometheus for one
node's GPUs (or every node's), through `workflows.prometheus`. An unreachable or refusing
Prometheus is not an error for the caller: the reading says why in one sentence, and the
health it carries is empty (unknown, never healthy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from workflows.fleet.findings import Finding
from workflows.kube.objects import NodeName
from workflows.prometheus.client import Endpoint, PrometheusUnavailable, instant_query
from workflows.signals.findings import Thresholds, signal_findings
from workflows.signals.health import SERIES, NodeHealth, node_health


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    source: str  # "Prometheus at http://…", for the view
    nodes: Mapping[NodeName, NodeHealth] = field(default_factory=dict)
    unavailable: str | None = None  # why nothing could be read, in words

    def node(self, name: str) -> NodeHealth | None:
        return self.nodes.get(NodeName(name))

    def known(self, node: str) -> bool:
        """Whether `node`'s GPU health was read (else its DCGM findings are unknown, not gone)."""
        return self.unavailable is None and NodeName(node) in self.nodes


def _label_value(text: str) -> str:
    """`text` as a PromQL string literal's inside."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series_query(*, node_label: str, node: str | None = None) -> str:
    """One instant query for every health series (of one node, if given)."""
    matchers = ['__name__=~"' + "|".join(SERIES) + '"']
    if node is not None:
        matchers.append(f'{node_label}="{_label_value(node)}"')
    return "{" + ", ".join(matchers) + "}"


class SignalsService:
    def __init__(self, *, endpoint: Endpoint, thresholds: Thresholds, node_label: str = "Hostname") -> None:
        self.endpoint = endpoint
        self.thresholds = thresholds
        self.node_label = node_label

    @property
    def source(self) -> str:
        return f"Prometheus at {self.endpoint.shown_url}"

    def read(self, node: str | None = None) -> Reading:
        """The health of `node`'s GPUs (every node's without one), or why it is unknown."""
        try:
            samples = instant_query(self.endpoint, series_query(node_label=self.node_label, node=node))
        except PrometheusUnavailable as err:
            return Reading(source=self.source, unavailable=err.reason)
        return Reading(source=self.source, nodes=node_health(samples, node_label=self.node_label))

    def findings(self, reading: Reading, *, pools: Mapping[str, str | None]) -> tuple[Finding, ...]:
        """The findings of every node in `reading` that `pools` names (node -> pool):
        series of nodes gpuops does not list as GPU nodes are left out."""
        found: list[Finding] = []
        for name, health in reading.nodes.items():
            if name in pools:
                found.extend(signal_findings(health, pool=pools[name], thresholds=self.thresholds))
        return tuple(found)
