"""A series' value at one moment, from either source: a Prometheus instant query's
vector or an exporter's text page (Prometheus's exposition format)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def from_exposition(text: str, *, names: Iterable[str] | None = None) -> tuple[Sample, ...]:
    """The samples of an exporter's `/metrics` page (only the series in `names`, if given).
    Raises ValueError on a page that is not in the text format."""
    wanted = frozenset(names) if names is not None else None
    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            # NB: the parser names a counter's samples `<name>_total` even where the page
            # wrote `<name>` (as dcgm-exporter does: DCGM_FI_DEV_PCIE_REPLAY_COUNTER);
            # Prometheus keeps the name as written, and so does gpuops.
            if family.type == "counter" and name == family.name + "_total" and name not in text:
                name = family.name
            if wanted is None or name in wanted:
                found.append(Sample(name=name, labels=dict(sample.labels), value=float(sample.value)))
    return tuple(found)


def from_vector(result: Iterable[Mapping[str, Any]]) -> tuple[Sample, ...]:
    """The samples of an instant query's `data.result` (resultType "vector"):
    `{"metric": {"__name__": ..., labels}, "value": [time, "value"]}`."""
    found = []
    for item in result:
        labels = dict(item.get("metric") or {})
        name = labels.pop("__name__", "")
        found.append(Sample(name=name, labels=labels, value=float(item["value"][1])))
    return tuple(found)
