"""Reads the DCGM series when a command asks, one of two ways: an instant query to
Prometheus for one node's GPUs (or every node's), through `workflows.prometheus`, or
straight from the dcgm-exporter pods' pages (`exporters`). An unreachable or refusing
source is not an error for the caller: the reading says why in one sentence, and the
health it carries is empty (unknown, never healthy).

Through Prometheus the rates of correctable ECC errors and PCIe replays are one more
query, `increase(...[1h])` of each counter; where Prometheus has too few points for it
(a new series), or its answer is not in by the reading's deadline (both queries share
the timeout), the rate is not known yet."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping

from workflows.fleet.findings import Finding, node_command
from workflows.kube.objects import NodeName
from workflows.prometheus.client import Endpoint, PrometheusUnavailable, instant_query
from workflows.prometheus.fetching import Deadline
from workflows.prometheus.samples import Sample
from workflows.signals import messages as msg
from workflows.signals.exporters import ExporterPages
from workflows.signals.findings import Thresholds, signal_findings
from workflows.signals.health import RATED, SERIES, GpuRates, Rate, gpu_key, node_health, unreadable_because
from workflows.signals.reading import Reading

__all__ = ["Reading", "SignalsService", "rates_query", "series_query"]

# The window of Prometheus's increase(): the rate is per hour, over the last hour.
RATE_WINDOW = dt.timedelta(hours=1)
# The label the rate query puts on each answer, naming the counter it is the increase of
# (increase() drops the series name).
COUNTER_LABEL = "gpuops_counter"


def _label_value(text: str) -> str:
    """`text` as a PromQL string literal's inside."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _matchers(node_label: str, node: str | None, matchers: Mapping[str, str]) -> list[str]:
    """The label matchers of every query: `matchers` (one cluster's series where a
    Prometheus holds several), then the node's."""
    found = [f'{label}="{_label_value(value)}"' for label, value in sorted(matchers.items())]
    if node is not None:
        found.append(f'{node_label}="{_label_value(node)}"')
    return found


def series_query(*, node_label: str, node: str | None = None, matchers: Mapping[str, str] | None = None) -> str:
    """One instant query for every health series (of one node, if given)."""
    return "{" + ", ".join(['__name__=~"' + "|".join(SERIES) + '"', *_matchers(node_label, node, matchers or {})]) + "}"


def rates_query(*, node_label: str, node: str | None = None, matchers: Mapping[str, str] | None = None) -> str:
    """One instant query for the last hour's increase of each rated counter, each answer
    labelled with its counter's name."""
    found = _matchers(node_label, node, matchers or {})
    selector = "{" + ", ".join(found) + "}" if found else ""
    return " or ".join(
        f'label_replace(increase({name}{selector}[1h]), "{COUNTER_LABEL}", "{name}", "", "")' for name in RATED)


def rates_from(samples: Iterable[Sample], *, node_label: str) -> dict[NodeName, GpuRates]:
    """The rates query's answers, per node and (GPU, counter)."""
    found: dict[NodeName, dict[tuple[str, str], Rate]] = {}
    for sample in samples:
        node, counter = sample.labels.get(node_label), sample.labels.get(COUNTER_LABEL)
        if node and counter in RATED and unreadable_because(sample) is None and sample.value >= 0:
            found.setdefault(NodeName(node), {})[(gpu_key(sample.labels), counter)] = Rate(
                per_hour=sample.value * (dt.timedelta(hours=1) / RATE_WINDOW), over=RATE_WINDOW)
    return dict(found)


class PrometheusSeries:
    """The reader of `SignalsService` when `signals.prometheus` is configured."""

    def __init__(self, *, endpoint: Endpoint, node_label: str, matchers: Mapping[str, str] | None = None) -> None:
        self.endpoint = endpoint
        self.node_label = node_label
        self.matchers = dict(matchers or {})

    @property
    def source(self) -> str:
        return f"Prometheus at {self.endpoint.shown_url}"

    def read(self, node: str | None = None) -> Reading:
        # One deadline for the whole reading: the rates query has what the first left.
        deadline = Deadline.within(self.endpoint.timeout_seconds)
        try:
            samples = instant_query(self.endpoint, series_query(node_label=self.node_label, node=node,
                                                                matchers=self.matchers), deadline=deadline)
        except PrometheusUnavailable as err:
            return Reading(source=self.source, unavailable=err.reason)
        try:
            rates = rates_from(instant_query(self.endpoint, rates_query(node_label=self.node_label, node=node,
                                                                        matchers=self.matchers), deadline=deadline),
                               node_label=self.node_label)
        except PrometheusUnavailable:
            rates = {}  # the totals were read: their rates are not known, the rest stands
        return Reading(source=self.source, nodes=node_health(samples, node_label=self.node_label, rates=rates))


class SignalsService:
    """DCGM health for the views: `endpoint` reads through Prometheus, `exporters` (an
    `ExporterPages`) straight from the exporter pods; exactly one of them."""

    def __init__(self, *, thresholds: Thresholds, endpoint: Endpoint | None = None,
                 exporters: ExporterPages | None = None, node_label: str = "Hostname",
                 matchers: Mapping[str, str] | None = None) -> None:
        self.reader: PrometheusSeries | ExporterPages
        if endpoint is not None and exporters is None:
            self.reader = PrometheusSeries(endpoint=endpoint, node_label=node_label, matchers=matchers)
        elif exporters is not None and endpoint is None:
            self.reader = exporters
        else:
            raise ValueError("SignalsService reads through Prometheus or from the exporters: give one")
        self.thresholds = thresholds
        self.node_label = node_label

    @property
    def source(self) -> str:
        return self.reader.source

    def read(self, node: str | None = None) -> Reading:
        """The health of `node`'s GPUs (every node's without one), or why it is unknown."""
        return self.reader.read(node)

    def findings(self, reading: Reading, *, pools: Mapping[str, str | None]) -> tuple[Finding, ...]:
        """The findings of every node in `reading` that `pools` names (node -> pool):
        series of nodes gpuops does not list as GPU nodes are left out. A node whose
        health could not be read while others' could is a finding of its own: a warning
        where its exporter did not answer, a note where it has none; and so, a warning, is
        a node that sent series gpuops cannot read."""
        found: list[Finding] = []
        for name, health in reading.nodes.items():
            if name in pools:
                found.extend(signal_findings(health, pool=pools[name], thresholds=self.thresholds))
                if health.unreadable:
                    found.append(Finding(severity="warning", code="gpu-health-unknown", subject=name, pool=pools[name],
                                         message=msg.health_partly_unknown_finding(name, reading.source,
                                                                                   health.unreadable),
                                         command=node_command(name)))
        for name, reason in reading.unknown.items():
            if name in pools:
                found.append(Finding(severity="warning" if name in reading.failed else "info",
                                     code="gpu-health-unknown", subject=name, pool=pools[name],
                                     message=msg.health_unknown_finding(name, reading.source, reason),
                                     command=node_command(name)))
        return tuple(found)
