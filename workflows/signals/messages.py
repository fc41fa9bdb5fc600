"""Every sentence about DCGM health an on-call engineer reads: findings and the node view."""

from __future__ import annotations

from collections.abc import Sequence

from workflows.signals.health import GpuHealth, ThrottleReason
from workflows.signals.xids import Xid, xid
from workflows.wording import names, plural


def gpu_name(gpu: GpuHealth) -> str:
    return f"GPU {gpu.gpu}" + (f" ({gpu.uuid})" if gpu.uuid else "")


def _gpus(gpus: Sequence[GpuHealth]) -> str:
    return names(gpu_name(g) for g in gpus)


def xid_finding(node: str, entry: Xid, gpus: Sequence[GpuHealth]) -> str:
    said = next((g.xid_message for g in gpus if g.xid_message), None)
    driver = f" (the driver's words: \"{said}\")" if said else ""
    return (f"XID {entry.code} on {node}, {_gpus(gpus)}: {entry.meaning}{driver}. "
            f"What to do: {entry.action}. DCGM shows the last XID until the GPU is reset.")


def ecc_dbe_finding(node: str, gpus: Sequence[GpuHealth]) -> str:
    counts = names(f"{gpu_name(g)}: {g.ecc_dbe}" for g in gpus)
    return (f"Uncorrectable (double-bit) ECC errors on {node} since the driver loaded ({counts}): the memory "
            "returned wrong data. Drain the node, reset the GPU, and RMA it if they come back.")


def ecc_sbe_finding(node: str, gpus: Sequence[GpuHealth], threshold: int) -> str:
    counts = names(f"{gpu_name(g)}: {g.ecc_sbe}" for g in gpus)
    return (f"Correctable (single-bit) ECC errors on {node} at or over {threshold} since the driver loaded "
            f"({counts}). Watch for row-remap failures or double-bit errors; reset the GPU at the next drain.")


def row_remap_failed_finding(node: str, gpus: Sequence[GpuHealth]) -> str:
    return (f"Row remapping failed on {node}, {_gpus(gpus)}: the GPU has no spare memory rows left for "
            "bad ones. Drain the node and RMA the GPU.")


def hot_finding(node: str, hot: Sequence[tuple[GpuHealth, float]], *, what: str, limit: float,
                severity: str) -> str:
    readings = names(f"{gpu_name(g)}: {t:g} °C" for g, t in hot)
    then = ("Check the node's cooling and airflow now; the GPU will slow down or shut off."
            if severity == "critical" else "Check the node's cooling and airflow.")
    return f"{what} temperature on {node} at or over {limit:g} °C ({readings}). {then}"


def throttled_finding(node: str, throttled: Sequence[tuple[GpuHealth, tuple[ThrottleReason, ...]]]) -> str:
    listed = names(f"{gpu_name(g)}: {', '.join(reasons)}" for g, reasons in throttled)
    return (f"Clocks held down on {node} ({listed}). Thermal: check cooling; HW slowdown or power brake: "
            "check the power supply and the board.")


def pcie_replays_finding(node: str, gpus: Sequence[GpuHealth], threshold: int) -> str:
    counts = names(f"{gpu_name(g)}: {g.pcie_replays}" for g in gpus)
    return (f"PCIe replays on {node} at or over {threshold} since the driver loaded ({counts}): the link "
            "to the GPU is retrying. Check the riser, slot and cabling at the next drain.")


# --------------------------------------------------------------------------------------
# The node view

NOT_REPORTED = "not reported"

GPU_COLUMNS = ("GPU", "last XID", "GPU temp", "memory temp", "clocks held by", "ECC DBE/SBE", "row remap",
               "PCIe replays")


def xid_cell(gpu: GpuHealth) -> str:
    if gpu.last_xid is None:
        return NOT_REPORTED
    if gpu.last_xid == 0:
        return "none"
    # The exporter's own words where it sends them (err_msg, newer exporters), else ours.
    return f"{gpu.last_xid} ({gpu.xid_message or xid(gpu.last_xid).meaning})"


def temp_cell(value: float | None) -> str:
    return NOT_REPORTED if value is None else f"{value:g} °C"


def throttle_cell(reasons: tuple[ThrottleReason, ...] | None) -> str:
    if reasons is None:
        return NOT_REPORTED
    return ", ".join(reasons) or "nothing"


def ecc_cell(gpu: GpuHealth) -> str:
    if gpu.ecc_dbe is None and gpu.ecc_sbe is None:
        return "not reported (ECC off or not collected)"
    return f"{_count(gpu.ecc_dbe)}/{_count(gpu.ecc_sbe)}"


def remap_cell(gpu: GpuHealth) -> str:
    if gpu.row_remap_failed is None and gpu.uncorrectable_remapped_rows is None:
        return NOT_REPORTED
    failed = {True: "FAILED", False: "ok", None: "failure not reported"}[gpu.row_remap_failed]
    if gpu.uncorrectable_remapped_rows:
        failed += f", {plural(gpu.uncorrectable_remapped_rows, 'row')} remapped (uncorrectable)"
    return failed


def count_cell(value: int | None) -> str:
    return _count(value)


def _count(value: int | None) -> str:
    return NOT_REPORTED if value is None else str(value)


def gpu_row(gpu: GpuHealth) -> tuple[str, ...]:
    return (gpu.gpu + (f" {gpu.model}" if gpu.model else ""), xid_cell(gpu), temp_cell(gpu.gpu_temp_c),
            temp_cell(gpu.memory_temp_c), throttle_cell(gpu.throttle), ecc_cell(gpu), remap_cell(gpu),
            count_cell(gpu.pcie_replays))


def health_title(source: str) -> str:
    return f"GPU health (DCGM, from {source})"


def no_series(node: str, source: str, label: str) -> str:
    return (f"No DCGM series for {node} in {source} (looked for label {label}=\"{node}\"): the exporter is not "
            "running there, not scraped, or labels the node differently (signals.node_label). Its GPUs' health "
            "is unknown, not good.")


def fewer_gpus(node: str, *, reported: int, physical: int) -> str:
    return (f"DCGM reports {plural(reported, 'GPU')} of the {physical} GFD counts on {node}: the others' health is "
            "unknown (a GPU that fell off the bus drops out of DCGM; check `nvidia-smi` on the node).")


def unavailable(source: str, reason: str) -> str:
    return f"GPU health unknown: {source} {reason}."


def xid_note(entry: Xid) -> str:
    return f"XID {entry.code}: {entry.meaning}; {entry.action}."
