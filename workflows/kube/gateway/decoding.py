"""API answers into what gpuops works on: bytes of a list page, an object or a watch
event decoded straight into the schemas of `workflows.kube.wire` (or read as plain
dicts), and JSON into the frozen views of `workflows.kube.objects`. Big answers are read
with the cyclic garbage collector paused (`gc_paused`)."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import msgspec
import orjson

from workflows.kube import wire
from workflows.kube.errors import KubeError
from workflows.kube.objects import (
    CustomObject,
    DisruptionBudget,
    DriverTemplate,
    LeaseRecord,
    NodeObject,
    PodObject,
    PodOnNode,
)

Json = dict[str, Any]
Wire = TypeVar("Wire", bound=msgspec.Struct)


# A list page of 500 nodes is ~1.5 MB of JSON and becomes ~100,000 small objects, and a
# cold cache makes a million. The cyclic garbage collector would walk the growing heap
# again and again while they are made (nothing here builds cycles), so it waits.
_QUIET_GC_BYTES = 64 * 1024


_gc_lock = threading.Lock()
_gc_pauses = 0  # pauses under way, in any thread
_gc_resume = False  # whether collection was on when the first of them began


@contextlib.contextmanager
def gc_paused(*, keep: bool = False) -> Iterator[None]:
    """No cyclic garbage collection inside (reference counting still frees memory).
    Process-wide and counted: collection resumes when the last pause under way ends
    (several clusters' caches start side by side), and only if it was on before.

    `keep`: what was made inside lives as long as the process (a cache's initial
    contents): it is frozen (`gc.freeze`) as this pause ends, so no collection walks it
    again, the first one after the pauses included. NB: each `keep` pause freezes at its
    own end: a cache that finishes after another was frozen is frozen too (before, the
    second of two overlapping starts froze nothing, and its ~50,000 objects a 5,000-node
    cluster were walked by every collection a render set off)."""
    global _gc_pauses, _gc_resume
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            if keep:
                gc.freeze()
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_resume:
                gc.enable()


def loads(data: bytes | str | memoryview) -> Any:
    """Parse an API answer (orjson: about twice json's speed on list pages)."""
    if len(data) < _QUIET_GC_BYTES:
        return orjson.loads(data)
    with gc_paused():
        return orjson.loads(data)


# --- bytes -> schemas ---------------------------------------------------------------------

_EVENT = msgspec.json.Decoder(wire.WatchEventWire)


@functools.lru_cache(maxsize=None)
def _decoder(schema: type[msgspec.Struct] | None, *, page: bool) -> msgspec.json.Decoder | None:
    if schema is None:
        return None
    return msgspec.json.Decoder(wire.ListPageWire[schema] if page else schema)  # type: ignore[valid-type]  # the item schema is chosen at run time


def _decode(decoder: msgspec.json.Decoder, data: bytes, path: str) -> Any:
    """`data`, an answer from `path`, through `decoder`; KubeError when it does not fit."""
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as err:
        raise KubeError(f"unreadable answer from {path}: {err}") from None


def watch_event(line: bytes, path: str) -> wire.WatchEventWire:
    """One line of a watch's stream from `path` (its object still undecoded)."""
    return _decode(_EVENT, line, path)


def page_reader(path: str, schema: type[msgspec.Struct] | None) -> Callable[[bytes], tuple[list[Any], str | None, str]]:
    """bytes of one list page -> (items, continue token, resourceVersion)."""
    decoder = _decoder(schema, page=True)
    if decoder is None:
        def read_json(data: bytes) -> tuple[list[Any], str | None, str]:
            page = loads(data)
            meta = page.get("metadata") or {}
            return page.get("items") or [], meta.get("continue"), meta.get("resourceVersion", "")
        return read_json

    def read_typed(data: bytes) -> tuple[list[Any], str | None, str]:
        page = _decode(decoder, data, path)
        meta = wire.list_meta_of(page)
        return page.items or [], meta.continue_, meta.resourceVersion or ""
    return read_typed


def object_reader(path: str, schema: type[msgspec.Struct] | None) -> Callable[[bytes], Any]:
    """bytes of one object -> a plain dict, or an instance of `schema`."""
    decoder = _decoder(schema, page=False)
    if decoder is None:
        return lambda data: loads(memoryview(data))
    return lambda data: _decode(decoder, data, path)


# --- JSON -> views ------------------------------------------------------------------------


def _time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def convert(obj: Json, schema: type[Wire]) -> Wire:
    """A JSON dict as an instance of `schema`; KubeError when it does not fit."""
    try:
        if schema is wire.PodWire:
            # NB: a pod's scheduling fields are kept as raw JSON (wire.PodSpecWire), which
            # msgspec.convert cannot make from a dict: decode the JSON text instead.
            return msgspec.json.decode(orjson.dumps(obj), type=schema)
        return msgspec.convert(obj, schema)
    except msgspec.ValidationError as err:
        raise KubeError(f"unexpected {schema.__name__.removesuffix('Wire')} from the API: {err}") from None


def node_from_json(obj: Json) -> NodeObject:
    return wire.node_view(convert(obj, wire.NodeWire))


def pod_from_json(obj: Json) -> PodObject:
    return wire.pod_view(convert(obj, wire.PodWire))


def custom_object_from_json(obj: Json) -> CustomObject:
    return wire.custom_object_view(convert(obj, wire.CustomObjectWire))


def driver_template_from_json(obj: Json) -> DriverTemplate:
    return wire.driver_template_view(convert(obj, wire.DaemonSetWire))


def pod_on_node_from_json(obj: Json) -> PodOnNode:
    visible: str | None = None
    spec = obj.get("spec") or {}
    for container in list(spec.get("initContainers") or ()) + list(spec.get("containers") or ()):
        for env in container.get("env") or ():
            if env.get("name") == "NVIDIA_VISIBLE_DEVICES" and env.get("value") is not None:
                visible = str(env["value"])
    return PodOnNode(pod=pod_from_json(obj), uid=obj["metadata"].get("uid", ""), visible_devices=visible)


def lease_from_json(obj: Json) -> LeaseRecord:
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    return LeaseRecord(
        namespace=meta.get("namespace", ""), name=meta["name"], holder=spec.get("holderIdentity") or None,
        duration_seconds=int(duration) if duration is not None else None,
        acquire_time=_time(spec.get("acquireTime")), renew_time=_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0), resource_version=meta.get("resourceVersion", ""),
    )


def disruption_budget_from_json(obj: Json) -> DisruptionBudget:
    meta = obj["metadata"]
    selector = (obj.get("spec") or {}).get("selector") or {}
    return DisruptionBudget(
        namespace=meta.get("namespace", ""), name=meta["name"],
        selector=wire.frozen_map(selector.get("matchLabels")),
        # matchExpressions are not evaluated by the preview; say so rather than guess.
        has_expressions=bool(selector.get("matchExpressions")),
        disruptions_allowed=int((obj.get("status") or {}).get("disruptionsAllowed") or 0),
    )
