"""HTTP to Prometheus (instant queries through `/api/v1/query`, range queries through
`/api/v1/query_range`) and to an exporter's
`/metrics`: one request function owns the deadline (the whole answer within the
endpoint's timeout, `fetching`), the size cap, the authentication and the mapping of
failures to `PrometheusUnavailable`. Credentials are read from their files on every
request, so a rotated token is used without a restart, and never appear in an error."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import urllib.error
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from workflows.prometheus import fetching
from workflows.prometheus.fetching import Deadline
from workflows.prometheus.samples import Sample, from_exposition, from_vector


# signals.max_answer_mb's default: a dcgm-exporter page is tens of kB, Prometheus's answer
# about a few hundred GPU nodes a few MB.
DEFAULT_MAX_ANSWER_BYTES = 8_000_000


class PrometheusUnavailable(Exception):
    """Prometheus (or an exporter) gave no usable answer; `reason` says why in words."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class PrometheusUnreachable(PrometheusUnavailable):
    """No HTTP answer at all: refused, unresolvable, timed out, TLS failed."""


class PrometheusTimedOut(PrometheusUnreachable):
    """The answer was not in, whole, by the deadline: the endpoint's timeout, or (with
    `cut_by_reading`) the earlier deadline of the whole reading it was part of."""

    def __init__(self, url: str, reason: str, *, cut_by_reading: bool) -> None:
        super().__init__(url, reason)
        self.cut_by_reading = cut_by_reading


class PrometheusRefused(PrometheusUnavailable):
    """An HTTP answer other than 200 (401/403: the credentials; 5xx: the server)."""

    def __init__(self, url: str, reason: str, *, status: int) -> None:
        super().__init__(url, reason)
        self.status = status


class PrometheusQueryFailed(PrometheusUnavailable):
    """Prometheus answered, but not with a vector of samples (a bad query, an error)."""


class PrometheusTooLarge(PrometheusUnavailable):
    """The answer is longer than the endpoint's `max_answer_bytes` (it was not read on)."""


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
    # The whole answer (connect, TLS, headers, body) must be in within it.
    timeout_seconds: float = 5.0
    # The longest answer read; a longer one is refused, not read on.
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES

    @property
    def shown_url(self) -> str:
        """The URL without any user:password in it, for messages and logs."""
        parts = urllib.parse.urlsplit(self.url)
        if parts.username is None and parts.password is None:
            return self.url
        # An address may name credentials and no host ("http://user:pw@:9090").
        host = parts.hostname or ""
        return urllib.parse.urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))

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


def _get(endpoint: Endpoint, url: str, deadline: Deadline | None) -> bytes:
    """The answer's body, whole, by the endpoint's timeout (or the earlier `deadline`)."""
    own = Deadline.within(endpoint.timeout_seconds)
    # NB: a reading's deadline set just before this, with the same timeout, is this one.
    cut = deadline is not None and deadline.at < own.at - 0.05
    deadline = own.earlier(deadline)
    late = ("did not answer within the time left to the whole reading" if cut
            else f"did not answer within {endpoint.timeout_seconds:g} s")
    shown = endpoint.shown_url
    try:
        context = ssl.create_default_context(cafile=str(endpoint.ca_file)) if endpoint.ca_file else None
        return fetching.get_bytes(url, headers=endpoint._headers(), context=context, deadline=deadline,
                            max_bytes=endpoint.max_answer_bytes)
    except fetching.Refused as err:
        detail = ""
        try:
            body = json.loads(err.body or b"{}")
            said = body.get("error") if isinstance(body, dict) else None
            detail = f": {said[:300]}" if isinstance(said, str) and said else ""
        except (ValueError, RecursionError):
            pass
        raise PrometheusRefused(shown, f"answered HTTP {err.status} {err.reason}{detail}", status=err.status) from None
    except fetching.DeadlinePassed:
        raise PrometheusTimedOut(shown, late, cut_by_reading=cut) from None
    except fetching.AnswerTooLarge as err:
        raise PrometheusTooLarge(shown, f"answered more than {_megabytes(err.max_bytes)}, the most gpuops reads "
                                        "(signals.max_answer_mb)") from None
    except urllib.error.URLError as err:
        reason = err.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise PrometheusTimedOut(shown, late, cut_by_reading=cut) from None
        text = getattr(reason, "strerror", None) or str(reason)
        raise PrometheusUnreachable(shown, f"cannot be reached ({text})") from None
    except http.client.HTTPException as err:
        raise PrometheusUnreachable(shown, f"answered something other than HTTP ({type(err).__name__})") from None
    except TimeoutError:
        raise PrometheusTimedOut(shown, late, cut_by_reading=cut) from None
    except OSError as err:
        raise PrometheusUnreachable(shown, f"cannot be reached ({err.strerror or err})") from None
    except ValueError as err:
        raise PrometheusUnreachable(shown, f"answered something gpuops cannot read ({str(err)[:200]})") from None


def _megabytes(size: int) -> str:
    return f"{size / 1_000_000:g} MB"


def instant_query(endpoint: Endpoint, promql: str, *, deadline: Deadline | None = None) -> tuple[Sample, ...]:
    """The samples an instant query returns now (a vector; anything else is an error).
    A series of a shape gpuops does not expect is a sample whose `problem` says so."""
    url = endpoint.url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    raw = _get(endpoint, url, deadline)
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        raise PrometheusQueryFailed(endpoint.shown_url, "answered with something other than JSON "
                                                  "(is this Prometheus's address?)") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        said = error[:300] if isinstance(error, str) and error else "no reason given"
        raise PrometheusQueryFailed(endpoint.shown_url, f"refused the query: {said}")
    data = answer.get("data")
    kind = data.get("resultType") if isinstance(data, dict) else None
    if not isinstance(data, dict) or kind != "vector":
        shown = f"a {kind[:40]!r}" if isinstance(kind, str) else "no result type"
        raise PrometheusQueryFailed(endpoint.shown_url, f"answered {shown}, not a vector")
    result = data.get("result")
    if result is None:
        return ()
    if not isinstance(result, list):
        raise PrometheusQueryFailed(endpoint.shown_url, "answered a vector gpuops cannot read (no list of series)")
    return from_vector(result)


def scrape(endpoint: Endpoint, *, names: tuple[str, ...] | None = None,
           deadline: Deadline | None = None) -> tuple[Sample, ...]:
    """An exporter's `/metrics` page (the endpoint's URL is the page's), as samples."""
    raw = _get(endpoint, endpoint.url, deadline)
    try:
        return from_exposition(raw.decode("utf-8", errors="replace"), names=names)
    except (ValueError, IndexError, KeyError, TypeError) as err:
        raise PrometheusQueryFailed(endpoint.shown_url, f"is not a metrics page: {str(err)[:200]}") from None


@dataclass(frozen=True, slots=True)
class RangeSeries:
    """One series of a range query: its labels and its (unix time, value) points, oldest first."""

    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]


def range_query(endpoint: Endpoint, promql: str, *, start: float, end: float, step: float,
                deadline: Deadline | None = None) -> tuple[RangeSeries, ...]:
    """The series a range query (`/api/v1/query_range`, unix times in seconds) returns; a
    point whose value is not a number is left out."""
    query = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    raw = _get(endpoint, endpoint.url.rstrip("/") + "/api/v1/query_range?" + urllib.parse.urlencode(query), deadline)
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        raise PrometheusQueryFailed(endpoint.shown_url, "answered with something other than JSON "
                                                  "(is this Prometheus's address?)") from None
    data = answer.get("data") if isinstance(answer, dict) and answer.get("status") == "success" else None
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        error = answer.get("error") if isinstance(answer, dict) else None
        said = error[:300] if isinstance(error, str) and error else "not a matrix"
        raise PrometheusQueryFailed(endpoint.shown_url, f"refused the range query: {said}")
    series = []
    for item in data["result"]:
        if not isinstance(item, dict) or not isinstance(item.get("values"), list):
            continue
        labels = {k: v for k, v in (item.get("metric") or {}).items() if isinstance(k, str) and isinstance(v, str)}
        points = []
        for pair in item["values"]:
            try:
                at, value = float(pair[0]), float(pair[1])
            except (TypeError, ValueError, IndexError, OverflowError):
                continue
            if value == value:  # NaN is no number of GPUs
                points.append((at, value))
        series.append(RangeSeries(labels=labels, points=tuple(points)))
    return tuple(series)
