"""A node's DCGM signals before a change and after its check (`NodeMarks`), and which
faults are new (`new_faults`), defined per signal as honestly as its series allows:

- XID: DCGM_FI_DEV_XID_ERRORS holds only the *last* code a GPU raised, so a new XID is
  a code other than the one before. Where the driver reloaded (the change restarts it),
  the series starts again from 0, so a watched code shown after the reload is new even
  if it equals the old one. The same code raised again without a reload is not seen in
  the value: that is the series' limit, said in the docs.
- Double-bit ECC: the volatile count resets when the driver reloads, so after a reload
  any count above zero is new (not "above the count before", which the reset hides);
  without a reload, a count above the one before, or one lower than before (a reload
  gpuops did not make) and above zero.
- Row-remap failure: a state that survives reloads; new when set after and not before.
- Throttling is read and shown beside them, but halts nothing (a busy GPU caps its clocks).

Where the reading before was unknown, nothing is known to be old: a watched XID, a DBE
count above zero or a remap failure after is new (fail closed). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workflows.signals import messages as say
from workflows.signals.reading import Reading
from workflows.signals.xids import xid

# The XIDs that hold a node cordoned when they are new after its change: a double-bit ECC
# error, page retirement or row remapping recorded or failed, off the bus, uncorrectable
# ECC (contained or not).
HOLDING_XIDS = frozenset({48, 63, 64, 79, 94, 95})


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuMarks:
    """One GPU's signals at one reading (None: not reported)."""

    gpu: str
    last_xid: int | None = None
    ecc_dbe: int | None = None
    row_remap_failed: bool | None = None
    throttle: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "last_xid": self.last_xid, "ecc_dbe": self.ecc_dbe,
                "row_remap_failed": self.row_remap_failed,
                "throttle": list(self.throttle) if self.throttle is not None else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuMarks:
        throttle = data.get("throttle")
        return cls(gpu=str(data.get("gpu")), last_xid=data.get("last_xid"), ecc_dbe=data.get("ecc_dbe"),
                   row_remap_failed=data.get("row_remap_failed"),
                   throttle=tuple(throttle) if isinstance(throttle, list) else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeMarks:
    """A node's GPUs' signals at one reading, or (`unknown`) why they could not be read."""

    gpus: tuple[GpuMarks, ...] = ()
    unknown: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"gpus": [g.to_json() for g in self.gpus], "unknown": self.unknown}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeMarks:
        gpus = data.get("gpus")
        return cls(gpus=tuple(GpuMarks.from_json(g) for g in gpus if isinstance(g, Mapping))
                   if isinstance(gpus, list) else (), unknown=data.get("unknown"))


def marks_of(reading: Reading, node: str) -> NodeMarks:
    """`node`'s marks in `reading`, or why they are unknown."""
    if reading.unavailable is not None:
        return NodeMarks(unknown=reading.unavailable)
    if node in reading.unknown:
        return NodeMarks(unknown=reading.unknown[node])  # type: ignore[index]  # a NodeName is a str
    health = reading.node(node)
    if health is None or not health.gpus:
        return NodeMarks(unknown=say.marks_not_reported(reading.source))
    return NodeMarks(gpus=tuple(GpuMarks(gpu=g.gpu, last_xid=g.last_xid, ecc_dbe=g.ecc_dbe,
                                         row_remap_failed=g.row_remap_failed, throttle=g.throttle)
                                for g in health.gpus))


@dataclass(frozen=True, slots=True)
class NewFault:
    """A fault that appeared on one GPU between the readings, in one sentence."""

    gpu: str
    signal: str  # "xid", "ecc-dbe", "row-remap"
    sentence: str


def new_faults(before: NodeMarks | None, after: NodeMarks, *, reloaded: bool) -> tuple[NewFault, ...]:
    """The faults `after` shows that `before` did not (see the module doc)."""
    old = {g.gpu: g for g in (before.gpus if before is not None else ())}
    found: list[NewFault] = []
    for gpu in after.gpus:
        was = old.get(gpu.gpu)
        code = gpu.last_xid
        if code in HOLDING_XIDS and (was is None or reloaded or was.last_xid != code):
            found.append(NewFault(gpu.gpu, "xid", say.new_xid(gpu.gpu, code, xid(code).meaning,
                                                              before=was.last_xid if was else None)))
        count = gpu.ecc_dbe
        if count:
            earlier = was.ecc_dbe if was is not None else None
            if reloaded or earlier is None or count < earlier:
                new = count > 0  # reset by the reload: every count since is new
            else:
                new = count > earlier
            if new:
                found.append(NewFault(gpu.gpu, "ecc-dbe", say.new_dbe(gpu.gpu, count, before=earlier,
                                                                      reloaded=reloaded)))
        if gpu.row_remap_failed and not (was is not None and was.row_remap_failed):
            found.append(NewFault(gpu.gpu, "row-remap", say.new_remap_failure(gpu.gpu)))
    return tuple(found)


def readings_line(marks: NodeMarks) -> Sequence[str]:
    """Each GPU's readings, one line each, for the halt's text and the audit."""
    if marks.unknown is not None:
        return (marks.unknown,)
    return tuple(say.gpu_marks(g.gpu, last_xid=g.last_xid, ecc_dbe=g.ecc_dbe, row_remap_failed=g.row_remap_failed,
                               throttle=g.throttle) for g in marks.gpus)
