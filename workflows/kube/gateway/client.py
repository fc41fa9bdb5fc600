"""The connection to one API server and the one request function: the client built from
a kubeconfig or the in-cluster ServiceAccount, retries with backoff and Retry-After,
each call's deadline, HTTP errors as the typed tree of `workflows.kube.errors`, and the
observer told of every call. The only module of gpuops that imports the kubernetes
client."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from workflows.kube.errors import KubeError, TooManyRequests, Unavailable, error_for_status
from workflows.kube.gateway.decoding import Json, loads

log = logging.getLogger("gpuops.kube")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 5.0


# Retries are `KubeClient._fetch`'s alone: urllib3's own (three by default) would each
# log a warning and multiply the waits.
_NO_URLLIB3_RETRIES = False


# Told of every API call (verb, status code or "error", seconds to the response's
# headers): the process's metrics (bot.metrics). One per process, like the metrics.
_call_observer: Callable[[str, str, float], None] | None = None


def observe_kube_calls(observer: Callable[[str, str, float], None] | None) -> None:
    """Tell `observer` of every Kubernetes API call this process makes (None: nobody)."""
    global _call_observer
    _call_observer = observer


class KubeClient:
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
    def connect(cls, *, kubeconfig: str | Path | None = None, context: str | None = None) -> Self:
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

    def close_idle_connections(self) -> None:
        self._api.rest_client.pool_manager.clear()

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
            raise error_for_status(err.status or 0, err.body or err.reason or "", method=method, path=path,
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
                error = error_for_status(response.status, data, method=method, path=path, headers=response.headers)
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
