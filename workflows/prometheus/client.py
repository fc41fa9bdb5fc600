"""HTTP to Prometheus (instant queries through `/api/v1/query`) and to an exporter's
`/metrics`: one request function owns the timeout, the authentication and the mapping of
failures to `PrometheusUnavailable`. Credentials are read from their files on every
request, so a rotated token is used without a restart, and never appear in an error."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from workflows.prometheus.samples import Sample, from_exposition, from_vector


class PrometheusUnavailable(Exception):
    """Prometheus (or an exporter) gave no usable answer; `reason` says why in words."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class PrometheusUnreachable(PrometheusUnavailable):
    """No HTTP answer at all: refused, unresolvable, timed out, TLS failed."""


class PrometheusRefused(PrometheusUnavailable):
    """An HTTP answer other than 200 (401/403: the credentials; 5xx: the server)."""

    def __init__(self, url: str, reason: str, *, status: int) -> None:
        super().__init__(url, reason)
        self.status = status


class PrometheusQueryFailed(PrometheusUnavailable):
    """Prometheus answered, but not with a vector of samples (a bad query, an error)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BasicAuth:
    username: str
    password_file: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """Where Prometheus answers and how to authenticate: at most one of a bearer token
    (a file, as a ServiceAccount token or a mounted Secret) and basic auth."""

    url: str
    bearer_token_file: Path | None = None
    basic_auth: BasicAuth | None = None
    ca_file: Path | None = None
    timeout_seconds: float = 5.0

    @property
    def shown_url(self) -> str:
        """The URL without any user:password in it, for messages and logs."""
        parts = urllib.parse.urlsplit(self.url)
        if parts.username is None and parts.password is None:
            return self.url
        return urllib.parse.urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port
                                                                                   else "")))

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json, text/plain;q=0.9"}
        try:
            if self.bearer_token_file is not None:
                token = self.bearer_token_file.read_text().strip()
                headers["Authorization"] = f"Bearer {token}"
            elif self.basic_auth is not None:
                password = self.basic_auth.password_file.read_text().rstrip("\n")
                pair = f"{self.basic_auth.username}:{password}".encode()
                headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        except OSError as err:
            raise PrometheusUnavailable(self.shown_url, f"cannot read its credentials: {err.strerror or err}") from None
        return headers


def _get(endpoint: Endpoint, url: str) -> bytes:
    request = urllib.request.Request(url, headers=endpoint._headers(), method="GET")
    context = ssl.create_default_context(cafile=str(endpoint.ca_file)) if endpoint.ca_file else None
    shown = endpoint.shown_url
    try:
        with urllib.request.urlopen(request, timeout=endpoint.timeout_seconds, context=context) as answer:
            return answer.read()
    except urllib.error.HTTPError as err:
        detail = ""
        try:
            body = json.loads(err.read() or b"{}")
            detail = f": {body.get('error')}" if isinstance(body, dict) and body.get("error") else ""
        except ValueError:
            pass
        raise PrometheusRefused(shown, f"answered HTTP {err.code} {err.reason}{detail}", status=err.code) from None
    except urllib.error.URLError as err:
        reason = err.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise PrometheusUnreachable(shown, f"did not answer within {endpoint.timeout_seconds:g} s") from None
        text = getattr(reason, "strerror", None) or str(reason)
        raise PrometheusUnreachable(shown, f"cannot be reached ({text})") from None
    except (TimeoutError, socket.timeout):
        raise PrometheusUnreachable(shown, f"did not answer within {endpoint.timeout_seconds:g} s") from None
    except OSError as err:
        raise PrometheusUnreachable(shown, f"cannot be reached ({err.strerror or err})") from None


def instant_query(endpoint: Endpoint, promql: str) -> tuple[Sample, ...]:
    """The samples an instant query returns now (a vector; anything else is an error)."""
    url = endpoint.url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    raw = _get(endpoint, url)
    try:
        answer = json.loads(raw)
    except ValueError:
        raise PrometheusQueryFailed(endpoint.shown_url, "answered with something other than JSON "
                                                  "(is this Prometheus's address?)") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        raise PrometheusQueryFailed(endpoint.shown_url, f"refused the query: {error or 'no reason given'}")
    data = answer.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusQueryFailed(endpoint.shown_url, f"answered a {data.get('resultType')!r}, not a vector")
    try:
        return from_vector(data.get("result") or ())
    except (KeyError, IndexError, TypeError, ValueError):
        raise PrometheusQueryFailed(endpoint.shown_url, "answered a vector gpuops cannot read") from None


def scrape(endpoint: Endpoint, *, names: tuple[str, ...] | None = None) -> tuple[Sample, ...]:
    """An exporter's `/metrics` page (the endpoint's URL is the page's), as samples."""
    raw = _get(endpoint, endpoint.url)
    try:
        return from_exposition(raw.decode("utf-8", errors="replace"), names=names)
    except ValueError as err:
        raise PrometheusQueryFailed(endpoint.shown_url, f"is not a metrics page: {err}") from None
