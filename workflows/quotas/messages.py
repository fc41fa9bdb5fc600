"""Every sentence the quota report says about a namespace or a pool: what is flagged,
with the numbers and the pools, and what the figures mean. Nothing here decides
anything."""

from __future__ import annotations

from collections.abc import Sequence

from workflows.kube.objects import GPU_RESOURCE, NodeRequirement, Placement, Toleration
from workflows.quotas.reach import STATE_TAINT_PREFIX
from workflows.wording import names


def amount(count: int, resource: str) -> str:
    """"6 GPUs", "1 GPU", "3 nvidia.com/mig-1g.10gb"."""
    if resource == GPU_RESOURCE:
        return f"{count} GPU{'' if count == 1 else 's'}"
    return f"{count} {resource}"


def pools_text(pools: Sequence[str]) -> str:
    return names(pools) if pools else "no pool"


def not_enforced(namespace: str, quota: str, key: str, resource: str) -> str:
    return (f"{namespace}: `{key}` in quota {quota} is not enforced: Kubernetes counts an extended resource "
            f"only as `requests.{resource}`")


def exceeds(namespace: str, hard: int, resource: str, capacity: int, pools: Sequence[str], *,
            assumed: bool) -> str:
    where = f"the pools it can land on advertise ({pools_text(pools)})" if pools else "any pool it can land on advertises"
    text = f"{namespace}: its quota of {amount(hard, resource)} exceeds the {capacity} {where}"
    if assumed:
        text += "; it has no GPU pods, so this counts every pool a pod without constraints could land on"
    return text


def overcommit(quotas: Sequence[tuple[str, int]], resource: str, total: int, capacity: int,
               pools: Sequence[str]) -> str:
    listed = names([f"{namespace} ({hard})" for namespace, hard in quotas])
    return (f"Overcommitted: the quotas on {resource} of {listed} add to {total}, more than the {capacity} that "
            f"the pools they can land on advertise ({pools_text(pools)})")


def unquoted_serving(namespace: str, pool: str, free: int, resources: Sequence[str], *, has_quota: bool) -> str:
    which = "no GPU quota" if not has_quota else "no quota on " + names(resources)
    if list(resources) == [GPU_RESOURCE]:
        last = f"{free} free GPU{'' if free == 1 else 's'}"
    elif len(resources) == 1:
        last = f"{free} free {resources[0]}"
    else:
        last = f"{free} free ({names(resources)})"
    return (f"{namespace} has {which} and can land on serving pool {pool}: nothing keeps it from taking "
            f"the pool's last {last}")


def assumed_reach() -> str:
    return "no GPU pods: compared against every pool a pod without constraints could land on"


def unreadable(identity: str, detail: str, *, forbidden: bool) -> str:
    if forbidden:
        return (f"gpuops ({identity}) may not list ResourceQuotas: grant `list` on `resourcequotas` "
                f"(deploy/rbac.yaml, role gpuops-fleet-reader). The API server said: {detail}")
    return f"The Kubernetes API did not answer the list of ResourceQuotas: {detail}"


def placement_text(placement: Placement) -> str:
    """A pod's scheduling constraints as one line: "nodeSelector gpuops.io/pool=serving-a;
    affinity: gpu.product In (H100, A100); tolerates dedicated=serving:NoSchedule" (node
    state tolerations left out)."""
    parts = []
    if placement.node_selector:
        parts.append("nodeSelector " + ", ".join(f"{k}={v}" for k, v in sorted(placement.node_selector.items())))
    if placement.required_terms:
        terms = [" and ".join([*(_requirement(r) for r in t.match_expressions),
                               *(_requirement(r) for r in t.match_fields)]) or "(empty term: no node)"
                 for t in placement.required_terms]
        parts.append("affinity: " + " or ".join(terms))
    # The not-ready/unreachable tolerations every pod gets from admission say nothing about
    # pools (their taints are left out of the reach too).
    shown = [t for t in placement.tolerations if not t.key.startswith(STATE_TAINT_PREFIX)]
    if shown:
        parts.append("tolerates " + ", ".join(_toleration(t) for t in shown))
    return "; ".join(parts) or "none"


def _requirement(requirement: NodeRequirement) -> str:
    if requirement.operator in ("Exists", "DoesNotExist"):
        return f"{requirement.key} {requirement.operator}"
    return f"{requirement.key} {requirement.operator} ({', '.join(requirement.values)})"


def _toleration(toleration: Toleration) -> str:
    if toleration.operator == "Exists":
        text = f"{toleration.key} (any value)" if toleration.key else "every taint"
    else:
        text = f"{toleration.key}={toleration.value}"
    return text + (f":{toleration.effect}" if toleration.effect else "")
