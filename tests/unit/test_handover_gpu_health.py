"""The handover's "since the last handover" with GPU health from DCGM: a new XID or
double-bit error shows as new, a reading that came back clean as resolved, and a reading
that could not be had (Prometheus down, a node's exporter gone) neither: the earlier
findings stay open as unknown, and the checklist says why. Readings come from the real
Tesla T4 capture in ../shared/reference/dcgm-exporter, changed where a test says so."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from storage.database import open_database
from workflows.config import GpuopsConfig
from workflows.fleet.findings import sort_findings
from workflows.handover.building import build_checklist
from workflows.handover.checklist import checklist_to_json
from workflows.handover.rotations import RotationConfig
from workflows.handover.service import HandoverService
from workflows.prometheus.client import Endpoint
from workflows.prometheus.samples import from_exposition
from workflows.signals.findings import Thresholds
from workflows.signals.health import node_health
from workflows.signals.service import Reading, SignalsService

CAPTURE = (Path(__file__).resolve().parents[3] / "shared" / "reference" / "dcgm-exporter"
           / "real-sample-tesla-t4-datadog-fixture.prom").read_text()
SOURCE = "Prometheus at http://prometheus:9090"
HOUR = dt.timedelta(hours=1)
ROTATION_FILE = {
    "name": "gpu-oncall", "team": "GPU platform", "channel": "C0GPU", "timezone": "Europe/Berlin",
    "shifts": [{"name": "day", "starts": "0 8 * * *", "members": ["U0ALICE"]},
               {"name": "night", "starts": "0 20 * * *", "members": ["U0BOB"]}],
}
ROTATION = RotationConfig.model_validate(ROTATION_FILE)


def page(node: str, *, xid: int = 0) -> str:
    text = CAPTURE.replace('Hostname="424773df46e0"', f'Hostname="{node}"')
    return text.replace('dcgm-exporter"} 0\n# HELP DCGM_FI_DEV_FB_FREE', f'dcgm-exporter"}} {xid}\n# HELP '
                        'DCGM_FI_DEV_FB_FREE')


def reading(*pages: str, unavailable: str | None = None) -> Reading:
    samples = [s for text in pages for s in from_exposition(text)]
    return Reading(source=SOURCE, nodes={} if unavailable else node_health(samples), unavailable=unavailable)


class Canned(SignalsService):
    """The real service, answering with a reading made from captures instead of asking."""

    def __init__(self, answer: Reading) -> None:
        super().__init__(endpoint=Endpoint(url="http://prometheus.invalid"), thresholds=Thresholds())
        self.answer = answer

    def read(self, node: str | None = None) -> Reading:
        return self.answer


def fleet(make):
    nodes = [make.node("gpu-a-01"), make.node("gpu-a-02")]
    return make.fleet(nodes, make.operands("gpu-a-01") + make.operands("gpu-a-02"))


def checklist(make, signals: Reading, *, previous=None, now=None):
    """What the handover service builds: the fleet's findings with the reading's added."""
    now = now or make.now
    service = Canned(signals)
    base = fleet(make)
    found = service.findings(signals, pools={n: node.pool for n, node in base.nodes.items()})
    with_signals = dataclasses.replace(base, findings=sort_findings((*base.findings, *found)))
    return build_checklist(fleet=with_signals, requests=[], runs_in_flight=[], previous=previous, rotation=ROTATION,
                           shift=ROTATION.current_shift(now), now=now, signals=signals)


class Before:
    def __init__(self, checklist) -> None:
        self.shift_start = checklist.shift_start
        self.content = checklist_to_json(checklist)


def earlier(make, signals: Reading):
    return Before(checklist(make, signals, now=make.now - 12 * HOUR))


def test_an_xid_that_appeared_during_the_last_shift_is_new_and_needs_action(make):
    before = earlier(make, reading(page("gpu-a-01"), page("gpu-a-02")))
    now = checklist(make, reading(page("gpu-a-01", xid=79), page("gpu-a-02")), previous=before)

    assert now.changes is not None
    (new,) = now.changes.new
    assert (new.code, new.subject, new.severity) == ("gpu-xid", "gpu-a-01", "critical")
    assert new.text.startswith("XID 79 on gpu-a-01")
    assert [i.subject for i in now.needs_action] == ["gpu-a-01"]


def test_a_gpu_read_clean_again_is_resolved(make):
    before = earlier(make, reading(page("gpu-a-01", xid=48), page("gpu-a-02")))
    now = checklist(make, reading(page("gpu-a-01"), page("gpu-a-02")), previous=before)

    assert now.changes is not None and now.changes.new == ()
    assert [i.text for i in now.changes.resolved] == ["gpu-xid on gpu-a-01 is resolved"]


def test_with_prometheus_down_the_last_shifts_findings_stay_open_and_the_checklist_says_why(make):
    before = earlier(make, reading(page("gpu-a-01", xid=79), page("gpu-a-02")))
    now = checklist(make, reading(unavailable="cannot be reached (Connection refused)"), previous=before)

    assert now.changes is not None and now.changes.resolved == ()
    texts = [i.text for i in now.needs_action]
    assert ("GPU health from DCGM is unknown for this handover: Prometheus at http://prometheus:9090 cannot be "
            "reached (Connection refused)") in texts
    assert ("gpu-a-01 had gpu-xid at the last handover and its GPU health could not be read now: still open until "
            "a reading says otherwise") in texts
    # ... and the handover after this one still knows about it.
    assert ("gpu-xid", "gpu-a-01") in {(k["code"], k["subject"]) for k in checklist_to_json(now)["finding_keys"]}


def test_a_node_whose_series_are_gone_keeps_its_findings_open(make):
    before = earlier(make, reading(page("gpu-a-01"), page("gpu-a-02", xid=95)))
    now = checklist(make, reading(page("gpu-a-01")), previous=before)

    assert now.changes is not None and now.changes.resolved == ()
    assert [(i.subject, i.severity) for i in now.needs_action] == [("gpu-a-02", "warning")]


def test_the_handover_service_adds_dcgm_findings_to_the_checklist(make, tmp_path):
    config = GpuopsConfig.model_validate({"rotations": [ROTATION_FILE]})
    db = open_database(tmp_path / "gpuops.db")
    try:
        service = HandoverService(db, config, signals=Canned(reading(page("gpu-a-01", xid=79), page("gpu-a-02"))))
        built = service.checklist(ROTATION, ROTATION.current_shift(make.now), fleet=fleet(make), now=make.now)
    finally:
        db.close()
    assert [(i.code, i.subject) for i in built.needs_action] == [("gpu-xid", "gpu-a-01")]
    other = open_database(tmp_path / "other.db")
    try:
        without = HandoverService(other, config).checklist(ROTATION, ROTATION.current_shift(make.now),
                                                           fleet=fleet(make), now=make.now)
    finally:
        other.close()
    assert without.needs_action == ()
