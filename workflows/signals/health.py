"""Per node and GPU, what DCGM reports about its health, from the exporter's series
(read through Prometheus or from an exporter's page, `workflows.prometheus.Sample`).

Every field is None when its series is absent or holds one of DCGM's "blank" values
(not supported, not found, no permission): "not reported", which is never the same as
healthy. Which series an exporter sends is its counters file's choice: the default one
(dcgm-exporter's default-counters.csv) sends XIDs, temperatures, PCIe replays and row
remapping, but leaves ECC counts and clock-throttle reasons commented out.

The node a series belongs to is read from one label, `Hostname` by default: the GPU
Operator's exporter sets it to the Kubernetes node's name; where it does not (a pod's
hostname), another label that Prometheus adds, such as `node`, can be configured. Read
straight from the exporters, the node is the exporter pod's node instead.

Correctable ECC errors and PCIe replays are judged by how fast they grow (`Rate`: the
increase per hour, over the span it was measured on), not by their totals since the driver
loaded; a rate that cannot be had yet is None beside a known total."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, TypeVar

from workflows.kube.objects import NodeName
from workflows.prometheus.samples import Sample

XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
MEMORY_TEMP = "DCGM_FI_DEV_MEMORY_TEMP"
# The same bitmask under its old and its new name (DCGM 3.3 renamed throttling to
# "clocks event"); an exporter sends one of them when its counters file asks for it.
THROTTLE_REASONS = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
ECC_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ECC_SBE = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
UNCORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
PCIE_REPLAYS = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"

SERIES: tuple[str, ...] = (XID_ERRORS, GPU_TEMP, MEMORY_TEMP, *THROTTLE_REASONS, ECC_DBE, ECC_SBE,
                           ROW_REMAP_FAILURE, UNCORRECTABLE_REMAPPED_ROWS, PCIE_REPLAYS)

# DCGM's blank values start at 0x7ffffff0 for 32-bit fields and 0x7ffffffffffffff0 for
# 64-bit ones (DCGM_INT32_BLANK, DCGM_INT64_BLANK); the exporter passes them through
# (its README shows a memory temperature of 9223372036854775794: "not supported").
_T = TypeVar("_T")
_INT32_BLANK = 0x7FFFFFF0
_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)

ThrottleReason: TypeAlias = Literal[
    "idle", "application clocks", "power cap", "HW slowdown", "sync boost", "thermal (SW)",
    "thermal (HW)", "power brake (HW)", "display clocks",
]
# NVML's clocks-event reason bits (nvmlClocksEventReason*), which DCGM reports as they are.
THROTTLE_BITS: tuple[tuple[int, ThrottleReason], ...] = (
    (0x1, "idle"), (0x2, "application clocks"), (0x4, "power cap"), (0x8, "HW slowdown"),
    (0x10, "sync boost"), (0x20, "thermal (SW)"), (0x40, "thermal (HW)"), (0x80, "power brake (HW)"),
    (0x100, "display clocks"),
)


def throttle_reasons(mask: int) -> tuple[ThrottleReason, ...]:
    """The reasons set in a clocks-event bitmask, in bit order."""
    return tuple(name for bit, name in THROTTLE_BITS if mask & bit)


# The counters whose growth per hour raises findings (not their totals).
RATED: tuple[str, ...] = (ECC_SBE, PCIE_REPLAYS)


@dataclass(frozen=True, slots=True)
class Rate:
    """How fast a counter grew: its increase per hour, measured over `over`."""

    per_hour: float
    over: dt.timedelta


# (the GPU's key on its node, see `gpu_key`; the counter's series name) -> its rate
GpuRates = Mapping[tuple[str, str], Rate]


def gpu_key(labels: Mapping[str, str]) -> str:
    """Which GPU of its node a series is about: its UUID, else its index."""
    return labels.get("UUID") or labels.get("gpu") or "?"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuHealth:
    gpu: str  # the exporter's `gpu` label, the index on the node
    uuid: str | None
    model: str | None
    last_xid: int | None  # 0: no XID since the exporter started watching
    xid_message: str | None  # the exporter's `err_msg` label, where it sends one
    gpu_temp_c: float | None
    memory_temp_c: float | None
    throttle: tuple[ThrottleReason, ...] | None
    ecc_dbe: int | None  # volatile: since the driver last loaded
    ecc_sbe: int | None
    row_remap_failed: bool | None
    uncorrectable_remapped_rows: int | None
    pcie_replays: int | None  # since the driver last loaded
    # Per hour; None where not known (yet) although the total may be.
    ecc_sbe_rate: Rate | None = None
    pcie_replays_rate: Rate | None = None

    @property
    def reported(self) -> tuple[str, ...]:
        """The names of the signals this GPU reported (the view says which are missing)."""
        return tuple(name for name in SIGNAL_NAMES if getattr(self, name) is not None)


SIGNAL_NAMES = ("last_xid", "gpu_temp_c", "memory_temp_c", "throttle", "ecc_dbe", "ecc_sbe",
                "row_remap_failed", "uncorrectable_remapped_rows", "pcie_replays")


@dataclass(frozen=True, slots=True)
class Unreadable:
    """One GPU's series that could not be read (its value, a label, two that disagree)."""

    gpu: str  # the GPU's key on its node (`gpu_key`)
    series: str
    reason: str  # in words: "its value NaN is not a reading"


@dataclass(frozen=True, slots=True)
class NodeHealth:
    node: NodeName
    gpus: tuple[GpuHealth, ...] = field(default=())
    # Series left out as unreadable: what they say is unknown (never healthy).
    unreadable: tuple[Unreadable, ...] = field(default=())


def _gauge(value: float) -> float | None:
    """A 32-bit field's value, or None for a blank."""
    if value != value or value < 0 or value >= _INT32_BLANK:
        return None
    return value


def _counter(value: float) -> int | None:
    """A 64-bit counter's value, or None for a blank."""
    if value != value or value < 0 or value >= _INT64_BLANK:
        return None
    return int(value)


def _temperature(value: float) -> float | None:
    # A vGPU guest (and a board without the sensor) reports 0 °C: no reading, not a cold GPU.
    reading = _gauge(value)
    return reading if reading else None


def node_health(samples: Iterable[Sample], *, node_label: str = "Hostname",
                rates: Mapping[NodeName, GpuRates] | None = None) -> dict[NodeName, NodeHealth]:
    """The health of every GPU the samples describe, per node (series without the node
    label are left out: gpuops cannot say whose GPU they are). `rates`: per node, the
    rates of its counters where they are known."""
    per_node: dict[str, list[Sample]] = {}
    for sample in samples:
        if sample.name not in SERIES:
            continue
        node = sample.labels.get(node_label)
        if not node:
            continue  # (also a series whose node label is not text: it is nobody's)
        per_node.setdefault(node, []).append(sample)
    return {NodeName(node): node_health_of(NodeName(node), found, rates=(rates or {}).get(NodeName(node), {}))
            for node, found in sorted(per_node.items())}


def node_health_of(node: NodeName, samples: Iterable[Sample], *, rates: GpuRates | None = None) -> NodeHealth:
    """The health of one node's GPUs from samples known to be that node's (an exporter's
    page read from the pod on it), whatever node label they carry. A series of a shape
    gpuops does not expect, or two of one GPU's that disagree, is left out as unreadable."""
    per_gpu: dict[str, dict[str, Sample]] = {}
    unreadable: dict[tuple[str, str], str] = {}
    for sample in samples:
        if sample.name not in SERIES:
            continue
        key = (gpu_key(sample.labels), sample.name)
        problem = unreadable_because(sample)
        earlier = per_gpu.get(key[0], {}).get(sample.name)
        if problem is None and earlier is not None and earlier.value != sample.value:
            problem = f"two of its series disagree ({earlier.value:g} and {sample.value:g})"
        if problem is not None:
            unreadable.setdefault(key, problem)
            continue
        per_gpu.setdefault(key[0], {})[sample.name] = sample
    for gpu, name in unreadable:
        per_gpu.get(gpu, {}).pop(name, None)
    gpus = (_gpu(series, rates={name: rate for (key, name), rate in (rates or {}).items() if key == gpu})
            for gpu, series in per_gpu.items() if series)
    return NodeHealth(node, tuple(sorted(gpus, key=_gpu_order)),
                      tuple(Unreadable(gpu, name, reason) for (gpu, name), reason in sorted(unreadable.items())))


def unreadable_because(sample: Sample) -> str | None:
    """Why a health series cannot be read as DCGM's (None: it can). DCGM sends whole
    numbers and its own blanks, never NaN or an infinity; the `gpu` label is an index."""
    if sample.problem is not None:
        return sample.problem
    if math.isnan(sample.value) or math.isinf(sample.value):
        return f"its value {sample.value} is not a reading"
    gpu = sample.labels.get("gpu")
    if gpu is not None and not (gpu.isascii() and gpu.isdigit() and len(gpu) <= 6):
        return f"its gpu label {gpu[:20]!r} is not a GPU index"
    return None


def counter_value(sample: Sample) -> int | None:
    """A counter sample's value, or None for one of DCGM's blanks."""
    return _counter(sample.value)


def _gpu_order(gpu: GpuHealth) -> tuple[int, str]:
    # NB: isdigit() alone takes "²", which int() refuses.
    return (int(gpu.gpu), "") if gpu.gpu.isascii() and gpu.gpu.isdigit() else (1 << 30, gpu.gpu)


def _gpu(series: Mapping[str, Sample], *, rates: Mapping[str, Rate]) -> GpuHealth:
    any_sample = next(iter(series.values()))
    labels = any_sample.labels

    def value(name: str) -> float | None:
        sample = series.get(name)
        return sample.value if sample is not None else None

    xid_sample = series.get(XID_ERRORS)
    last_xid = _gauge(xid_sample.value) if xid_sample is not None else None
    throttle_mask = next((v for v in (value(n) for n in THROTTLE_REASONS) if v is not None), None)
    throttle = None
    if throttle_mask is not None and _gauge(throttle_mask) is not None:
        throttle = throttle_reasons(int(throttle_mask))
    remap_failed = value(ROW_REMAP_FAILURE)
    remap_failed_flag = _gauge(remap_failed) if remap_failed is not None else None
    return GpuHealth(
        gpu=labels.get("gpu", "?"),
        uuid=labels.get("UUID"),
        model=labels.get("modelName"),
        last_xid=int(last_xid) if last_xid is not None else None,
        xid_message=(xid_sample.labels.get("err_msg") or None) if xid_sample is not None else None,
        gpu_temp_c=_opt(value(GPU_TEMP), _temperature),
        memory_temp_c=_opt(value(MEMORY_TEMP), _temperature),
        throttle=throttle,
        ecc_dbe=_opt(value(ECC_DBE), _counter),
        ecc_sbe=_opt(value(ECC_SBE), _counter),
        row_remap_failed=bool(remap_failed_flag) if remap_failed_flag is not None else None,
        uncorrectable_remapped_rows=_opt(value(UNCORRECTABLE_REMAPPED_ROWS), _counter),
        pcie_replays=_opt(value(PCIE_REPLAYS), _counter),
        ecc_sbe_rate=rates.get(ECC_SBE),
        pcie_replays_rate=rates.get(PCIE_REPLAYS),
    )


def _opt(value: float | None, read: Callable[[float], _T | None]) -> _T | None:
    return read(value) if value is not None else None
