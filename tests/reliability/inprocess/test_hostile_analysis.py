"""The service-health reader between waves against a hostile Prometheus: one that stays
silent, trickles its answer a byte at a time, streams without end, answers more than the
size cap, or answers garbage or a vector of an odd shape. Each reading comes back within
its one deadline (and a grace), `unread` with the reason, never a number and never a
pass; and the stand-in's connection is closed by gpuops (nothing left reading)."""

from __future__ import annotations

import time

import pytest

from testenv.install import wait_until
from tests.hostile_sources import StandIn, answer, endless, raw, silent, trickle, vector
from workflows.prometheus.client import Endpoint
from workflows.signals.analysis import PrometheusHealth

TIMEOUT = 0.5
GRACE = 2.0
QUERY = 'sum(rate(http_requests_total{code=~"5.."}[1m])) / sum(rate(http_requests_total[1m]))'
ONE = vector([{"metric": {}, "value": [1.7e9, "0.01"]}])


@pytest.mark.parametrize(("behaviour", "reason"), [
    (silent(), "did not answer within 0.5 s"),
    (trickle(ONE, every=0.2), "did not answer within 0.5 s"),
    (endless(b'{"metric": {}, "value": [1, "0"]}, ', start=b'{"status": "success", "data": {"result": ['),
     "answered more than"),
    (answer(b"x" * 20_000), "answered more than"),
    (raw(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!"), "something other than JSON"),
    (answer(vector([{"metric": {}, "value": [1, "NaN"]}])), "answered NaN"),
    (answer(vector([{"metric": {"a": 1}, "value": [1, "0.2"]}])), "cannot be read"),
    (answer(vector([])), "answered no series"),
    (answer(vector([{"metric": {"svc": "a"}, "value": [1, "0"]}, {"metric": {"svc": "b"}, "value": [1, "0"]}])),
     "answered 2 series"),
    (answer(b'{"status": "error", "error": "parse error at char 4"}', status=400), "HTTP 400"),
])
def test_a_hostile_prometheus_makes_a_query_unread_within_its_deadline_never_a_pass(behaviour, reason):
    with StandIn(["127.0.0.1"], behaviour) as served:
        reader = PrometheusHealth(endpoint=Endpoint(url=f"http://127.0.0.1:{served.port}", timeout_seconds=TIMEOUT,
                                                    max_answer_bytes=10_000))
        started = time.monotonic()
        reading = reader.read(QUERY)
        took = time.monotonic() - started
        wait_until(lambda: all(c.ended is not None for c in served.connections), timeout=GRACE,
                   what="gpuops to stop reading")

    assert reading.value is None and reason in (reading.unread or ""), reading
    assert took < TIMEOUT + GRACE


def test_a_well_formed_answer_is_its_one_number():
    with StandIn(["127.0.0.1"], answer(ONE)) as served:
        reader = PrometheusHealth(endpoint=Endpoint(url=f"http://127.0.0.1:{served.port}", timeout_seconds=TIMEOUT))
        assert reader.read(QUERY).value == 0.01
