"""A series' value at one moment, from either source: a Prometheus instant query's
vector or an exporter's text page (Prometheus's exposition format).

A series of a shape gpuops does not expect (a label value that is not text, a value that
is not a number) is still a `Sample`, with `problem` saying what is wrong in words, its
value NaN and only its text labels kept: the reader of its node says that series is
unknown, and the others are read as usual."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float
    problem: str | None = None  # why the series cannot be read, in words


def _shown(value: object) -> str:
    return repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."


def _written_name(line: str) -> str:
    return line.split("{", 1)[0].split(None, 1)[0] if line.strip() else ""


def _wanted_lines(text: str, wanted: frozenset[str]) -> tuple[str, frozenset[str]]:
    """The page's lines about the series in `wanted` (their samples and `# TYPE`/`# HELP`
    lines), so a page's other series cost no parsing; and the sample names it writes."""
    kept = []
    written = set()
    for line in text.splitlines():
        if line.startswith("#"):
            words = line.split(None, 3)
            if len(words) >= 3 and words[1] in ("TYPE", "HELP") and words[2] in wanted:
                kept.append(line)
            continue
        name = _written_name(line)
        if name in wanted:
            kept.append(line)
            written.add(name)
    return "\n".join(kept) + "\n", frozenset(written)


def from_exposition(text: str, *, names: Iterable[str] | None = None) -> tuple[Sample, ...]:
    """The samples of an exporter's `/metrics` page (only the series in `names`, if given).
    Raises ValueError on a page that is not in the text format."""
    wanted = frozenset(names) if names is not None else None
    if wanted is not None:
        text, written = _wanted_lines(text, wanted)
    else:
        written = frozenset(_written_name(line) for line in text.splitlines() if not line.startswith("#"))
    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            # NB: the parser names a counter's samples `<name>_total` even where the page
            # wrote `<name>` (as dcgm-exporter does: DCGM_FI_DEV_PCIE_REPLAY_COUNTER);
            # Prometheus keeps the name as written, and so does gpuops.
            if family.type == "counter" and name == family.name + "_total" and name not in written:
                name = family.name
            if wanted is None or name in wanted:
                found.append(Sample(name=name, labels=dict(sample.labels), value=float(sample.value)))
    return tuple(found)


def from_vector(result: Iterable[Any]) -> tuple[Sample, ...]:
    """The samples of an instant query's `data.result` (resultType "vector"):
    `{"metric": {"__name__": ..., labels}, "value": [time, "value"]}`; an item of another
    shape is a sample with its problem."""
    return tuple(_vector_item(item) for item in result)


def _vector_item(item: Any) -> Sample:
    if not isinstance(item, dict) or not isinstance(item.get("metric", {}), dict):
        return Sample(name="", labels={}, value=math.nan, problem=f"a series that is not an object ({_shown(item)})")
    metric = item.get("metric") or {}
    labels = {key: value for key, value in metric.items() if isinstance(key, str) and isinstance(value, str)}
    name = labels.pop("__name__", "")
    problem = None
    odd = sorted(((key, value) for key, value in metric.items() if isinstance(key, str) and not isinstance(value, str)),
                 key=lambda pair: pair[0])
    if odd:
        key, value = odd[0]
        problem = f"its label {key[:40]} is {type(value).__name__} {_shown(value)}, not text"
    value = math.nan
    pair = item.get("value")
    if not isinstance(pair, list) or len(pair) != 2:
        problem = problem or f"its value is {_shown(pair)}, not [time, value]"
    elif isinstance(pair[1], bool) or not isinstance(pair[1], (str, int, float)):
        problem = problem or f"its value is {_shown(pair[1])}, not a number"
    else:
        try:
            value = float(pair[1])
        except (ValueError, OverflowError):
            problem = problem or f"its value is {_shown(pair[1])}, not a number"
    return Sample(name=name, labels=labels, value=value, problem=problem)
