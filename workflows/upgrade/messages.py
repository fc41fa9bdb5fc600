"""The sentences of upgrade refusals: what is wrong and what to do instead."""

from __future__ import annotations

import datetime as dt
import difflib
from collections.abc import Sequence

from workflows.wording import closest_hint, duration_text, names, plural


def malformed_version(text: str) -> str:
    return (f"`{text}` is not a driver version: write it as NVIDIA does, three numbers "
            "(e.g. 580.95.05 or 570.172.08)")


def pool_not_in_fleet(name: str, known: Sequence[str]) -> str:
    return f"no pool `{name}`{closest_hint(difflib.get_close_matches(name, known, n=2))} (pools: {names(known)})"


def version_not_allowed(version: str, allowed: Sequence[str]) -> str:
    return f"driver {version} is not in upgrades.allowed_versions ({names(allowed)}); ask an admin to add it"


# What an upgrade does only in a configured pool (`pools.messages.no_policy_for`).
ONLY_CONFIGURED = "gpuops upgrades only configured pools"


def plan_manager_note(ref: str, current: Sequence[tuple[str, int]], version: str) -> str:
    now = ", ".join(f"{v} on {plural(n, 'node')}" for v, n in current) or "no version reported"
    return f"{ref} is set to {version} at the canary's first step (now: {now})"


def plan_set_back_note(ref: str, before: str | None, version: str, canary: str) -> str:
    back = before or "the version it names when the run starts"
    return (f"if the canary fails, {ref} is set back to {back} before the run halts (only while it still names "
            f"{version}; kept by Git, the run says what to set back there); {canary} keeps what it was given and "
            "waits for a rollback request")


def plan_git_note(ref: str, field: str, before: str | None, version: str, *, owner: str | None,
                  rollback: bool) -> str:
    by = owner or "the GitOps tool that applies it"
    change = (f"set {field} back to {version} in Git" if rollback
              else f"change {field} from {before or 'what it names'} to {version} in Git")
    return (f"Git mode: gpuops does not patch {ref}. Once the run starts, its thread says to {change}; {by} "
            f"applies it, and the run waits inside the window until {ref} names {version}, then goes wave by "
            "wave. Another version halts the run before any node moves; a window that ends first gives every "
            "node back untouched")


def plan_version_owner_note(owner: str, evidence: Sequence[str], *, from_git: bool) -> str:
    seen = f" ({'; '.join(evidence)})" if evidence else ""
    if from_git:
        return (f"{owner}{seen}: a version gpuops patches there is put back by the next sync unless Git names it "
                "too")
    return f"{owner}{seen}: the next apply of that release sets the version it names"


def plan_gates_operator_note(ref: str) -> str:
    return (f"gpuops gates the operator (autoUpgrade on for {ref}): every node is held back from the operator's "
            "upgrade (label nvidia.com/gpu-driver-upgrade.skip=true) before the version changes, and let go in "
            "its wave; the operator cordons, waits for jobs, deletes GPU pods and restarts the driver per its "
            "upgradePolicy; gpuops validates every GPU before it uncordons. A node the operator marks "
            "upgrade-failed halts the run, and the nodes not yet let go stay held")


def plan_skipped_by_person_note(nodes: Sequence[str]) -> str:
    return (f"left out: {names(nodes)}, labelled nvidia.com/gpu-driver-upgrade.skip=true by a person (the "
            "operator will not upgrade them while it stays)")


def plan_also_moves_note(ref: str, pools: Sequence[str], version: str, *, held: bool, named: bool,
                         rollback_of: str | None = None) -> str:
    why = (f"as run {rollback_of} changed it for them" if rollback_of else
           "named in the request" if named else "upgrades.cluster_policy_scope: all-pools")
    if held and rollback_of:
        # Held back from the run being undone, they never left `version`: nothing to upgrade.
        return (f"{ref} also drives {names(pools)} ({why}): their nodes were held back from that run's version, "
                f"still run {version}, and stay held after this run")
    if rollback_of:
        return (f"{ref} also drives {names(pools)} ({why}): their driver pods that restarted since run "
                f"{rollback_of} take {version} again on their next restart (OnDelete)")
    if held:
        return (f"{ref} also drives {names(pools)} ({why}): their nodes are held back from the operator's upgrade "
                f"and stay held after this run; upgrade them in turn with /gpu upgrade <pool> to {version}")
    return (f"{ref} also drives {names(pools)} ({why}): their driver pods take {version} on their next restart "
            f"(OnDelete); upgrade them in turn with /gpu upgrade <pool> to {version}")


def plan_release_note(run: str, nodes: Sequence[str]) -> str:
    return f"at the end, {names(nodes)} (held back by {run} and never upgraded) are given back to the operator"


def plan_canary_note(canary: str, soak: dt.timedelta, *, only_node: bool = False) -> str:
    if only_node:
        return f"{canary} is the only node; the run watches it {duration_text(soak)} after its upgrade, then ends"
    return f"{canary} goes first, alone; the pool then waits {duration_text(soak)} before the next wave"


def plan_gpu_check_note(command: object, image: object, resource: object, namespace: object,
                        count: int | str = 1) -> str:
    shown = " ".join(str(c) for c in command) if isinstance(command, (list, tuple)) else str(command)
    held = (f"one {resource}" if count == 1 else f"every {resource} of the node" if count == "all"
            else f"{count} {resource}")
    return (f"before each node is given back, a check pod in {namespace} runs `{shown}` on it ({image}, "
            f"{held}); a non-zero exit halts the run with the node cordoned")


def plan_diag_note(level: int, image: object, resource: object, namespace: object) -> str:
    return (f"before each node is given back, a check pod in {namespace} runs DCGM's diagnostics at level {level} "
            f"(`dcgmi diag -r {level} -j`, {image}) on every {resource} of the node; a failed test halts the run "
            "with the node cordoned, quoting it")


def plan_burn_in_note(command: object, image: object, resource: object) -> str:
    shown = " ".join(str(c) for c in command) if isinstance(command, (list, tuple)) else str(command)
    return (f"after the check, the pool's burn-in runs `{shown}` ({image}) on every {resource} of each node; "
            "a non-zero exit halts the run with the node cordoned")


def plan_downgrade_note(version: str) -> str:
    return f"a downgrade to {version}, asked for on purpose (--downgrade)"


def not_operator_owned(pool: str, nodes: Sequence[tuple[str, str]]) -> str:
    what = {"host": "host driver", "conflict": "two driver sources"}
    listed = names(f"{node} ({what.get(owner, owner)})" for node, owner in nodes)
    return (f"pool {pool} has nodes whose driver the GPU Operator does not own: {listed}. gpuops does not "
            "change host drivers: move them to the operator first, or out of the pool")


def no_manager(pool: str) -> str:
    return f"no node of pool {pool} takes the GPU Operator's driver, so no operator object sets its version"


def several_managers(pool: str, refs: Sequence[str]) -> str:
    return (f"pool {pool}'s nodes are driven by {names(refs)}; an upgrade changes one object: give the pool "
            "one NVIDIADriver whose nodeSelector covers all of its nodes")


def driver_cr_shared(driver: str, pool: str, others: Sequence[str]) -> str:
    return (f"NVIDIADriver {driver} also drives {names(others)}: changing its version would upgrade "
            f"{'that pool' if len(others) == 1 else 'those pools'} too. Narrow its nodeSelector to pool {pool}, or "
            "give each pool an NVIDIADriver of its own")


def cluster_policy_shared(policy: str, pool: str, others: Sequence[str], version: str, *, auto_upgrade: bool) -> str:
    when = ("the operator would roll it out there at once (autoUpgrade on)" if auto_upgrade
            else "their driver pods take it on their next restart (OnDelete)")
    return (f"ClusterPolicy {policy} sets the driver of {names(others)} too: a change to {version} reaches "
            f"{'that pool' if len(others) == 1 else 'those pools'} as well; {when}. Give pool {pool} its own "
            "NVIDIADriver (ClusterPolicy spec.driver.useNvidiaDriverCRD: true, one NVIDIADriver per pool); or "
            f"name them to accept that (--also {','.join(others)}), or have an admin set "
            "upgrades.cluster_policy_scope: all-pools")


def nothing_to_do(pool: str, version: str) -> str:
    return f"pool {pool} already runs driver {version} on every node the operator drives: nothing to do"


def downgrade_needs_consent(version: str, newer: Sequence[str]) -> str:
    return (f"{version} is older than {names(newer)}: a downgrade is allowed only as a rollback of a run, "
            "or when asked with --downgrade")


def no_nodes_to_upgrade() -> str:
    return "no node to upgrade: none of the pool's nodes takes the operator's driver"


def plan_rollback_note(run: str, version: str, nodes: Sequence[str]) -> str:
    return (f"a rollback of run {run}: {names(nodes)} go{'es' if len(nodes) == 1 else ''} back to {version}, "
            f"taking over the cordon{'s' if len(nodes) != 1 else ''} that run left")


def rollback_not_an_upgrade(run: str, kind: str) -> str:
    return f"run {run} is a {kind}, not a driver upgrade or a MIG change: only those can be rolled back"


# What a run of this kind changes (`pools.messages.nothing_to_roll_back`).
ROLLED_BACK = "driver version"
