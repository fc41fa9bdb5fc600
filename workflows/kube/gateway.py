"""The Kubernetes gateway: the only module (with the watch cache beside it) that talks
to the API server. One request function owns retries, backoff and Retry-After; HTTP
errors become a small typed exception tree; JSON becomes the frozen views of
`workflows.kube.objects`. Lists and watches read raw JSON (no per-object model classes):
as plain dicts, or decoded straight into the schemas of `workflows.kube.wire`, which read
only what gpuops uses and keep a 5,000-node list fast.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime as dt
import functools
import gc
import json
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import orjson
import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from workflows.kube import wire
from workflows.kube.errors import (
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    TooManyRequests,
    Unavailable,
    WatchError,
)
from workflows.kube.objects import (
    CustomObject,
    DisruptionBudget,
    DriverTemplate,
    NodeObject,
    PodObject,
    ResourceQuotaObject,
    Taint,
)

log = logging.getLogger("gpuops.kube")

Json = dict[str, Any]
Wire = TypeVar("Wire", bound=msgspec.Struct)

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
DEPLOYMENTS = "/apis/apps/v1/deployments"
DAEMONSETS = "/apis/apps/v1/daemonsets"
CLUSTER_POLICIES = "/apis/nvidia.com/v1/clusterpolicies"
NVIDIA_DRIVERS = "/apis/nvidia.com/v1alpha1/nvidiadrivers"
RESOURCE_QUOTAS = "/api/v1/resourcequotas"


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


_EVENT = msgspec.json.Decoder(wire.WatchEventWire)


@functools.lru_cache(maxsize=None)
def _decoder(schema: type[msgspec.Struct] | None, *, page: bool) -> msgspec.json.Decoder | None:
    if schema is None:
        return None
    return msgspec.json.Decoder(wire.ListPageWire[schema] if page else schema)  # type: ignore[valid-type]  # the item schema is chosen at run time


def _decode(decoder: msgspec.json.Decoder, data: bytes, path: str) -> Any:
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as err:
        raise KubeError(f"unreadable answer from {path}: {err}") from None


def _page_reader(path: str, schema: type[msgspec.Struct] | None) -> Callable[[bytes], tuple[list[Any], str | None, str]]:
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


def _object_reader(path: str, schema: type[msgspec.Struct] | None) -> Callable[[bytes], Any]:
    decoder = _decoder(schema, page=False)
    if decoder is None:
        return lambda data: loads(memoryview(data))
    return lambda data: _decode(decoder, data, path)


# Seconds a watch's answer may take (the API server answers a watch at once, before any
# event), and seconds its stream may say nothing: the API server's watch cache sends a
# bookmark about every minute, so a longer silence is a dead connection.
WATCH_ANSWER_TIMEOUT = 30.0
WATCH_IDLE_TIMEOUT = 90.0


def _read_timeout(response: urllib3.BaseHTTPResponse, seconds: float) -> None:
    """Each later read of `response`'s stream waits at most `seconds` (urllib3 set the
    socket's timeout to the request's, which was for the answer)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(seconds)


_BY_STATUS: dict[int, type[KubeError]] = {403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone, 422: Invalid}


def _error(status: int, body: bytes | str, *, method: str, path: str, headers: Mapping[str, str]) -> KubeError:
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    message, reason, causes = text, "", set()
    try:
        status_obj = json.loads(text)
        message = status_obj.get("message") or text
        reason = status_obj.get("reason") or ""
        causes = {str(c.get("type")) for c in (status_obj.get("details") or {}).get("causes") or ()}
    except (ValueError, AttributeError, TypeError):
        pass
    where = f"{method} {path}"
    if status == 429:
        # NB: the Eviction API names a refusing budget as a DisruptionBudget cause (and in
        # its message); a 429 without it is the server asking to slow down, not a budget.
        budget = "DisruptionBudget" in causes or "disruption budget" in message.lower()
        return TooManyRequests(f"{where}: {message}", retry_after=_retry_after(headers), status=429, reason=reason,
                               api_message=message, disruption_budget=budget)
    if status >= 500:
        return Unavailable(f"{where}: {message}", status=status, reason=reason)
    return _BY_STATUS.get(status, KubeError)(f"{where}: {message}", status=status, reason=reason,
                                             api_message=message)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After") if headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# --- the gateway --------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 5.0


@dataclass(frozen=True)
class ListResult:
    items: list[Any]  # JSON dicts, or schema instances when listed with a schema
    resource_version: str


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK
    object: Any  # a JSON dict, or a schema instance when watched with a schema


@dataclass(frozen=True, slots=True)
class PodOnNode:
    """A pod bound to a node, with what deciding on its eviction needs beyond `PodObject`."""

    pod: PodObject
    uid: str
    # NVIDIA_VISIBLE_DEVICES as a container's env sets it literally, if any: the NVIDIA
    # container runtime then hands the pod GPUs without any resource request.
    visible_devices: str | None


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A coordination.k8s.io/v1 Lease as leader election reads and writes it."""

    namespace: str
    name: str
    holder: str | None
    duration_seconds: int | None
    acquire_time: dt.datetime | None
    renew_time: dt.datetime | None
    transitions: int
    resource_version: str


def _leases(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


# Retries are `KubeGateway._fetch`'s alone: urllib3's own (three by default) would each
# log a warning and multiply the waits.
_NO_URLLIB3_RETRIES = False


# Told of every API call (verb, status code or "error", seconds to the response's
# headers): the process's metrics (bot.metrics). One per process, like the metrics.
_call_observer: Callable[[str, str, float], None] | None = None


def observe_calls(observer: Callable[[str, str, float], None] | None) -> None:
    """Tell `observer` of every Kubernetes API call this process makes (None: nobody)."""
    global _call_observer
    _call_observer = observer


class KubeGateway:
    """One authenticated connection to an API server.

    Reads are retried on connection errors, 429 (honouring Retry-After) and 5xx; writes
    are retried only on 429, which the server sends before doing anything.
    """

    def __init__(self, api: client.ApiClient, *, identity: str, retry: RetryPolicy = RetryPolicy(),
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._api = api
        self.identity = identity
        self._retry = retry
        self._sleep = sleep

    @classmethod
    def connect(cls, *, kubeconfig: str | Path | None = None, context: str | None = None) -> KubeGateway:
        """From a kubeconfig (explicit, $KUBECONFIG or ~/.kube/config) or, inside a pod,
        the in-cluster ServiceAccount."""
        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ and not os.environ.get("KUBECONFIG"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            configuration.retries = _NO_URLLIB3_RETRIES
            namespace = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            identity = f"system:serviceaccount:{namespace.read_text().strip()}:gpuops" if namespace.exists() else "in-cluster"
            return cls(client.ApiClient(configuration), identity=identity)
        path = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG", str(Path.home() / ".kube/config"))
        if not Path(path).is_file():
            raise KubeError(f"no kubeconfig at {path}: pass --kubeconfig or set KUBECONFIG")
        contexts, current = config.list_kube_config_contexts(config_file=path)
        chosen = next((c for c in contexts if c["name"] == context), None) if context else current
        if chosen is None:
            names = ", ".join(c["name"] for c in contexts)
            raise KubeError(f"kubeconfig {path} has no context {context!r} (it has: {names})")
        configuration = client.Configuration()
        config.load_kube_config(config_file=path, context=chosen["name"], client_configuration=configuration)
        configuration.retries = _NO_URLLIB3_RETRIES
        return cls(client.ApiClient(configuration), identity=chosen["context"].get("user", chosen["name"]))

    @property
    def server(self) -> str:
        return self._api.configuration.host

    def close(self) -> None:
        self._api.close()

    # --- the one request function ------------------------------------------------------
    def _send(self, method: str, path: str, *, query: list[tuple[str, Any]] | None, body: Any,
              content_type: str, timeout: float | tuple[float, float] | None) -> urllib3.BaseHTTPResponse:
        _, url, headers, payload, _ = self._api.param_serialize(
            method=method, resource_path=path, query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"],
        )
        verb = "WATCH" if query and ("watch", "true") in query else method
        started, code = time.monotonic(), "error"
        try:
            response = self._api.call_api(method, url, header_params=headers, body=payload,
                                          _request_timeout=timeout)
            code = str(response.response.status)
        except ApiException as err:  # the REST layer raises for some statuses itself
            code = str(err.status or 0)
            raise _error(err.status or 0, err.body or err.reason or "", method=method, path=path,
                         headers=err.headers or {}) from None
        finally:
            observer = _call_observer
            if observer is not None:
                observer(verb, code, time.monotonic() - started)
        return response.response

    def request(self, method: str, path: str, *, query: list[tuple[str, Any]] | None = None,
                body: Any = None, content_type: str = "application/json",
                timeout: float | tuple[float, float] | None = (5, 60),
                retry_too_many: bool = True) -> Json:
        """One API call, JSON in and out, with retries and typed errors.

        `retry_too_many=False` hands a 429 straight to the caller: an eviction refused by
        a PodDisruptionBudget also answers 429, and waiting on it is the engine's business
        (it must not block here for Retry-After seconds)."""
        data = self._fetch(method, path, query=query, body=body, content_type=content_type, timeout=timeout,
                           retry_too_many=retry_too_many)
        return loads(data) if data else {}

    def _fetch(self, method: str, path: str, *, query: list[tuple[str, Any]] | None = None,
               body: Any = None, content_type: str = "application/json",
               timeout: float | tuple[float, float] | None = (5, 60),
               retry_too_many: bool = True) -> bytes:
        """`request`'s answer as the bytes of a successful response."""
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._send(method, path, query=query, body=body, content_type=content_type,
                                      timeout=timeout)
                data = response.data
                if 200 <= response.status <= 299:
                    return data
                error = _error(response.status, data, method=method, path=path, headers=response.headers)
            except (urllib3.exceptions.HTTPError, OSError) as err:
                error = Unavailable(f"{method} {path}: {err}", status=0)
            except TooManyRequests as err:
                error = err
            retryable = (isinstance(error, TooManyRequests) and retry_too_many) or (
                method == "GET" and isinstance(error, Unavailable)
            )
            if not retryable or attempt >= self._retry.attempts:
                raise error
            delay = min(self._retry.max_delay, self._retry.base_delay * 2 ** (attempt - 1))
            if isinstance(error, TooManyRequests) and error.retry_after is not None:
                delay = min(self._retry.max_delay, error.retry_after)
            # NB: debug only: an unreachable API would otherwise write a line per try; the
            # callers say once that it is lost and once that it is back.
            log.debug("retrying %s %s in %.1fs: %s", method, path, delay, error)
            self._sleep(delay * (1 + random.random() * 0.1))

    def list(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None,
             page_size: int = 500, on_page: Callable[[list[Any]], None] | None = None,
             schema: type[msgspec.Struct] | None = None) -> ListResult:
        """Every item of a collection, page by page, as raw JSON dicts or, with `schema`
        (see `workflows.kube.wire`), decoded straight into that schema.

        With `on_page`, each page is handed over as it arrives while the next one is
        being fetched (the server's work overlaps ours), and `items` comes back empty."""
        read_page = _page_reader(path, schema)
        pages: queue.Queue[list[Any] | None] = queue.Queue(maxsize=2)
        consumer: threading.Thread | None = None
        failure: list[BaseException] = []
        if on_page is not None:
            def consume() -> None:
                while (page_items := pages.get()) is not None:
                    if not failure:
                        try:
                            on_page(page_items)
                        except BaseException as err:  # noqa: BLE001 - re-raised below
                            failure.append(err)
            consumer = threading.Thread(target=consume, name=f"list{path}", daemon=True)
            consumer.start()
        items: list[Any] = []
        token: str | None = None
        try:
            while True:
                query: list[tuple[str, Any]] = [("limit", page_size)]
                if label_selector:
                    query.append(("labelSelector", label_selector))
                if field_selector:
                    query.append(("fieldSelector", field_selector))
                if token:
                    query.append(("continue", token))
                try:
                    page_items, token, version = read_page(self._fetch("GET", path, query=query))
                except Gone:
                    if consumer is not None:
                        raise  # pages already handed over cannot be taken back
                    # The continue token expired between pages: start over for a consistent list.
                    items, token = [], None
                    continue
                if consumer is not None:
                    pages.put(page_items)
                else:
                    items.extend(page_items)
                if not token:
                    return ListResult(items=items, resource_version=version)
        finally:
            if consumer is not None:
                pages.put(None)
                consumer.join()
                if failure:
                    raise failure[0]

    def watch(self, path: str, *, resource_version: str, timeout_seconds: int = 300,
              label_selector: str | None = None, field_selector: str | None = None,
              on_open: Callable[[urllib3.BaseHTTPResponse], None] | None = None,
              schema: type[msgspec.Struct] | None = None, answer_timeout: float = WATCH_ANSWER_TIMEOUT,
              idle_timeout: float = WATCH_IDLE_TIMEOUT) -> Iterator[WatchEvent]:
        """Events after `resource_version` until the server ends the watch, each object
        a raw JSON dict or, with `schema`, decoded into it. Raises Gone when that version
        is too old and WatchError when the server ends the watch with another error
        event (either way the caller lists again). `on_open` receives the open response, whose
        `shutdown()` ends the watch from another thread.

        A server that has not answered within `answer_timeout` seconds, or a stream silent
        for `idle_timeout` (no event, no bookmark), is a dead connection (a half-open one
        behind a proxy or NAT): the first raises Unavailable, the second ends the watch,
        and the caller resumes from its last version instead of waiting out the watch's
        whole `timeout_seconds` on a connection that will never speak."""
        read_object = _object_reader(path, schema)
        query: list[tuple[str, Any]] = [
            ("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", timeout_seconds),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        try:
            response = self._send("GET", path, query=query, body=None, content_type="application/json",
                                  timeout=(5, answer_timeout))
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise Unavailable(f"watch {path}: {err}") from None
        if on_open is not None:
            on_open(response)
        try:
            if not 200 <= response.status <= 299:
                raise _error(response.status, response.read(), method="WATCH", path=path, headers=response.headers)
            _read_timeout(response, min(idle_timeout, timeout_seconds + 15))
            buffer = b""
            for chunk in response.stream(amt=None, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = _decode(_EVENT, line, path)
                    if event.type == "ERROR":
                        status = loads(memoryview(event.object))
                        error = _error(int(status.get("code") or 500), json.dumps(status), method="WATCH",
                                       path=path, headers={})
                        if isinstance(error, Gone):
                            raise error
                        raise WatchError(str(error), status=error.status, reason=error.reason,
                                         api_message=error.api_message)
                    yield WatchEvent(type=event.type, object=read_object(event.object))
        except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError, OSError) as err:
            log.debug("watch %s ended: %s", path, err)
        finally:
            response.release_conn()

    def close_idle_connections(self) -> None:
        self._api.rest_client.pool_manager.clear()

    # --- reads the engine needs fresh (not from the cache) -----------------------------
    def get_node(self, name: str) -> NodeObject:
        return node_from_json(self.request("GET", f"{NODES}/{name}"))

    def get_node_json(self, name: str) -> Json:
        """Node `name` as the API server sends it, managedFields included (the watch
        cache keeps neither them nor its taints' owners); for `/gpu node`."""
        return self.request("GET", f"{NODES}/{name}", timeout=(3, 5))

    def server_version(self) -> str | None:
        """The API server's version (`GET /version`, its gitVersion such as "v1.31.4"),
        which every identity may read; None when it names none."""
        version = self.request("GET", "/version").get("gitVersion")
        return version if isinstance(version, str) and version else None

    def may(self, verb: str, resource: str, *, group: str = "", namespace: str | None = None) -> bool:
        """Whether this identity may `verb` `resource` (in `namespace`; None: in every
        namespace), as the API server's authorizer answers (a SelfSubjectAccessReview,
        which every authenticated identity may ask)."""
        attributes: dict[str, str] = {"verb": verb, "resource": resource, "group": group}
        if namespace is not None:
            attributes["namespace"] = namespace
        answer = self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes}})
        return bool((answer.get("status") or {}).get("allowed"))

    def labels_with_owners(self, name: str) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Node `name`'s labels, each with the field managers that own it: label ->
        (value, managers), from the managedFields the watch cache does not keep."""
        found = self.request("GET", f"{NODES}/{name}")
        meta = found.get("metadata") or {}
        owners: dict[str, set[str]] = {}
        for entry in meta.get("managedFields") or ():
            fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
            for key in fields:
                if key.startswith("f:"):
                    owners.setdefault(key[2:], set()).add(str(entry.get("manager") or "unknown"))
        return {str(k): (str(v), tuple(sorted(owners.get(k, ())))) for k, v in (meta.get("labels") or {}).items()}

    def list_pods_on_node(self, node: str, *, label_selector: str | None = None) -> builtins.list[PodOnNode]:
        """Every pod bound to `node` (fieldSelector spec.nodeName), in every namespace."""
        result = self.list(PODS, field_selector=f"spec.nodeName={node}", label_selector=label_selector)
        return [pod_on_node_from_json(obj) for obj in result.items]

    def get_pod(self, namespace: str, name: str) -> PodOnNode:
        return pod_on_node_from_json(self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}"))

    def get_cluster_policy(self, name: str) -> CustomObject:
        return self.get_custom_object(CLUSTER_POLICIES, name)

    def get_config_map_data(self, namespace: str, name: str) -> dict[str, str]:
        found = self.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        return {str(k): str(v) for k, v in (found.get("data") or {}).items()}

    def list_gpu_pods(self) -> builtins.list[PodObject]:
        """Every pod in the cluster that asks for a GPU resource (one list, read fresh)."""
        return [pod for pod in (pod_from_json(obj) for obj in self.list(PODS).items) if pod.gpu_requests]

    def list_pods_bound_to(self, node: str) -> builtins.list[PodObject]:
        """Every pod bound to `node`, as the inventory's views (for previews)."""
        return [pod_from_json(obj) for obj in self.list(PODS, field_selector=f"spec.nodeName={node}").items]

    def list_driver_templates(self, namespace: str) -> builtins.list[DriverTemplate]:
        """The driver DaemonSets (app.kubernetes.io/component=nvidia-driver) of `namespace`,
        read fresh: what each would run on the nodes it selects."""
        path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets"
        return [wire.driver_template_view(_convert(obj, wire.DaemonSetWire))
                for obj in self.list(path, label_selector="app.kubernetes.io/component=nvidia-driver").items]

    def list_disruption_budgets(self, namespace: str) -> builtins.list[DisruptionBudget]:
        """The PodDisruptionBudgets of one namespace (policy/v1)."""
        path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
        return [disruption_budget_from_json(obj) for obj in self.list(path).items]

    def list_resource_quotas(self) -> builtins.list[ResourceQuotaObject]:
        """Every ResourceQuota of the cluster that names a GPU resource, its GPU entries
        only (one list, read fresh)."""
        found = (wire.resource_quota_view(q) for q in self.list(RESOURCE_QUOTAS, schema=wire.ResourceQuotaWire).items)
        return [quota for quota in found if quota.hard]

    def get_lease(self, namespace: str, name: str) -> LeaseRecord:
        return lease_from_json(self.request("GET", f"{_leases(namespace)}/{name}"))

    # --- writes ------------------------------------------------------------------------
    # Every write takes `dry_run`: the API server then authorises, validates and admits it
    # (RBAC, webhooks, PodDisruptionBudgets) but persists nothing (query dryRun=All). Each
    # write is logged at INFO as "mutation: <what> <target>" before it is sent, and as
    # "mutation refused: ..." when the server refused it, so the log says exactly what
    # gpuops changed in the cluster.

    def _mutate(self, what: str, target: str, method: str, path: str, *, body: Any, dry_run: bool,
                content_type: str = "application/json", retry_too_many: bool = True,
                quiet: bool = False) -> Json:
        query: list[tuple[str, Any]] = [("dryRun", "All")] if dry_run else []
        say = log.debug if quiet else log.info
        say("mutation: %s %s%s", what, target, " (dry run)" if dry_run else "")
        try:
            return self.request(method, path, query=query, body=body, content_type=content_type,
                                retry_too_many=retry_too_many)
        except KubeError as err:
            # The server refused it (a conflict, a PDB): nothing was changed.
            say("mutation refused: %s %s (%s %s)", what, target, err.status, err.reason)
            raise

    def _patch_node(self, what: str, name: str, *, unschedulable: bool | None = None,
                    labels: Mapping[str, str | None] | None = None,
                    annotations: Mapping[str, str | None] | None = None,
                    taints: Sequence[Taint] | None = None,
                    resource_version: str | None = None, dry_run: bool) -> NodeObject:
        metadata: Json = {}
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        if resource_version:
            # NB: a merge patch that names a resourceVersion applies only to that version
            # (409 otherwise), so a decision made on what was read cannot land on a node
            # someone changed meanwhile.
            metadata["resourceVersion"] = resource_version
        body: Json = {"metadata": metadata}
        spec: Json = {}
        if unschedulable is not None:
            spec["unschedulable"] = unschedulable
        if taints is not None:
            # A merge patch replaces the whole list: exactly these taints afterwards.
            spec["taints"] = [{"key": t.key, "value": t.value or None, "effect": t.effect} for t in taints] or None
        if spec:
            body["spec"] = spec
        return node_from_json(self._mutate(what, f"node {name}", "PATCH", f"{NODES}/{name}", body=body,
                                           dry_run=dry_run, content_type="application/merge-patch+json"))

    def cordon_node(self, name: str, *, annotations: Mapping[str, str | None],
                    resource_version: str | None, dry_run: bool) -> NodeObject:
        """Mark the node unschedulable and set `annotations` (None removes a key), in one patch."""
        return self._patch_node("cordon", name, unschedulable=True, annotations=annotations,
                                resource_version=resource_version, dry_run=dry_run)

    def uncordon_node(self, name: str, *, annotations: Mapping[str, str | None],
                      resource_version: str | None, dry_run: bool) -> NodeObject:
        """Mark the node schedulable and set `annotations` (None removes a key), in one patch."""
        return self._patch_node("uncordon", name, unschedulable=False, annotations=annotations,
                                resource_version=resource_version, dry_run=dry_run)

    def restore_node(self, name: str, *, labels: Mapping[str, str | None], taints: Sequence[Taint],
                     resource_version: str | None, dry_run: bool) -> NodeObject:
        """Set (or remove, None) `labels` and make the node's taints exactly `taints`, in one patch."""
        return self._patch_node("restore", name, labels=labels, taints=taints, resource_version=resource_version,
                                dry_run=dry_run)

    def annotate_node(self, name: str, *, annotations: Mapping[str, str | None],
                      resource_version: str | None, dry_run: bool) -> NodeObject:
        """Set or remove (None) node annotations, leaving schedulability alone."""
        return self._patch_node("annotate", name, annotations=annotations,
                                resource_version=resource_version, dry_run=dry_run)

    def label_node(self, name: str, *, labels: Mapping[str, str | None], dry_run: bool,
                   resource_version: str | None = None,
                   annotations: Mapping[str, str | None] | None = None) -> NodeObject:
        """Set or remove (None) node labels, and `annotations` in the same patch."""
        return self._patch_node("label", name, labels=labels, annotations=annotations,
                                resource_version=resource_version, dry_run=dry_run)

    def get_custom_object(self, path: str, name: str) -> CustomObject:
        """A ClusterPolicy (`CLUSTER_POLICIES`) or NVIDIADriver (`NVIDIA_DRIVERS`), read fresh."""
        return custom_object_from_json(self.request("GET", f"{path}/{name}"))

    def patch_custom_object(self, path: str, name: str, *, spec: Json, resource_version: str | None,
                            dry_run: bool) -> CustomObject:
        """Merge-patch the spec of a ClusterPolicy or NVIDIADriver (never a strategic-merge
        patch: a custom resource has no patch strategy). With `resource_version` the patch
        applies only to that version of the object (409 otherwise)."""
        body: Json = {"spec": spec}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return custom_object_from_json(self._mutate("patch", f"{path.rsplit('/', 1)[-1]} {name}", "PATCH",
                                                    f"{path}/{name}", body=body, dry_run=dry_run,
                                                    content_type="application/merge-patch+json"))

    def evict_pod(self, namespace: str, name: str, *, uid: str, dry_run: bool) -> None:
        """Ask the Eviction API (policy/v1) to remove a pod, so PodDisruptionBudgets apply.

        Raises TooManyRequests (429) at once, without retrying, when a budget does not
        allow the disruption now; Conflict when the pod named is no longer the pod with
        `uid` (it was replaced); NotFound when it is gone."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        self._mutate("evict", f"pod {namespace}/{name} uid={uid}", "POST",
                     f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body=body, dry_run=dry_run,
                     retry_too_many=False)

    def delete_pod(self, namespace: str, name: str, *, uid: str, dry_run: bool,
                   grace_seconds: int | None = None) -> None:
        """Delete a pod (no PodDisruptionBudget applies), only if it is still the pod with
        `uid`: Conflict otherwise, NotFound when it is gone."""
        body: Json = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        self._mutate("delete", f"pod {namespace}/{name} uid={uid}", "DELETE",
                     f"/api/v1/namespaces/{namespace}/pods/{name}", body=body, dry_run=dry_run)

    def create_pod(self, namespace: str, manifest: Json, *, dry_run: bool) -> PodObject:
        """Create a pod from `manifest` (a v1 Pod); Conflict when one of its name exists,
        NotFound when the namespace does not."""
        name = manifest.get("metadata", {}).get("name", "?")
        return pod_from_json(self._mutate("create", f"pod {namespace}/{name}", "POST",
                                          f"/api/v1/namespaces/{namespace}/pods", body=manifest, dry_run=dry_run))

    def create_lease(self, namespace: str, name: str, *, holder: str, duration_seconds: int,
                     at: dt.datetime, dry_run: bool = False) -> LeaseRecord:
        """Create the Lease held by `holder`; Conflict when it exists already."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration_seconds,
                         "acquireTime": _micro_time(at), "renewTime": _micro_time(at),
                         "leaseTransitions": 0}}
        return lease_from_json(self._mutate("create lease", f"{namespace}/{name}", "POST", _leases(namespace),
                                            body=body, dry_run=dry_run, quiet=True))

    def update_lease(self, lease: LeaseRecord, *, dry_run: bool = False) -> LeaseRecord:
        """Replace the Lease with `lease`, only if it is still at `lease.resource_version`
        (Conflict otherwise: someone else wrote it first)."""
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": lease.name, "namespace": lease.namespace,
                             "resourceVersion": lease.resource_version},
                "spec": {"holderIdentity": lease.holder or None,
                         "leaseDurationSeconds": lease.duration_seconds,
                         "acquireTime": _micro_time(lease.acquire_time) if lease.acquire_time else None,
                         "renewTime": _micro_time(lease.renew_time) if lease.renew_time else None,
                         "leaseTransitions": lease.transitions}}
        return lease_from_json(self._mutate("update lease", f"{lease.namespace}/{lease.name}", "PUT",
                                            f"{_leases(lease.namespace)}/{lease.name}", body=body,
                                            dry_run=dry_run, quiet=True))


# --- JSON -> views ------------------------------------------------------------------------


def _time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _convert(obj: Json, schema: type[Wire]) -> Wire:
    try:
        if schema is wire.PodWire:
            # NB: a pod's scheduling fields are kept as raw JSON (wire.PodSpecWire), which
            # msgspec.convert cannot make from a dict: decode the JSON text instead.
            return msgspec.json.decode(orjson.dumps(obj), type=schema)
        return msgspec.convert(obj, schema)
    except msgspec.ValidationError as err:
        raise KubeError(f"unexpected {schema.__name__.removesuffix('Wire')} from the API: {err}") from None


def node_from_json(obj: Json) -> NodeObject:
    return wire.node_view(_convert(obj, wire.NodeWire))


def pod_from_json(obj: Json) -> PodObject:
    return wire.pod_view(_convert(obj, wire.PodWire))


def custom_object_from_json(obj: Json) -> CustomObject:
    return wire.custom_object_view(_convert(obj, wire.CustomObjectWire))


def pod_on_node_from_json(obj: Json) -> PodOnNode:
    visible: str | None = None
    spec = obj.get("spec") or {}
    for container in list(spec.get("initContainers") or ()) + list(spec.get("containers") or ()):
        for env in container.get("env") or ():
            if env.get("name") == "NVIDIA_VISIBLE_DEVICES" and env.get("value") is not None:
                visible = str(env["value"])
    return PodOnNode(pod=pod_from_json(obj), uid=obj["metadata"].get("uid", ""), visible_devices=visible)


def _micro_time(at: dt.datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with microseconds."""
    return at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
