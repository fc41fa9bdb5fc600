"""Service health between a run's waves: one PromQL query read now, as one number or as
why it cannot be (`QueryReading`), and whether a number passes its bound (`breaches`).

A query must answer exactly one number. No series (the service stopped reporting), several
(a query that forgot its `sum`), a series of an odd shape, NaN (a ratio of nothing to
nothing) or no answer from Prometheus are all a reading that is `unread`, with the reason:
the gate before the next wave takes that as a failure, never as a pass. Reads only through
`workflows.prometheus` (its one deadline and size cap)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from workflows.prometheus.client import Endpoint, PrometheusUnavailable, instant_query
from workflows.prometheus.samples import Sample
from workflows.signals import messages as say


@dataclass(frozen=True, slots=True)
class QueryReading:
    """One query's number now, or (`unread`) why there is none."""

    value: float | None = None
    unread: str | None = None


class HealthQueries(Protocol):
    """What the engine reads a pool's analysis queries through."""

    def read(self, query: str) -> QueryReading: ...


@dataclass(frozen=True, slots=True)
class PrometheusHealth:
    """The analysis queries read from `signals.prometheus` (its timeout is the deadline of
    each answer, `signals.max_answer_mb` its size cap)."""

    endpoint: Endpoint

    def read(self, query: str) -> QueryReading:
        try:
            samples = instant_query(self.endpoint, query)
        except PrometheusUnavailable as err:
            return QueryReading(unread=say.analysis_prometheus_failed(err.url, err.reason))
        return reading_of(samples)


def reading_of(samples: tuple[Sample, ...]) -> QueryReading:
    """The one number an answer holds, or why it holds none."""
    if not samples:
        return QueryReading(unread=say.analysis_no_series())
    if len(samples) > 1:
        return QueryReading(unread=say.analysis_several_series(len(samples)))
    (sample,) = samples
    if sample.problem:
        return QueryReading(unread=say.analysis_odd_series(sample.problem))
    value = sample.value
    if math.isnan(value):
        return QueryReading(unread=say.analysis_not_a_number())
    return QueryReading(value=value)


def breaches(value: float, *, max_value: float | None, min_value: float | None) -> bool:
    """Whether `value` is past its bound (above `max_value`, below `min_value`)."""
    if max_value is not None and value > max_value:
        return True
    return min_value is not None and value < min_value
