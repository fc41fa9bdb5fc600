"""What `/gpu node` reads when asked, beside the watch cache: the labels, taints and
annotations a person's tool set on the node (its `managedFields`, one GET: the cache does
not keep them), and the PodDisruptionBudgets covering the node's GPU pods (one list per
namespace of those pods).

Every read shares one deadline; a read that fails, is late, or answers in a shape not
expected leaves its part unknown with the reason, and the rest of the view stands.
Kubernetes keeps one entry per field manager (and operation), not per field: the time
shown is when that manager last wrote any of its fields."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from workflows.fleet import messages as say
from workflows.fleet.loose_values import parse_time
from workflows.fleet.pods import GpuPod
from workflows.kube.errors import KubeError
from workflows.kube.labels import HUMAN_MANAGERS
from workflows.kube.objects import DisruptionBudget

# Seconds every read of one `/gpu node` shares.
READ_DEADLINE = 5.0
# kubectl apply's copy of what it applied: the person's tool wrote it, but it says nothing new.
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

_T = TypeVar("_T")


class NodeReads(Protocol):
    """The reads (the Kubernetes gateway)."""

    def get_node_json(self, name: str) -> Mapping[str, Any]: ...

    def list_disruption_budgets(self, namespace: str) -> list[DisruptionBudget]: ...


class BadShape(ValueError):
    """An answer that is not shaped as the API documents it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HandSet:
    """A label, taint or annotation a person's tool owns on the node."""

    what: Literal["label", "taint", "annotation"]
    key: str
    value: str
    manager: str
    # When this manager last wrote any of its fields (None: the entry names no time).
    at: dt.datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeDetail:
    """None with a reason where a read is unknown."""

    hand_set: tuple[HandSet, ...] | None
    hand_set_unknown: str | None = None
    # GPU pod (namespace/name) -> the budgets covering it (empty: none).
    budgets: Mapping[str, tuple[str, ...]] | None = None
    budgets_unknown: str | None = None


def is_persons_tool(manager: str) -> bool:
    """kubectl (label, taint, annotate, edit, patch, apply), k9s, a browser's dashboard,
    Lens: the API server names a field manager after the client. Kubernetes' own managers
    (kubelet, controllers), the operator's, NFD's and gpuops' own are not a person's."""
    return manager.startswith(HUMAN_MANAGERS)


def _owned_keys(fields: object, *, where: str) -> list[str]:
    if not isinstance(fields, Mapping):
        raise BadShape(say.managed_fields_shape(where))
    return [key[2:] for key in fields if isinstance(key, str) and key.startswith("f:")]


def hand_set_fields(node: Mapping[str, Any]) -> tuple[HandSet, ...]:
    """From the node's JSON, its labels, taints and annotations that a person's tool owns
    (raises BadShape)."""
    if not isinstance(node, Mapping):
        raise BadShape(say.managed_fields_shape("the node"))
    meta = node.get("metadata")
    spec = node.get("spec") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        raise BadShape(say.managed_fields_shape("the node"))
    entries = meta.get("managedFields") or []
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    taints = spec.get("taints") or []
    if (not isinstance(entries, list) or not isinstance(labels, Mapping) or not isinstance(annotations, Mapping)
            or not isinstance(taints, list) or not all(isinstance(t, Mapping) for t in taints)):
        raise BadShape(say.managed_fields_shape("metadata"))
    found: dict[tuple[str, str], HandSet] = {}
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise BadShape(say.managed_fields_shape("managedFields"))
        manager = entry.get("manager")
        if not isinstance(manager, str) or not is_persons_tool(manager):
            continue
        at = parse_time(entry.get("time") if isinstance(entry.get("time"), str) else None)
        fields = entry.get("fieldsV1", {})
        if not isinstance(fields, Mapping):
            raise BadShape(say.managed_fields_shape("fieldsV1"))
        fmeta = fields.get("f:metadata", {})
        if not isinstance(fmeta, Mapping):
            raise BadShape(say.managed_fields_shape("f:metadata"))
        for key in _owned_keys(fmeta.get("f:labels", {}), where="f:labels"):
            if key in labels:
                found[("label", key)] = HandSet(what="label", key=key, value=str(labels[key]), manager=manager, at=at)
        for key in _owned_keys(fmeta.get("f:annotations", {}), where="f:annotations"):
            if key in annotations and key != _LAST_APPLIED:
                found[("annotation", key)] = HandSet(what="annotation", key=key, value=str(annotations[key]),
                                                     manager=manager, at=at)
        fspec = fields.get("f:spec", {})
        if not isinstance(fspec, Mapping):
            raise BadShape(say.managed_fields_shape("f:spec"))
        if "f:taints" in fspec:
            for taint in _owned_taints(fspec["f:taints"], taints):
                text = say.spec_taint_text(str(taint.get("key") or ""), value=taint.get("value"),
                                      effect=str(taint.get("effect") or ""))
                found[("taint", text)] = HandSet(what="taint", key=str(taint.get("key") or ""), value=text,
                                                 manager=manager, at=at)
    order = {"taint": 0, "label": 1, "annotation": 2}
    return tuple(sorted(found.values(), key=lambda h: (order[h.what], h.key, h.value)))


def _owned_taints(owned: object, taints: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The taints a manager owns. The list is atomic on current API servers (one owner
    for all of it: `{}`); older ones keyed each item by key and effect."""
    if not isinstance(owned, Mapping):
        raise BadShape(say.managed_fields_shape("f:taints"))
    items = [k for k in owned if isinstance(k, str) and k.startswith("k:")]
    if not items:
        return list(taints)
    keys = set()
    for item in items:
        try:
            ident = json.loads(item[2:])
        except ValueError as err:
            raise BadShape(say.managed_fields_shape("f:taints")) from err
        if isinstance(ident, Mapping):
            keys.add((ident.get("key"), ident.get("effect")))
    return [t for t in taints if (t.get("key"), t.get("effect")) in keys]


def covering_budgets(pods: Sequence[GpuPod], budgets: Sequence[DisruptionBudget]) -> dict[str, tuple[str, ...]]:
    """Per GPU pod, the budgets whose matchLabels select it (a budget with
    matchExpressions is named only if its matchLabels select the pod, marked as such)."""
    covering: dict[str, tuple[str, ...]] = {}
    for pod in pods:
        names = []
        for budget in budgets:
            if budget.namespace == pod.namespace and all(pod.labels.get(k) == v for k, v in budget.selector.items()):
                names.append(say.budget_text(budget.name, expressions=budget.has_expressions,
                                             allowed=budget.disruptions_allowed))
        covering[pod.ref] = tuple(sorted(names))
    return covering


def read_node_detail(reads: NodeReads, node: str, pods: Sequence[GpuPod], *,
                     deadline: float = READ_DEADLINE) -> NodeDetail:
    """Both reads at once, within `deadline` seconds together."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpuops-node-detail")
    try:
        node_read: concurrent.futures.Future[Any] = pool.submit(reads.get_node_json, node)
        budget_reads: dict[str, concurrent.futures.Future[Any]] = {
            ns: pool.submit(reads.list_disruption_budgets, ns) for ns in sorted({p.namespace for p in pods})}
        concurrent.futures.wait([node_read, *budget_reads.values()], timeout=deadline)
    finally:
        # A read still under way is left to finish on its own; its answer is not waited for.
        pool.shutdown(wait=False, cancel_futures=True)

    hand_set, hand_unknown = _outcome(node_read, lambda raw: hand_set_fields(raw), deadline=deadline)
    budgets: list[DisruptionBudget] = []
    budgets_unknown = None
    for namespace, read in budget_reads.items():
        listed, unknown = _outcome(read, lambda found: list(found), deadline=deadline)
        if listed is None:
            budgets_unknown = say.budgets_unknown(namespace, unknown or "")
            break
        budgets.extend(listed)
    return NodeDetail(hand_set=hand_set, hand_set_unknown=hand_unknown,
                      budgets=None if budgets_unknown else covering_budgets(pods, budgets),
                      budgets_unknown=budgets_unknown)


def _outcome(read: concurrent.futures.Future[Any], use: Callable[[Any], _T], *,
             deadline: float) -> tuple[_T | None, str | None]:
    if not read.done():
        return None, say.read_late(deadline)
    try:
        return use(read.result()), None
    except KubeError as err:
        return None, say.read_failed(str(err))
    except BadShape as err:
        return None, str(err)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        # The gateway's own reading of an answer shaped otherwise (a budget without a name).
        return None, say.answer_shape(repr(err))
