"""GPU health from DCGM over the real dcgm-exporter captures in
../shared/reference/dcgm-exporter (a Tesla T4 behind an older exporter, a vGPU A100 behind
the GPU Operator's) and modified copies of them: what each GPU reports, what it does not
(never taken as healthy), what the XIDs mean, and which readings become findings at the
configured thresholds (and which near misses do not)."""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import json
import re
import socket
import threading
from pathlib import Path

import pytest

from commands.catalog import dispatch
from commands.services import Services
from storage.database import open_database
from fleet_builder import NOW
from workflows.config import ConfigError, GpuopsConfig, load_config
from workflows.prometheus.client import BasicAuth, Endpoint, PrometheusRefused, instant_query
from workflows.prometheus.samples import from_exposition
from workflows.signals.findings import Thresholds, signal_findings
from workflows.kube.objects import NodeName
from workflows.signals import messages as health_msg
from workflows.signals.health import SERIES, Rate, node_health, throttle_reasons
from workflows.signals.service import SignalsService, series_query
from workflows.signals.xids import XIDS, xid

CAPTURES = Path(__file__).resolve().parents[3] / "shared" / "reference" / "dcgm-exporter"
T4 = CAPTURES / "real-sample-tesla-t4-datadog-fixture.prom"
VGPU = CAPTURES / "real-sample-gpu-operator-vgpu-a100-vks.prom"
T4_HOST = "424773df46e0"
VGPU_HOST = "vks-cluster-0-0-np1-worker-xtxww-xw4wp-wn7j2"
T4_LABELS = ('gpu="0",UUID="GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e",device="nvidia0",modelName="Tesla T4",'
             f'Hostname="{T4_HOST}",DCGM_FI_DRIVER_VERSION="460.106.00",'
             'DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"')


def t4(*extra: str, replace: dict[str, str] | None = None) -> str:
    """The T4 capture, with series values replaced (name -> value) and series added."""
    text = T4.read_text()
    for name, value in (replace or {}).items():
        text, count = re.subn(rf"^({name}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", text, flags=re.M)
        assert count == 1, name
    return text + "".join(f"# TYPE {line.split(' ')[0]} gauge\n{line.split(' ')[0]}{{{T4_LABELS}}} "
                          f"{line.split(' ')[1]}\n" for line in extra)


T4_UUID = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"


def gpu_of(text: str, host: str = T4_HOST, *, rates: dict[str, float] | None = None):
    """The one GPU of `host`, with the rates per hour (counter -> increase in the last hour) given."""
    per_gpu = {(T4_UUID, name): Rate(per_hour=value, over=dt.timedelta(hours=1)) for name, value in (rates or {}).items()}
    health = node_health(from_exposition(text), rates={NodeName(host): per_gpu})[host]
    (gpu,) = health.gpus
    return health, gpu


def findings_of(text: str, thresholds: Thresholds = Thresholds(), *, rates: dict[str, float] | None = None):
    health, _ = gpu_of(text, rates=rates)
    return signal_findings(health, pool="train-a", thresholds=thresholds)


def test_the_t4_capture_reads_as_what_it_reports_and_not_reported_for_the_rest():
    _, gpu = gpu_of(T4.read_text())
    assert (gpu.gpu, gpu.uuid, gpu.model) == ("0", "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "Tesla T4")
    assert gpu.last_xid == 0 and gpu.gpu_temp_c == 25 and gpu.pcie_replays == 0
    # Absent from the capture (the default counters leave ECC and throttle reasons out;
    # this older exporter predates row remapping): unknown, not healthy.
    assert gpu.memory_temp_c is None and gpu.throttle is None
    assert gpu.ecc_dbe is None and gpu.ecc_sbe is None
    assert gpu.row_remap_failed is None and gpu.uncorrectable_remapped_rows is None
    assert findings_of(T4.read_text()) == ()


def test_the_vgpu_capture_names_its_node_by_hostname_and_its_zero_memory_temperature_is_no_reading():
    health, gpu = gpu_of(VGPU.read_text(), host=VGPU_HOST)
    assert health.node == VGPU_HOST
    assert gpu.last_xid == 0 and gpu.xid_message == "No Error"
    assert gpu.memory_temp_c is None and gpu.gpu_temp_c is None  # a vGPU guest reports 0 and no GPU_TEMP
    assert signal_findings(health, pool=None, thresholds=Thresholds()) == ()


def test_dcgm_blank_values_are_not_reported():
    # The exporter's README shows 9223372036854775794 (DCGM's "not supported") as a memory temperature.
    _, gpu = gpu_of(t4("DCGM_FI_DEV_MEMORY_TEMP 9223372036854775794", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL "
                       "9223372036854775794", replace={"DCGM_FI_DEV_GPU_TEMP": "2147483632"}))
    assert gpu.memory_temp_c is None and gpu.gpu_temp_c is None and gpu.ecc_dbe is None


def test_series_without_the_node_label_belong_to_no_node():
    text = T4.read_text().replace(f',Hostname="{T4_HOST}"', "")
    assert node_health(from_exposition(text)) == {}
    assert list(node_health(from_exposition(T4.read_text()), node_label="device")) == ["nvidia0"]


def test_an_xid_79_is_critical_with_its_meaning_the_drivers_words_and_what_to_do():
    text = T4.read_text().replace('DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter"} 0\n# HELP DCGM_FI_DEV_FB_FREE',
                                  'DCGM_FI_PROCESS_NAME="/usr/bin/dcgm-exporter",err_code="79",'
                                  'err_msg="GPU has fallen off the bus"} 79\n# HELP DCGM_FI_DEV_FB_FREE')
    (finding,) = findings_of(text)
    assert (finding.severity, finding.code, finding.subject, finding.pool) == ("critical", "gpu-xid", T4_HOST,
                                                                              "train-a")
    assert finding.message.startswith(f"XID 79 on {T4_HOST}, GPU 0 (GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e): "
                                      "GPU has fallen off the bus (PCIe)")
    assert 'the driver\'s words: "GPU has fallen off the bus"' in finding.message
    assert "drain the node and reboot it" in finding.message
    assert finding.command == f"/gpu node {T4_HOST}"


@pytest.mark.parametrize(("code", "severity", "words"), [
    (13, "info", "graphics engine exception"), (31, "info", "page fault"), (43, "info", "stopped processing"),
    (45, "info", "preemptive cleanup"), (48, "critical", "double-bit"), (61, "warning", "micro-controller"),
    (62, "critical", "halt"), (63, "warning", "reset is pending"), (64, "critical", "failed"),
    (74, "critical", "NVLink"), (79, "critical", "fallen off the bus"), (92, "warning", "single-bit"),
    (94, "warning", "contained"), (95, "critical", "uncontained"), (119, "critical", "GSP"),
    (120, "critical", "GSP"),
])
def test_every_common_xid_has_a_meaning_and_a_severity(code, severity, words):
    findings = findings_of(t4(replace={"DCGM_FI_DEV_XID_ERRORS": str(code)}))
    (finding,) = findings
    assert finding.severity == severity and words in finding.message and f"XID {code} " in finding.message


def test_an_xid_gpuops_does_not_know_points_at_nvidias_catalog():
    (finding,) = findings_of(t4(replace={"DCGM_FI_DEV_XID_ERRORS": "154"}))
    assert finding.severity == "warning" and "docs.nvidia.com/deploy/xid-errors" in finding.message
    assert set(XIDS) == {13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120}
    assert xid(79).severity == "critical"


@pytest.mark.parametrize(("extra", "replace", "code", "severity", "words"), [
    (("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 1",), {}, "gpu-ecc-uncorrectable", "critical", "GPU 0 (GPU-20c56d28"),
    (("DCGM_FI_DEV_ROW_REMAP_FAILURE 1",), {}, "gpu-row-remap-failed", "critical", "RMA the GPU"),
    ((), {"DCGM_FI_DEV_GPU_TEMP": "85"}, "gpu-hot", "warning", "GPU temperature on 424773df46e0 at or over 85 °C"),
    ((), {"DCGM_FI_DEV_GPU_TEMP": "92"}, "gpu-hot", "critical", "at or over 92 °C (GPU 0"),
    (("DCGM_FI_DEV_MEMORY_TEMP 95",), {}, "gpu-memory-hot", "warning", "Memory temperature"),
    (("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS 68",), {}, "gpu-throttled", "warning", "thermal (HW)"),
    (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS 8",), {}, "gpu-throttled", "warning", "HW slowdown"),
])
def test_a_reading_at_its_threshold_is_a_finding(extra, replace, code, severity, words):
    (finding,) = findings_of(t4(*extra, replace=replace))
    assert (finding.code, finding.severity) == (code, severity)
    assert words in finding.message


@pytest.mark.parametrize(("extra", "replace"), [
    (("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 0",), {}),
    (("DCGM_FI_DEV_ROW_REMAP_FAILURE 0", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS 3"), {}),
    ((), {"DCGM_FI_DEV_GPU_TEMP": "84"}),
    (("DCGM_FI_DEV_MEMORY_TEMP 94",), {}),
    (("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS 5",), {}),  # idle and power capping: normal
])
def test_a_near_miss_is_no_finding(extra, replace):
    assert findings_of(t4(*extra, replace=replace)) == ()


def test_thresholds_come_from_the_configuration():
    config = GpuopsConfig.model_validate({"signals": {"prometheus": {"url": "http://prometheus:9090"},
                                                      "thresholds": {"gpu_temp_warning_c": 80,
                                                                     "pcie_replays_warning": 10}}})
    assert config.signals is not None
    thresholds = config.signals.thresholds.thresholds()
    assert [f.code for f in findings_of(t4(replace={"DCGM_FI_DEV_GPU_TEMP": "80"}), thresholds,
                                        rates={PCIE: 10})] == ["gpu-hot", "gpu-pcie-replays"]


SBE, PCIE = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"


@pytest.mark.parametrize(("extra", "replace", "rates", "code", "words"), [
    ((f"{SBE} 5000",), {}, {SBE: 100}, "gpu-ecc-correctable",
     f"at or over 100 an hour (GPU 0 ({T4_UUID}): 100/h over 1h, 5000 since the driver loaded)"),
    ((), {PCIE: "7"}, {PCIE: 250.5}, "gpu-pcie-replays",
     f"at or over 100 an hour (GPU 0 ({T4_UUID}): 250/h over 1h, 7 since the driver loaded)"),
])
def test_correctable_ecc_errors_and_pcie_replays_are_findings_at_their_rate_per_hour(extra, replace, rates, code,
                                                                                       words):
    (finding,) = findings_of(t4(*extra, replace=replace), rates=rates)
    assert (finding.code, finding.severity) == (code, "warning")
    assert words in finding.message


@pytest.mark.parametrize(("extra", "replace", "rates"), [
    ((f"{SBE} 5000",), {}, {}),  # a large total whose rate is not known yet
    ((), {PCIE: "100000"}, {}),
    ((f"{SBE} 5000",), {}, {SBE: 99}),
    ((), {PCIE: "100000"}, {PCIE: 99.9}),
])
def test_a_large_total_or_a_rate_under_the_threshold_is_no_finding(extra, replace, rates):
    assert findings_of(t4(*extra, replace=replace), rates=rates) == ()


def test_the_node_view_says_a_rate_is_not_known_yet_rather_than_zero():
    _, gpu = gpu_of(t4(f"{SBE} 3", replace={PCIE: "12"}))
    assert health_msg.count_cell(gpu.pcie_replays, gpu.pcie_replays_rate) == "12 (rate not known yet)"
    assert health_msg.ecc_cell(gpu) == "not reported/3 (SBE rate not known yet)"
    _, gpu = gpu_of(t4(f"{SBE} 3", replace={PCIE: "12"}), rates={PCIE: 0, SBE: 1.5})
    assert health_msg.gpu_row(gpu)[-1] == "12 (0/h over 1h)"
    assert health_msg.ecc_cell(gpu) == "not reported/3 (SBE 1.5/h over 1h)"


def test_a_bad_signals_section_stops_with_the_key_and_the_reason(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("signals:\n  prometheus:\n    url: prometheus:9090\n")
    with pytest.raises(ConfigError, match=r"config.yaml:3:10: signals.prometheus.url: 'prometheus:9090' is not an "
                                          r"http:// or https:// address"):
        load_config(path)
    path.write_text("signals:\n  prometheus:\n    url: http://p:9090\n    bearer_token_file: /t\n"
                    "    basic_auth: {username: u, password_file: /p}\n")
    with pytest.raises(ConfigError, match="give bearer_token_file or basic_auth, not both"):
        load_config(path)
    path.write_text("signals:\n  prometheus: {url: 'http://p:9090'}\n  thresholds: {throttle_reasons: [hot]}\n")
    with pytest.raises(ConfigError, match="signals.thresholds.throttle_reasons.0"):
        load_config(path)


def test_the_throttle_bitmask_decodes_to_nvmls_reasons():
    assert throttle_reasons(0) == ()
    assert throttle_reasons(0x1 | 0x4 | 0x40 | 0x80) == ("idle", "power cap", "thermal (HW)", "power brake (HW)")


def test_one_query_asks_for_every_health_series_of_one_node_with_its_name_quoted():
    query = series_query(node_label="Hostname", node='gpu-"a"-01')
    assert query.startswith('{__name__=~"DCGM_FI_DEV_XID_ERRORS|') and 'Hostname="gpu-\\"a\\"-01"}' in query
    assert all(name in query for name in SERIES)


# --------------------------------------------------------------------------------------
# /gpu node: nothing when not configured, one sentence when Prometheus cannot be reached


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class StaticFleet:
    def __init__(self, fleet) -> None:
        self.value = fleet

    def fleet(self, now):
        return self.value


def _node_reply(make, tmp_path, config: dict, command: str = "node gpu-a-01"):
    config = GpuopsConfig.model_validate({"pools": {"train-a": {"kind": "training", "windows": "always"}},
                                          "access": {"users": {"U0DAVE": ["viewer"]}}, **config})
    nodes = [make.node("gpu-a-01")]
    services = Services.on_database(config=config, fleet=StaticFleet(make.fleet(nodes, make.operands("gpu-a-01"))),
                                    database=open_database(tmp_path / "gpuops.db"))
    try:
        return dispatch(command, actor=config.actor("U0DAVE"), services=services, now=NOW)
    finally:
        services.database.close()  # type: ignore[union-attr]


def _texts(reply) -> str:
    return "\n".join([s.title or "" for s in reply.sections] + [n.text for s in reply.sections for n in s.notices])


def test_without_signals_configured_the_node_view_says_nothing_about_gpu_health(make, tmp_path):
    text = _texts(_node_reply(make, tmp_path, {}))
    assert "DCGM" not in text and "GPU health" not in text


def test_an_unreachable_prometheus_is_said_once_in_the_node_view_and_in_findings(make, tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    config = {"signals": {"prometheus": {"url": url, "timeout": "2s"}}}
    text = _texts(_node_reply(make, tmp_path, config))
    assert text.count(f"GPU health unknown: Prometheus at {url} cannot be reached") == 1, text
    assert text.count("GPU health unknown") == 1
    findings = _texts(_node_reply(make, tmp_path, config, command="findings"))
    assert findings.count(f"GPU health unknown: Prometheus at {url} cannot be reached") == 1, findings


# --------------------------------------------------------------------------------------
# The reader's HTTP: credentials from files, refusals in words, no secret in a message


class _PrometheusLike(http.server.BaseHTTPRequestHandler):
    """Answers /api/v1/query as Prometheus does, for one bearer token or one user's password."""

    seen: list[str | None] = []

    def do_GET(self):  # noqa: N802 - the stdlib's name
        auth = self.headers.get("Authorization")
        type(self).seen.append(auth)
        wanted = {"Bearer s3cret-token", "Basic " + base64.b64encode(b"gpuops:pa55").decode()}
        if auth not in wanted:
            body, status = b'{"status":"error","errorType":"unauthorized","error":"no entry"}', 401
        else:
            body, status = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "Hostname": "gpu-a-01"},
                 "value": [1733300000.0, "91"]}]}}).encode(), 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - the stdlib's name
        pass


@pytest.fixture
def prometheus_like():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PrometheusLike)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _PrometheusLike.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_reader_sends_the_token_from_its_file_as_it_is_now(prometheus_like, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    endpoint = Endpoint(url=prometheus_like, bearer_token_file=token)
    (sample,) = instant_query(endpoint, "up")
    assert (sample.name, sample.labels, sample.value) == ("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "Hostname": "gpu-a-01"},
                                                          91.0)
    token.write_text("rotated")  # read again on every query: a rotated token is used at once
    with pytest.raises(PrometheusRefused, match="answered HTTP 401 Unauthorized: no entry") as refused:
        instant_query(endpoint, "up")
    assert refused.value.status == 401 and "s3cret" not in str(refused.value) and "rotated" not in str(refused.value)
    assert _PrometheusLike.seen == ["Bearer s3cret-token", "Bearer rotated"]


def test_basic_auth_reads_its_password_file_and_a_missing_file_is_said_plainly(prometheus_like, tmp_path):
    password = tmp_path / "password"
    password.write_text("pa55\n")
    service = SignalsService(endpoint=Endpoint(url=prometheus_like, basic_auth=BasicAuth(
        username="gpuops", password_file=password)), thresholds=Thresholds())
    reading = service.read("gpu-a-01")
    assert reading.unavailable is None and reading.node("gpu-a-01").gpus[0].gpu_temp_c == 91  # type: ignore[union-attr]
    (finding,) = service.findings(reading, pools={"gpu-a-01": "train-a"})
    assert (finding.code, finding.severity) == ("gpu-hot", "warning")
    password.unlink()
    assert service.read().unavailable == "cannot read its credentials: No such file or directory"


def test_credentials_in_the_url_never_reach_a_message():
    service = SignalsService(endpoint=Endpoint(url=f"http://gpuops:pa55@127.0.0.1:{_closed_port()}",
                                               timeout_seconds=2), thresholds=Thresholds())
    reading = service.read()
    assert "pa55" not in reading.source and reading.unavailable is not None
    assert reading.unavailable.startswith("cannot be reached")


def test_credentials_in_an_address_with_no_host_name_are_hidden_and_the_reading_says_it_cannot_be_reached():
    # The configuration accepts it (the address has a netloc); the reader must still answer.
    service = SignalsService(endpoint=Endpoint(url=f"http://gpuops:pa55@:{_closed_port()}", timeout_seconds=2),
                             thresholds=Thresholds())
    reading = service.read()
    assert "pa55" not in reading.source and reading.unavailable is not None
    assert reading.unavailable.startswith("cannot be reached")
