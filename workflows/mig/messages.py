"""The sentences of MIG change plans and refusals: what changes, what is wrong and what
to do instead."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workflows.wording import closest_hint, names


def config_unreadable(source: str, why: str) -> str:
    return f"the MIG manager's config ({source}) cannot be read as a mig-parted config: {why}"


def config_missing(source: str, why: str) -> str:
    return (f"gpuops cannot read the MIG manager's config ({source}): {why}. It names the layouts a node can take; "
            "check the ClusterPolicy's migManager.config.name and the bot's RBAC (deploy/rbac.yaml)")


def unknown_layout(layout: str, source: str, product: str | None, offered: Sequence[str],
                   every: Sequence[str]) -> str:
    hint = closest_hint(difflib.get_close_matches(layout, list(offered) or list(every), n=2))
    fits = f"; for {product} it offers {names(offered, at_most=12)}" if product and offered else ""
    return f"no MIG layout `{layout}` in {source}{hint}{fits}"


def no_entry_for_gpu(layout: str, index: int, product: str | None, device_id: str | None) -> str:
    return (f"MIG layout `{layout}` has no entry for GPU {index} of a {product or 'GPU of unknown model'}"
            f"{f' ({device_id})' if device_id else ''}: mig-parted would refuse it; pick a layout made for it")


def profile_not_made(layout: str, profile: str, product: str, made: Iterable[str]) -> str:
    return (f"MIG layout `{layout}` asks for {profile}, which a {product} cannot make (it makes "
            f"{names(sorted(made))}): that layout is for another GPU")


def single_strategy_mixed(layout: str, profiles: Sequence[str]) -> str:
    return (f"MIG layout `{layout}` makes {names(profiles) if profiles else 'whole GPUs beside MIG devices'}, but "
            "the ClusterPolicy's mig.strategy is single, which needs one profile on every GPU: pick a layout with "
            "one profile, or move to the mixed strategy")


def no_mig_strategy(strategy: str | None) -> str:
    return (f"the ClusterPolicy's mig.strategy is {strategy or 'unset'}: the device plugin advertises no MIG "
            "devices, so a MIG layout gives the pool nothing to schedule; set mig.strategy to mixed or single first")


def resources_text(found: Mapping[str, int]) -> str:
    if not found:
        return "nothing"
    return ", ".join(f"{n}x {resource}" for resource, n in sorted(found.items()))


# What a MIG change does only in a configured pool (`pools.messages.no_policy_for`).
ONLY_CONFIGURED = "gpuops changes MIG layouts only in configured pools"


def not_mig_capable(node: str, product: str | None) -> str:
    return (f"{node}'s GPUs ({product or 'model unknown'}) cannot do MIG (nvidia.com/mig.capable is not true): "
            "leave it out")


def mig_change_under_way(node: str, config: str | None, state: str | None) -> str:
    return (f"{node} is in the middle of a MIG change ({config}: {state}); wait for the MIG manager to finish "
            "(or see why it is stuck with `/gpu node " + node + "`)")


def gpu_count_unknown(node: str, layout: str | None) -> str:
    return (f"gpuops cannot tell how many GPUs {node} has: with the single strategy GFD counts MIG devices, and its "
            f"layout {layout or '(none)'} does not explain the count it advertises")


def nothing_to_change(layout: str, already: Sequence[str]) -> str:
    return f"nothing to change: {names(already)} already run{'s' if len(already) == 1 else ''} `{layout}`"


def below_floor_after(pool: str, ready: int, floor: int) -> str:
    return (f"once every node has changed, pool {pool} would advertise {ready} Ready GPU resources, below its "
            f"min_ready_gpus of {floor}: lower the floor or change fewer nodes")


def pool_change_note(pool: str, before: Mapping[str, int], after: Mapping[str, int]) -> str:
    return f"pool {pool}: {resources_text(before)} -> {resources_text(after)}"


def node_change_notes(changes: Sequence[Any]) -> list[str]:
    """One line per distinct change, naming its nodes."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for change in changes:
        key = (resources_text(change.before), resources_text(change.after))
        grouped.setdefault(key, []).append(str(change.node))
    return [f"{names(nodes)}: {before} -> {after} each" if len(nodes) > 1 else f"{nodes[0]}: {before} -> {after}"
            for (before, after), nodes in grouped.items()]


def first_alone_note(node: str) -> str:
    return f"{node} changes first, alone: a layout the MIG manager fails halts the run before more nodes go"


def single_strategy_note() -> str:
    return ("the pool's MIG strategy is single: the resource stays nvidia.com/gpu, but its count and size change "
            "(each is now a MIG device, not a whole GPU)")


def vanishing_note(vanishing: Sequence[str], stranded: Sequence[Any]) -> str:
    shown = [f"{w.pod} ({w.owner})" if w.owner else w.pod for w in stranded[:8]]
    more = f" and {len(stranded) - 8} more" if len(stranded) > 8 else ""
    asking = (f"; asking for them now: {'; '.join(shown)}{more} (they will not schedule)" if stranded
              else "; no workload asks for them now")
    return f"no GPU node will advertise {names(vanishing)} afterwards{asking}"


def already_there_note(nodes: Sequence[str], layout: str) -> str:
    return f"{names(nodes)} already run{'s' if len(nodes) == 1 else ''} `{layout}`: left out"


def layouts_back_note(run: str, layouts: Sequence[tuple[str, str]]) -> str:
    back = ", ".join(f"{node} to {layout}" for node, layout in layouts)
    return f"a rollback of run {run}: {back}, each taking over the cordon the run left"


def no_cluster_policy() -> str:
    return ("no ClusterPolicy in effect: the GPU Operator's MIG manager (and its config of layouts) is not "
            "installed, so gpuops cannot change MIG layouts here")


def rollback_not_mig(run: str, kind: str) -> str:
    return f"run {run} is a {kind}, not a MIG change"


# What a run of this kind changes (`pools.messages.nothing_to_roll_back`).
ROLLED_BACK = "node's MIG layout"
