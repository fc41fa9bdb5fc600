"""Every sentence about DCGM health an on-call engineer reads: findings and the node view."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workflows.signals.health import GpuHealth, Rate, ThrottleReason, Unreadable
from workflows.signals.xids import Xid, xid
from workflows.wording import duration_text, names, plural


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
    counts = names(f"{gpu_name(g)}: {rate_text(g.ecc_sbe_rate)}, {g.ecc_sbe} since the driver loaded" for g in gpus)
    return (f"Correctable (single-bit) ECC errors on {node} at or over {threshold} an hour ({counts}). Watch for "
            "row-remap failures or double-bit errors; reset the GPU at the next drain.")


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
    counts = names(f"{gpu_name(g)}: {rate_text(g.pcie_replays_rate)}, {g.pcie_replays} since the driver loaded"
                   for g in gpus)
    return (f"PCIe replays on {node} at or over {threshold} an hour ({counts}): the link to the GPU is retrying. "
            "Check the riser, slot and cabling at the next drain.")


def rate_text(rate: Rate | None) -> str:
    """Such as "12/h over 1h"; "rate not known yet" before a second reading."""
    if rate is None:
        return RATE_NOT_KNOWN
    per_hour = f"{rate.per_hour:.0f}" if rate.per_hour >= 100 else f"{rate.per_hour:.3g}"
    return f"{per_hour}/h over {duration_text(rate.over)}"


RATE_NOT_KNOWN = "rate not known yet"


def health_unknown_finding(node: str, source: str, reason: str) -> str:
    return f"GPU health on {node} unknown: {source} {reason}. No DCGM finding can be raised there until it is read."


def unreadable_text(unreadable: Sequence[Unreadable], *, at_most: int = 3) -> str:
    """Such as "GPU 0's DCGM_FI_DEV_GPU_TEMP: its value nan is not a reading", one
    clause per GPU and reason, naming at most `at_most` of each's series."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for u in unreadable:
        grouped.setdefault((u.gpu, u.reason), []).append(u.series)
    clauses = []
    for (gpu, reason), series in grouped.items():
        more = len(series) - at_most
        listed = ", ".join(series[:at_most]) + (f" and {more} more" if more > 0 else "")
        clauses.append(f"GPU {gpu}'s {listed}: {reason}")
    more = len(clauses) - at_most
    return "; ".join(clauses[:at_most]) + (f"; and {more} more" if more > 0 else "")


def health_partly_unknown_finding(node: str, source: str, unreadable: Sequence[Unreadable]) -> str:
    return (f"GPU health on {node} partly unknown: {source} sent series gpuops cannot read "
            f"({unreadable_text(unreadable)}). What those series report is unknown, not healthy; the rest was read.")


# --------------------------------------------------------------------------------------
# Reading straight from the exporters: the source and why a node's health is unknown


def exporters_source(port: int) -> str:
    return f"dcgm-exporter pods (port {port})"


def selector_text(namespace: str, labels: Mapping[str, str]) -> str:
    return f"pods labelled {','.join(f'{k}={v}' for k, v in sorted(labels.items()))} in namespace {namespace}"


def outside_the_watched_namespace(selector: str, watched: str) -> str:
    return f"{selector}; gpuops sees the pods of {watched}, the GPU Operator's namespace, and GPU pods only"


def no_cluster() -> str:
    return "cannot be found: gpuops reads no pods here (it runs without the Kubernetes API)"


def no_namespace() -> str:
    return ("cannot be found: the GPU Operator's namespace is not known (set signals.exporters.namespace or "
            "cluster.operator_namespace)")


def none_found(selector: str) -> str:
    return f"found none (looked for {selector})"


def none_on(node: str, selector: str) -> str:
    return f"have none on {node} (looked for {selector})"


def not_running(node: str, pod: str, phase: str) -> str:
    return f"on {node}: {pod} is {phase} and has no pod IP yet"


def being_deleted(node: str, pod: str) -> str:
    return f"on {node}: {pod} is being deleted"


def did_not_answer(node: str, pod: str, address: str, reason: str) -> str:
    return f"on {node}: {pod} at {address} {reason}"


def past_deadline(node: str, seconds: float) -> str:
    return (f"on {node}: its exporter's page was not read within the {seconds:g} s that reading every node "
            "may take (signals.exporters.deadline)")


def only_unreadable_series(node: str, pod: str, address: str, unreadable: Sequence[Unreadable]) -> str:
    return f"on {node}: {pod} at {address} sent only DCGM series gpuops cannot read ({unreadable_text(unreadable)})"


def no_health_series(node: str, pod: str, address: str) -> str:
    return f"on {node}: {pod} at {address} answered without any DCGM health series"


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
    sbe_rate = f" (SBE {rate_text(gpu.ecc_sbe_rate)})" if gpu.ecc_sbe is not None else ""
    return f"{_count(gpu.ecc_dbe)}/{_count(gpu.ecc_sbe)}{sbe_rate}"


def remap_cell(gpu: GpuHealth) -> str:
    if gpu.row_remap_failed is None and gpu.uncorrectable_remapped_rows is None:
        return NOT_REPORTED
    failed = {True: "FAILED", False: "ok", None: "failure not reported"}[gpu.row_remap_failed]
    if gpu.uncorrectable_remapped_rows:
        failed += f", {plural(gpu.uncorrectable_remapped_rows, 'row')} remapped (uncorrectable)"
    return failed


def count_cell(value: int | None, rate: Rate | None = None) -> str:
    """A counter's total since the driver loaded and, beside a total, its rate."""
    return _count(value) if value is None else f"{value} ({rate_text(rate)})"


def _count(value: int | None) -> str:
    return NOT_REPORTED if value is None else str(value)


def gpu_row(gpu: GpuHealth) -> tuple[str, ...]:
    return (gpu.gpu + (f" {gpu.model}" if gpu.model else ""), xid_cell(gpu), temp_cell(gpu.gpu_temp_c),
            temp_cell(gpu.memory_temp_c), throttle_cell(gpu.throttle), ecc_cell(gpu), remap_cell(gpu),
            count_cell(gpu.pcie_replays, gpu.pcie_replays_rate))


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


# --- service health between waves (workflows.signals.analysis) ---------------------------
def analysis_prometheus_failed(url: str, reason: str) -> str:
    return f"Prometheus at {url} {reason}"


def analysis_no_series() -> str:
    return "the query answered no series (is the service still reporting?)"


def analysis_several_series(count: int) -> str:
    return f"the query answered {count} series, not one number (aggregate it, e.g. with sum or max)"


def analysis_odd_series(problem: str) -> str:
    return f"the query's series cannot be read: {problem}"


def analysis_not_a_number() -> str:
    return "the query answered NaN (a ratio of nothing to nothing?)"


# --- a node's signals before and after its change (workflows.signals.before_after) -------
def marks_not_reported(source: str) -> str:
    return f"{source} reported no GPU of this node"


def new_xid(gpu: str, code: int, meaning: str, *, before: int | None) -> str:
    was = "unknown" if before is None else ("none" if before == 0 else f"XID {before}")
    return f"GPU {gpu} raised XID {code} ({meaning}; before: {was})"


def new_dbe(gpu: str, count: int, *, before: int | None, reloaded: bool) -> str:
    if reloaded:
        return f"GPU {gpu} counts {count} double-bit ECC errors since its driver reloaded"
    was = "unknown" if before is None else str(before)
    return f"GPU {gpu} counts {count} double-bit ECC errors (before: {was})"


def new_remap_failure(gpu: str) -> str:
    return f"GPU {gpu} failed to remap a memory row"


def gpu_marks(gpu: str, *, last_xid: int | None, ecc_dbe: int | None, row_remap_failed: bool | None,
              throttle: tuple[str, ...] | None) -> str:
    def shown(value: object) -> str:
        return "not reported" if value is None else str(value)

    throttled = "not reported" if throttle is None else (", ".join(throttle) or "none")
    remap = "not reported" if row_remap_failed is None else ("failed" if row_remap_failed else "ok")
    return (f"GPU {gpu}: last XID {shown(last_xid)}, double-bit ECC {shown(ecc_dbe)}, row remap {remap}, "
            f"throttling {throttled}")
