"""What the common XIDs mean and what an SRE does about each.

Source: NVIDIA's Xid documentation, "Xid Errors" (docs.nvidia.com/deploy/xid-errors/),
its Xid catalog for Ampere and newer GPUs ("Analyzing Xid Errors with the Xid Catalog":
mnemonic, description, immediate and investigatory resolution buckets) and the
dynamic page retirement guide (docs.nvidia.com/deploy/dynamic-page-retirement/) for 48, 63
and 64. The words are ours; an XID not listed here points at the catalog.

DCGM_FI_DEV_XID_ERRORS is the *last* XID the GPU raised (0: none since the exporter
started watching), so an XID stays on show until the driver is reloaded or the GPU reset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

XidSeverity: TypeAlias = Literal["critical", "warning", "info"]

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/"


@dataclass(frozen=True, slots=True)
class Xid:
    code: int
    meaning: str
    action: str
    severity: XidSeverity


_APPLICATION = "usually the application's own fault; if it repeats across workloads, reset the GPU"

XIDS: dict[int, Xid] = {x.code: x for x in (
    Xid(13, "graphics engine exception (often an out-of-bounds access by the application)", _APPLICATION, "info"),
    Xid(31, "GPU memory page fault (an illegal address, usually the application)", _APPLICATION, "info"),
    Xid(43, "GPU stopped processing a channel (an application fault; the GPU stays usable)", _APPLICATION, "info"),
    Xid(45, "preemptive cleanup after earlier errors (processes on the GPU were ended)",
        "look for the XID that came before it on this GPU", "info"),
    Xid(48, "double-bit (uncorrectable) ECC error",
        "drain the node and reset the GPU; if it recurs, RMA it", "critical"),
    Xid(61, "internal micro-controller breakpoint/warning",
        "reset the GPU at the next drain; report it to NVIDIA if it repeats", "warning"),
    Xid(62, "internal micro-controller halt", "drain the node and reset the GPU", "critical"),
    Xid(63, "ECC page retirement or row remapping recorded; a GPU reset is pending",
        "reset the GPU at the next drain to apply it", "warning"),
    Xid(64, "ECC page retirement or row remapping failed", "drain the node; reset the GPU and RMA it if it "
        "recurs", "critical"),
    Xid(74, "NVLink error", "drain the node, reset the GPUs on the link and check the NVLink/NVSwitch fabric",
        "critical"),
    Xid(79, "GPU has fallen off the bus (PCIe)",
        "drain the node and reboot it; check PCIe seating, power and temperature; RMA if it recurs", "critical"),
    Xid(92, "high single-bit ECC error rate", "watch the correctable ECC count; reset the GPU at the next drain",
        "warning"),
    Xid(94, "contained uncorrectable ECC error (only the affected application was ended)",
        "reset the GPU at the next drain to remap the memory", "warning"),
    Xid(95, "uncontained uncorrectable ECC error (every application on the GPU is affected)",
        "drain the node and reset the GPU now", "critical"),
    Xid(119, "GSP firmware RPC timeout", "drain the node and reset the GPU (or reboot); "
         "update the driver if it repeats", "critical"),
    Xid(120, "GSP firmware error", "drain the node and reset the GPU (or reboot); update the driver if it repeats",
        "critical"),
)}


def xid(code: int) -> Xid:
    """The XID's entry, or a generic one pointing at NVIDIA's catalog."""
    known = XIDS.get(code)
    if known is not None:
        return known
    return Xid(code, "an XID gpuops has no description for", f"look it up in NVIDIA's Xid catalog ({CATALOG_URL})",
               "warning")
