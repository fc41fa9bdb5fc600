"""What a person reads when a run stops short: a step failed and the run halted (with the
wave's fallback step's note), a wave that can no longer start, a run aborted, and the
nodes each leaves cordoned for a person to check. Nothing here decides anything.

Every reason a run halts has a stable code (`HaltCode`), given where the halt is decided:
a step's `Failed(..., code=...)`, the engine's own (a step timed out, the API refused, bad
params), the gate before a wave (its window ended). The code is audited with the halt, names
the halt's runbook (docs/runbooks.yaml, `halts:`; a test requires one entry per code), and
the halt message in Slack links to it when `docs_url` is set. A code, once published, is not
renamed: links to its runbook live on in old threads."""

from __future__ import annotations

import datetime as dt
import typing
from collections.abc import Sequence
from typing import Literal

from workflows.engine.phrases import listed, span

HaltCode = Literal[
    # A step failed (workflows/engine/steps/, and a change kind's own steps).
    "node-in-another-run",  # cordon: another unfinished run marked the node
    "no-driver-pod",  # driver upgrade: no driver pod of the operator on the node
    "new-driver-failing",  # driver upgrade: the new driver pod crashes or fails to build
    "driver-wrong-version",  # driver upgrade: the new driver pod runs another version
    "driver-changed-meanwhile",  # driver upgrade: someone changed the driver version during the run
    "git-version-other",  # driver upgrade, Git mode: Git applied another version than the approved one
    "git-window-ended",  # driver upgrade, Git mode: the window ended before Git named the version
    "operator-upgrade-failed",  # the operator's own upgrade of the node ended in upgrade-failed
    "mig-failed",  # MIG manager set mig.config.state=failed
    "gpu-check-failed",  # the GPU check pod failed on the node
    "gpu-check-no-namespace",  # the GPU check's namespace does not exist
    "pods-keep-returning",  # drain: pods come back on the node after eviction
    "eviction-blocked",  # drain: PodDisruptionBudgets blocked eviction past the timeout (action halt)
    "pods-would-not-go",  # drain: evicted pods would not terminate in time
    # The engine's own, for any step.
    "step-timed-out",  # the step waited past its timeout
    "api-refused",  # the Kubernetes API refused (forbidden, invalid, not found)
    "bad-params",  # the step's stored params cannot be read
    "step-failed",  # a step failed for a reason without a code of its own
    # Before a wave (workflows/engine/wave_gates.py).
    "window-ended",  # the next wave waited for capacity until the window ended
    "window-ended-while-frozen",  # a change freeze held the run past its window's end
    "service-unhealthy",  # a pool's analysis query passed its bound after a wave
    "service-health-unread",  # a pool's analysis query could not be read after a wave
    # Before a node is given back (workflows/engine/signal_gate.py).
    "new-gpu-fault",  # a new XID, double-bit ECC error or row-remap failure after the node's change
    "gpu-signals-unread",  # the node's DCGM signals could not be read after its change
]
HALT_CODES: tuple[HaltCode, ...] = typing.get_args(HaltCode)


def halted(node: str, kind: str, reason: str, *, left_cordoned: Sequence[str], after: str | None = None) -> str:
    """`after`: what the wave's step that runs on a failure did (a driver version set back)."""
    text = f"{node}: {kind} failed: {reason}. The run stopped; no further steps or waves"
    return text + "." + (f" Then: {after}." if after else "") + _left_cordoned(left_cordoned)


def fallback_failed(kind: str, reason: str) -> str:
    return f"the {kind} step that runs on a failure failed too: {reason}"


def halted_before_wave(reason: str, *, left_cordoned: Sequence[str]) -> str:
    return f"{reason}. The run stopped; no further waves." + _left_cordoned(left_cordoned)


def new_gpu_faults(node: str, faults: Sequence[str], *, before: Sequence[str], after: Sequence[str]) -> str:
    text = f"{node}: new GPU faults after its change: {'; '.join(faults)}. It stays cordoned"
    if before:
        text += ". Before: " + "; ".join(before)
    return text + ". After: " + "; ".join(after)


def signals_unread(node: str, why: str, *, waited: dt.timedelta) -> str:
    return (f"{node}: its GPU signals could not be read {span(waited)} after its change ({why}), so it is not "
            "given back as healthy. It stays cordoned")


def halted_at_node(reason: str, *, left_cordoned: Sequence[str]) -> str:
    return f"{reason}. The run stopped; no further steps or waves." + _left_cordoned(left_cordoned)


def halted_elsewhere(node: str) -> str:
    return f"stopped because {node} failed"


def _left_cordoned(nodes: Sequence[str]) -> str:
    if not nodes:
        return " No node is left cordoned by this run."
    if len(nodes) == 1:
        return (f" Left cordoned by this run: {nodes[0]} (once you have checked it, "
                f"`/gpu uncordon {nodes[0]}` gives it back).")
    return (f" Left cordoned by this run: {listed(nodes, limit=20)} (once you have checked them, "
            "`/gpu uncordon <node>` gives each back).")


def run_aborted(run_id: str, actor: str, *, left_cordoned: Sequence[str]) -> str:
    return (f"{actor} aborted {run_id}: nothing more will be done and nodes are left as they "
            "are." + _left_cordoned(left_cordoned))


def aborted_step(actor: str) -> str:
    return f"aborted by {actor}"
