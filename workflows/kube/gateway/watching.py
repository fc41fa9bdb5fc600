"""Watches: the events after a resourceVersion, each object a raw JSON dict or decoded
into a wire schema, with deadlines that tell a dead connection from a quiet one. The
watch cache (`workflows.fleet.watchcache`) lists, then watches through here."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import urllib3

from workflows.kube.errors import Gone, Unavailable, WatchError, error_for_status
from workflows.kube.gateway.client import KubeClient
from workflows.kube.gateway.decoding import loads, object_reader, watch_event

log = logging.getLogger("gpuops.kube")

# Seconds a watch's answer may take (the API server answers a watch at once, before any
# event), and seconds its stream may say nothing: the API server's watch cache sends a
# bookmark about every minute, so a longer silence is a dead connection.
WATCH_ANSWER_TIMEOUT = 30.0
WATCH_IDLE_TIMEOUT = 90.0


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK
    object: Any  # a JSON dict, or a schema instance when watched with a schema


def _read_timeout(response: urllib3.BaseHTTPResponse, seconds: float) -> None:
    """Each later read of `response`'s stream waits at most `seconds` (urllib3 set the
    socket's timeout to the request's, which was for the answer)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(seconds)


class KubeWatches(KubeClient):
    """The gateway's watches."""

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
        read_object = object_reader(path, schema)
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
                raise error_for_status(response.status, response.read(), method="WATCH", path=path,
                                       headers=response.headers)
            _read_timeout(response, min(idle_timeout, timeout_seconds + 15))
            buffer = b""
            for chunk in response.stream(amt=None, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = watch_event(line, path)
                    if event.type == "ERROR":
                        status = loads(memoryview(event.object))
                        error = error_for_status(int(status.get("code") or 500), json.dumps(status),
                                                 method="WATCH", path=path, headers={})
                        if isinstance(error, Gone):
                            raise error
                        raise WatchError(str(error), status=error.status, reason=error.reason,
                                         api_message=error.api_message)
                    yield WatchEvent(type=event.type, object=read_object(event.object))
        except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError, OSError) as err:
            log.debug("watch %s ended: %s", path, err)
        finally:
            response.release_conn()
