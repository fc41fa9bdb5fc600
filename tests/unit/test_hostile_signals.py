"""A Prometheus or a dcgm-exporter that misbehaves never holds a command, the handover or
a thread past the deadline, and never crashes the reading: one that trickles its answer
(headers or body), streams without end, claims a huge length, or sends series of odd
shapes (a non-text label, unicode digits for a GPU index, NaN, two series that disagree).
The node concerned is unknown with the reason; the others are read. The stand-ins are
`tests.hostile_sources` on loopback addresses; the fuller mix is
tests/reliability/inprocess/test_hostile_sources.py."""

from __future__ import annotations

import datetime as dt
import math
import threading
import time

import pytest

from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from testenv.install import wait_until
from tests.dcgm_pages import HEALTHY, REMAP, T4_UUID, pages
from tests.hostile_sources import StandIn, answer, by_query, endless, endless_headers, trickle, vector
from fleet_builder import NOW
from tests.unit.test_dcgm_exporters import Cluster, _pod, _snapshot
from tests.unit.test_handover_gpu_health import ROTATION, ROTATION_FILE, Before, checklist, fleet, page
from workflows.config import ConfigError, GpuopsConfig, load_config
from workflows.handover.service import HandoverService
from workflows.kube.objects import NodeName
from workflows.prometheus.samples import Sample, from_exposition
from workflows.signals.exporters import ExporterPages, ExporterSettings
from workflows.signals.findings import Thresholds
from workflows.signals.health import GPU_TEMP, XID_ERRORS, node_health_of
from workflows.signals.rates import CounterMemory
from workflows.signals.service import Reading, SignalsService

TIMEOUT = 0.5
# How late a command may answer past its deadline (the machine is shared and slow).
GRACE = 1.0

HEALTHY_VECTOR = vector([
    {"metric": {"__name__": XID_ERRORS, "gpu": "0", "UUID": "GPU-a", "Hostname": "gpu-a-01"}, "value": [1, "0"]},
    {"metric": {"__name__": GPU_TEMP, "gpu": "0", "UUID": "GPU-a", "Hostname": "gpu-a-01"}, "value": [1, "41"]},
])


@pytest.fixture
def prometheus():
    with StandIn(["127.0.0.1"], answer(HEALTHY_VECTOR)) as served:
        yield served


def _services(make, tmp_path, signals: dict) -> Services:
    config = GpuopsConfig.model_validate({"pools": {"train-a": {"kind": "training", "windows": "always"}},
                                          "access": {"users": {"U0DAVE": ["viewer"]}}, "signals": signals})
    nodes = [make.node("gpu-a-01"), make.node("gpu-a-02")]
    return Services.on_database(config=config, fleet=_Static(make.fleet(nodes, make.operands("gpu-a-01")
                                                                         + make.operands("gpu-a-02"))),
                                database=open_database(tmp_path / "gpuops.db"))


class _Static:
    def __init__(self, fleet) -> None:
        self.value = fleet

    def fleet(self, now):
        return self.value


def _timed(services: Services, command: str):
    started = time.monotonic()
    try:
        reply = dispatch(command, actor=services.config.actor("U0DAVE"), services=services, now=NOW)
    finally:
        services.database.close()  # type: ignore[union-attr]
    return reply, time.monotonic() - started


def _texts(reply) -> str:
    return "\n".join([reply.summary or ""] + [s.title or "" for s in reply.sections]
                     + [n.text for s in reply.sections for n in s.notices]
                     + [b for s in reply.sections for b in s.bullets]
                     + [" | ".join(row) for s in reply.sections if s.table for row in s.table.rows])


def _prometheus_config(served: StandIn, **more) -> dict:
    return {"prometheus": {"url": f"http://127.0.0.1:{served.port}", "timeout": TIMEOUT}, **more}


def _ended_by_client(served: StandIn, *, within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if served.connections and all(c.ended is not None for c in served.connections):
            return all(c.by_client for c in served.connections)
        time.sleep(0.02)
    return False


# --------------------------------------------------------------------------------------
# Prometheus: one deadline for the whole answer, a size cap


def test_a_prometheus_that_trickles_its_answer_leaves_gpu_health_unknown_at_the_timeout(make, tmp_path, prometheus):
    # 300-odd bytes at one per 50 ms: each read gets a byte well within any socket timeout.
    prometheus.behave["127.0.0.1"] = trickle(HEALTHY_VECTOR)
    reply, took = _timed(_services(make, tmp_path, _prometheus_config(prometheus)), "node gpu-a-01")
    assert took < TIMEOUT + GRACE
    assert (f"GPU health unknown: Prometheus at http://127.0.0.1:{prometheus.port} did not answer within 0.5 s."
            in _texts(reply))
    assert _ended_by_client(prometheus, within=GRACE)


def test_headers_without_end_do_not_hold_or_crash_the_findings(make, tmp_path, prometheus):
    prometheus.behave["127.0.0.1"] = endless_headers(every=0.01)
    reply, took = _timed(_services(make, tmp_path, _prometheus_config(prometheus)), "findings")
    assert took < TIMEOUT + GRACE
    assert "did not answer within 0.5 s" in _texts(reply)
    assert _ended_by_client(prometheus, within=GRACE)


def test_an_answer_without_end_is_refused_at_the_size_cap_and_no_more_is_read(make, tmp_path, prometheus):
    prometheus.behave["127.0.0.1"] = endless(b'{"metric": {}, "value": [1, "1"]},' * 64,
                                             start=b'{"status": "success", "data": {"resultType": "vector", '
                                                   b'"result": [')
    config = _prometheus_config(prometheus, max_answer_mb=1)
    config["prometheus"]["timeout"] = 30  # the cap, not the deadline, must stop it
    reply, took = _timed(_services(make, tmp_path, config), "findings")
    assert took < GRACE * 5
    assert (f"GPU health unknown: Prometheus at http://127.0.0.1:{prometheus.port} answered more than 1 MB, the most "
            "gpuops reads (signals.max_answer_mb)." in _texts(reply))
    assert _ended_by_client(prometheus, within=GRACE)
    # The loopback's buffers hold a few MB; a reader that went on would have had 30 s of it.
    assert prometheus.connections[0].sent < 64_000_000


def test_the_rates_query_has_only_what_the_series_query_left_of_the_timeout(make, tmp_path, prometheus):
    prometheus.behave["127.0.0.1"] = by_query(answer(HEALTHY_VECTOR), trickle(vector([])))
    reply, took = _timed(_services(make, tmp_path, _prometheus_config(prometheus)), "node gpu-a-01")
    assert took < TIMEOUT + GRACE
    assert "41 °C" in _texts(reply) and "rate not known yet" not in _texts(reply)  # the T4 sends no ECC/PCIe here


def test_the_handover_is_built_within_the_timeout_and_says_why_gpu_health_is_unknown(make, tmp_path, prometheus):
    prometheus.behave["127.0.0.1"] = trickle(HEALTHY_VECTOR)
    config = GpuopsConfig.model_validate({"rotations": [ROTATION_FILE], "signals": _prometheus_config(prometheus)})
    db = open_database(tmp_path / "gpuops.db")
    started = time.monotonic()
    try:
        built = HandoverService(db, config, signals=config.signals.service()).checklist(  # type: ignore[union-attr]
            ROTATION, ROTATION.current_shift(make.now), fleet=fleet(make), now=make.now)
    finally:
        db.close()
    assert time.monotonic() - started < TIMEOUT + GRACE
    assert [i.text for i in built.needs_action] == [
        f"GPU health from DCGM is unknown for this handover: Prometheus at http://127.0.0.1:{prometheus.port} did not "
        "answer within 0.5 s"]


def test_the_size_cap_is_configured_once_for_both_readers_and_a_bad_one_is_refused(tmp_path):
    through = GpuopsConfig.model_validate({"signals": {"prometheus": {"url": "http://p:9090"}, "max_answer_mb": 3}})
    assert through.signals.service().reader.endpoint.max_answer_bytes == 3_000_000  # type: ignore[union-attr]
    direct = GpuopsConfig.model_validate({"signals": {"exporters": {}}})
    assert direct.signals.service().reader.settings.max_answer_bytes == 8_000_000  # type: ignore[union-attr]
    path = tmp_path / "config.yaml"
    path.write_text("signals:\n  exporters: {}\n  max_answer_mb: 0\n")
    with pytest.raises(ConfigError, match="signals.max_answer_mb: Input should be greater than or equal to 1"):
        load_config(path)


# --------------------------------------------------------------------------------------
# Exporters: a page still being read at the deadline stops there


def _exporters(served: StandIn, nodes: tuple[str, ...], **settings) -> SignalsService:
    pods = tuple(_pod(node, f"nvidia-dcgm-exporter-{node}", ip=f"127.0.0.{i + 2}") for i, node in enumerate(nodes))
    pages_reader = ExporterPages(settings=ExporterSettings(port=served.port, **settings), memory=CounterMemory(),
                                 cluster=Cluster(_snapshot(*pods, nodes=nodes)))
    return SignalsService(exporters=pages_reader, thresholds=Thresholds())


def test_an_exporter_streaming_without_end_is_cut_at_the_deadline_and_no_reader_goes_on(tmp_path):
    nodes = (HEALTHY, REMAP)
    served_pages = pages()
    addresses = [f"127.0.0.{i + 2}" for i in range(len(nodes))]
    with StandIn(addresses, answer(b"")) as served:
        served.behave[addresses[0]] = answer(served_pages[HEALTHY].encode(), kind="text/plain")
        # A page that never ends, slowly enough that the cap is not what stops it.
        served.behave[addresses[1]] = trickle(served_pages[REMAP].encode() * 100, every=0.001, kind="text/plain")
        service = _exporters(served, nodes, timeout_seconds=1.0, deadline_seconds=1.0)
        started = time.monotonic()
        reading = service.read()
        took = time.monotonic() - started
        assert took < 1.0 + GRACE
        assert list(reading.nodes) == [HEALTHY] and reading.failed == {REMAP}
        assert _ended_by_client(served, within=GRACE)
        # The cut readers end within the grace (on a machine running other tests beside this
        # one, a moment after the answer came back): none goes on reading.
        wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("dcgm-scrape") and t.is_alive()],
                   timeout=GRACE, what="every cut exporter reader to end")


# --------------------------------------------------------------------------------------
# Series of odd shapes: that series unknown with the reason, never the command


def _odd(labels: dict, value: object = "0", name: str = XID_ERRORS) -> dict:
    return {"metric": {"__name__": name, "Hostname": "gpu-a-01", **labels}, "value": [1, value]}


@pytest.mark.parametrize(("item", "reason"), [
    (_odd({"gpu": "²", "UUID": "GPU-b"}), "GPU GPU-b's DCGM_FI_DEV_XID_ERRORS: its gpu label '²' is not a GPU index"),
    (_odd({"gpu": 1, "UUID": "GPU-b"}), "GPU GPU-b's DCGM_FI_DEV_XID_ERRORS: its label gpu is int 1, not text"),
    (_odd({"gpu": ["1"], "UUID": "GPU-b"}),
     "GPU GPU-b's DCGM_FI_DEV_XID_ERRORS: its label gpu is list ['1'], not text"),
    (_odd({"gpu": "1", "UUID": "GPU-b"}, value={"v": 1}),
     "GPU GPU-b's DCGM_FI_DEV_XID_ERRORS: its value is {'v': 1}, not a number"),
    (_odd({"gpu": "1", "UUID": "GPU-b"}, value="NaN"),
     "GPU GPU-b's DCGM_FI_DEV_XID_ERRORS: its value nan is not a reading"),
    (_odd({"gpu": "1", "UUID": "GPU-b"}, value="+Inf"),
     "GPU GPU-b's DCGM_FI_DEV_XID_ERRORS: its value inf is not a reading"),
])
def test_a_series_of_an_odd_shape_is_unknown_with_its_reason_and_the_rest_is_read(make, tmp_path, prometheus, item,
                                                                                  reason):
    good = {"metric": {"__name__": XID_ERRORS, "gpu": "0", "UUID": "GPU-a", "Hostname": "gpu-a-01"},
            "value": [1, "79"]}
    prometheus.behave["127.0.0.1"] = answer(vector([good, item]))
    reply, _ = _timed(_services(make, tmp_path, _prometheus_config(prometheus)), "findings")
    text = _texts(reply)
    assert "XID 79 on gpu-a-01, GPU 0 (GPU-a)" in text
    assert (f"GPU health on gpu-a-01 partly unknown: Prometheus at http://127.0.0.1:{prometheus.port} sent series "
            f"gpuops cannot read ({reason})." in text), text


def test_the_node_view_reads_a_gpu_labelled_with_unicode_digits_as_unknown(make, tmp_path, prometheus):
    odd = _odd({"gpu": "²", "UUID": "GPU-b"}, value="79")
    prometheus.behave["127.0.0.1"] = answer(vector([odd]))
    reply, _ = _timed(_services(make, tmp_path, _prometheus_config(prometheus)), "node gpu-a-01")
    assert "its gpu label '²' is not a GPU index" in _texts(reply)


def test_an_exporter_page_with_a_unicode_digit_gpu_leaves_that_series_unknown_and_the_other_nodes_read():
    odd = pages()[REMAP].replace('gpu="0"', 'gpu="²"')
    assert odd != pages()[REMAP]
    nodes = (HEALTHY, REMAP)
    addresses = [f"127.0.0.{i + 2}" for i in range(len(nodes))]
    with StandIn(addresses, answer(b"")) as served:
        served.behave[addresses[0]] = answer(pages()[HEALTHY].encode(), kind="text/plain")
        served.behave[addresses[1]] = answer(odd.encode(), kind="text/plain")
        reading = _exporters(served, nodes, timeout_seconds=2.0).read()
    assert reading.nodes[NodeName(HEALTHY)].gpus and reading.known(HEALTHY)
    assert not reading.known(REMAP)
    assert reading.failed == {REMAP} and reading.unknown[NodeName(REMAP)] == (
        f"on {REMAP}: gpu-operator/nvidia-dcgm-exporter-{REMAP} at {addresses[1]}:{served.port} sent only DCGM series "
        f"gpuops cannot read (GPU {T4_UUID}'s DCGM_FI_DEV_GPU_TEMP, DCGM_FI_DEV_PCIE_REPLAY_COUNTER, "
        "DCGM_FI_DEV_ROW_REMAP_FAILURE and 2 more: its gpu label '²' is not a GPU index)")


def test_two_series_of_one_gpu_that_disagree_are_unknown_and_two_that_agree_are_one():
    def xid(value: float, pod: str) -> Sample:
        return Sample(XID_ERRORS, {"gpu": "0", "UUID": "GPU-a", "pod": pod}, value)

    agree = node_health_of(NodeName("n"), [xid(79, "old"), xid(79, "new")])
    assert agree.gpus[0].last_xid == 79 and agree.unreadable == ()
    disagree = node_health_of(NodeName("n"), [xid(79, "old"), xid(0, "new")])
    assert disagree.gpus == () and [(u.series, u.reason) for u in disagree.unreadable] == [
        (XID_ERRORS, "two of its series disagree (79 and 0)")]


def test_a_node_with_an_unreadable_series_keeps_its_earlier_dcgm_findings_open_in_the_handover(make):
    samples_before = [s for t in (page("gpu-a-01"), page("gpu-a-02")) for s in from_exposition(t)]
    before_health = {NodeName(n): node_health_of(NodeName(n), [s for s in samples_before if s.labels["Hostname"] == n])
                     for n in ("gpu-a-01", "gpu-a-02")}
    # The last handover saw gpu-a-01 at 95 °C: a finding.
    hot_before = {**before_health, NodeName("gpu-a-01"): node_health_of(NodeName("gpu-a-01"), [
        Sample(s.name, s.labels, 95.0) if s.name == GPU_TEMP else s
        for s in samples_before if s.labels["Hostname"] == "gpu-a-01"])}
    source = "Prometheus at http://prometheus:9090"
    before = Before(checklist(make, Reading(source=source, nodes=hot_before), now=make.now - dt.timedelta(hours=12)))
    # Now its temperature series reads NaN: unknown, so the finding stays open.
    now_health = {**before_health, NodeName("gpu-a-01"): node_health_of(NodeName("gpu-a-01"), [
        Sample(s.name, s.labels, math.nan) if s.name == GPU_TEMP else s
        for s in samples_before if s.labels["Hostname"] == "gpu-a-01"])}
    now = checklist(make, Reading(source=source, nodes=now_health), previous=before)
    texts = [i.text for i in now.needs_action]
    assert any(t.startswith("gpu-a-01 had gpu-hot at the last handover and its GPU health could not be read")
               for t in texts), texts
    assert any("GPU health on gpu-a-01 partly unknown" in t for t in texts), texts
    assert now.changes is not None and not [k for k in now.changes.resolved if k.subject == "gpu-a-01"]


def test_a_finding_raised_again_on_a_node_read_in_part_is_not_also_carried_forward(make):
    source = "Prometheus at http://prometheus:9090"
    samples = [s for t in (page("gpu-a-01", xid=79), page("gpu-a-02")) for s in from_exposition(t)]

    def health(temperature: float) -> dict:
        return {NodeName(n): node_health_of(NodeName(n), [
            Sample(s.name, s.labels, temperature) if s.name == GPU_TEMP and n == "gpu-a-01" else s
            for s in samples if s.labels["Hostname"] == n]) for n in ("gpu-a-01", "gpu-a-02")}

    before = Before(checklist(make, Reading(source=source, nodes=health(40.0)), now=make.now - dt.timedelta(hours=12)))
    now = checklist(make, Reading(source=source, nodes=health(math.nan)), previous=before)
    about = [i.text for i in now.needs_action if i.subject == "gpu-a-01"]
    assert len(about) == 2, about
    assert about[0].startswith("XID 79 on gpu-a-01") and "partly unknown" in about[1]
