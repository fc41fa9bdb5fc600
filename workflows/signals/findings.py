"""The findings one node's DCGM health raises against the configured thresholds: one
finding per problem and node, naming every GPU it concerns with the reading that fired.
A signal that is not reported raises nothing here (the node view says it is missing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workflows.fleet.findings import Finding, FindingCode, Severity, node_command, sort_findings
from workflows.signals import messages as msg
from workflows.signals.health import GpuHealth, NodeHealth, ThrottleReason
from workflows.signals.xids import xid


# The finding codes DCGM readings raise: a handover carries them forward, rather than
# calling them resolved, while the readings cannot be had.
SIGNAL_CODES: frozenset[FindingCode] = frozenset({
    "gpu-xid", "gpu-ecc-uncorrectable", "gpu-ecc-correctable", "gpu-row-remap-failed", "gpu-hot",
    "gpu-memory-hot", "gpu-throttled", "gpu-pcie-replays",
})


@dataclass(frozen=True, slots=True, kw_only=True)
class Thresholds:
    """When a reading becomes a finding (`signals.thresholds` in the configuration)."""

    gpu_temp_warning_c: float = 85.0
    gpu_temp_critical_c: float = 92.0
    memory_temp_warning_c: float = 95.0
    memory_temp_critical_c: float = 105.0
    # A count since the driver last loaded (one double-bit error is one too many).
    ecc_dbe_critical: int = 1
    # Per hour: how fast the counters grow, not their totals (a GPU up for months gathers
    # a few now and then); no finding while the rate is not known yet.
    ecc_sbe_warning: int = 100
    pcie_replays_warning: int = 100
    # Clock-throttle reasons worth a look (power capping under load is normal and not listed).
    throttle_reasons: tuple[ThrottleReason, ...] = ("thermal (SW)", "thermal (HW)", "HW slowdown",
                                                    "power brake (HW)")


def signal_findings(health: NodeHealth, *, pool: str | None, thresholds: Thresholds) -> tuple[Finding, ...]:
    found: list[Finding] = []

    def add(severity: Severity, code: FindingCode, message: str) -> None:
        found.append(Finding(severity=severity, code=code, subject=health.node, pool=pool, message=message,
                             command=node_command(health.node)))

    gpus = health.gpus
    by_xid: dict[int, list[GpuHealth]] = {}
    for gpu in gpus:
        if gpu.last_xid:
            by_xid.setdefault(gpu.last_xid, []).append(gpu)
    for code, with_xid in sorted(by_xid.items()):
        entry = xid(code)
        add(entry.severity, "gpu-xid", msg.xid_finding(health.node, entry, with_xid))

    dbe = [g for g in gpus if g.ecc_dbe is not None and g.ecc_dbe >= thresholds.ecc_dbe_critical]
    if dbe:
        add("critical", "gpu-ecc-uncorrectable", msg.ecc_dbe_finding(health.node, dbe))
    sbe = [g for g in gpus if g.ecc_sbe_rate is not None and g.ecc_sbe_rate.per_hour >= thresholds.ecc_sbe_warning]
    if sbe:
        add("warning", "gpu-ecc-correctable", msg.ecc_sbe_finding(health.node, sbe, thresholds.ecc_sbe_warning))
    remap = [g for g in gpus if g.row_remap_failed]
    if remap:
        add("critical", "gpu-row-remap-failed", msg.row_remap_failed_finding(health.node, remap))

    _temperature(add, health, "gpu-hot", lambda g: g.gpu_temp_c, thresholds.gpu_temp_warning_c,
                 thresholds.gpu_temp_critical_c, "GPU")
    _temperature(add, health, "gpu-memory-hot", lambda g: g.memory_temp_c, thresholds.memory_temp_warning_c,
                 thresholds.memory_temp_critical_c, "Memory")

    wanted = set(thresholds.throttle_reasons)
    throttled = [(g, tuple(r for r in g.throttle if r in wanted)) for g in gpus if g.throttle]
    throttled = [(g, reasons) for g, reasons in throttled if reasons]
    if throttled:
        add("warning", "gpu-throttled", msg.throttled_finding(health.node, throttled))
    replays = [g for g in gpus
               if g.pcie_replays_rate is not None and g.pcie_replays_rate.per_hour >= thresholds.pcie_replays_warning]
    if replays:
        add("warning", "gpu-pcie-replays",
            msg.pcie_replays_finding(health.node, replays, thresholds.pcie_replays_warning))
    return sort_findings(found)


def _temperature(add: Callable[[Severity, FindingCode, str], None], health: NodeHealth, code: FindingCode,
                 read: Callable[[GpuHealth], float | None], warning: float, critical: float, what: str) -> None:
    hot = [(g, t) for g in health.gpus if (t := read(g)) is not None and t >= warning]
    if not hot:
        return
    severity: Severity = "critical" if any(t >= critical for _, t in hot) else "warning"
    add(severity, code, msg.hot_finding(health.node, hot, what=what, limit=critical if severity == "critical"
                                        else warning, severity=severity))
