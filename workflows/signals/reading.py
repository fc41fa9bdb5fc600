"""One reading of DCGM health, whichever way it was read: per node, its GPUs' health;
per node whose health could not be read, why (one sentence); and, when nothing could be
read at all, why. What is not in `nodes` is unknown, never healthy; so is what a node's
unreadable series (`NodeHealth.unreadable`) would have said."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from workflows.kube.objects import NodeName
from workflows.signals.health import NodeHealth


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    source: str  # "Prometheus at http://…", "dcgm-exporter pods (port 9400)", for the view
    nodes: Mapping[NodeName, NodeHealth] = field(default_factory=dict)
    unavailable: str | None = None  # why nothing could be read, in words
    # Nodes whose health could not be read while others' could -> why, in words (read
    # straight from the exporters: an exporter that did not answer, a node without one).
    unknown: Mapping[NodeName, str] = field(default_factory=dict)
    # Of `unknown`, the nodes that have an exporter which did not answer (the rest have none).
    failed: frozenset[NodeName] = frozenset()

    def node(self, name: str) -> NodeHealth | None:
        return self.nodes.get(NodeName(name))

    def known(self, node: str) -> bool:
        """Whether `node`'s GPU health was read in full (else its DCGM findings are
        unknown, not gone: a series it sent that could not be read may have raised one)."""
        health = self.nodes.get(NodeName(node))
        return self.unavailable is None and health is not None and not health.unreadable
