"""A fake Slack Web API on 127.0.0.1: `POST /api/<method>` like slack.com, plus the
`response_url` endpoints Slack hands out with interactions and the URLs files are
uploaded to.

    with FakeSlackWebApi() as fake:
        client = WebClient(token=fake.bot_token, base_url=fake.base_url)
        client.chat_postMessage(channel="C0OPS", text="hi")
        assert fake.last("chat.postMessage").args["text"] == "hi"

Every request is recorded (method, arguments, token, time, answer); tests wait for a
call with `wait_for` (a condition variable, not polling). Failures can be injected per
method (`fail_next`, `rate_limit`) to exercise the bot's retries. What the bot changed
(messages, views, files) is in `fake.workspace`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from testenv.fakeslack import methods
from testenv.fakeslack.methods import MethodContext, SlackError
from testenv.fakeslack.serving import BackgroundServer
from testenv.fakeslack.workspace import Ephemeral, Message, Workspace

log = logging.getLogger("gpuops.testenv.fakeslack")

DEFAULT_BOT_TOKEN = "xoxb-gpuops-test"
DEFAULT_APP_TOKEN = "xapp-1-gpuops-test"

# Arguments that arrive JSON-encoded in a form body; recorded (and handled) decoded.
_JSON_ARGS = ("blocks", "attachments", "view", "files", "metadata")

# Slack's limits on a response_url: 5 uses within 30 minutes.
RESPONSE_URL_USES = 5
RESPONSE_URL_LIFETIME = 30 * 60.0


# status, extra headers, JSON body
_HttpAnswer = tuple[int, dict[str, str], dict[str, Any]]


class SocketModeEndpoint(Protocol):
    def connection_url(self) -> str: ...


@dataclass(frozen=True)
class ApiCall:
    """One request to `/api/<method>` and what the fake answered."""

    method: str
    args: dict[str, Any]
    token: str | None
    at: float
    status: int
    response: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.response.get("ok") is True

    @property
    def error(self) -> str | None:
        return self.response.get("error")


@dataclass(frozen=True)
class ResponseUrlPost:
    """One POST to a response_url and what the fake answered."""

    key: str
    body: dict[str, Any] | None
    at: float
    status: int
    response: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.response.get("ok") is True


@dataclass
class _Failure:
    status: int
    error: str
    retry_after: int | None


@dataclass
class _ResponseUrl:
    key: str
    issued_at: float
    channel: str | None = None
    message_ts: str | None = None
    user: str | None = None
    uses: int = 0
    expired: bool = False


@dataclass
class _Recordings:
    calls: list[ApiCall] = field(default_factory=list)
    posts: list[ResponseUrlPost] = field(default_factory=list)
    failures: dict[str, deque[_Failure]] = field(default_factory=dict)
    response_urls: dict[str, _ResponseUrl] = field(default_factory=dict)


class FakeSlackWebApi:
    """The Web API of one workspace, served on `host:port` (port 0: a free one).

    `bot_token` is the only token the Web API methods accept and `app_token` the only
    one apps.connections.open accepts; anything else is `invalid_auth`, no token is
    `not_authed`. `socket_mode` (or `attach_socket_mode`) is the server whose URL
    apps.connections.open hands out. `clock` is read only for call times and
    response_url lifetimes.
    """

    def __init__(
        self,
        workspace: Workspace | None = None,
        *,
        bot_token: str = DEFAULT_BOT_TOKEN,
        app_token: str = DEFAULT_APP_TOKEN,
        socket_mode: SocketModeEndpoint | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.workspace = workspace or Workspace()
        self.bot_token = bot_token
        self.app_token = app_token
        self._socket_mode = socket_mode
        self._clock = clock
        self._cond = threading.Condition()
        self._rec = _Recordings()
        self._serving = BackgroundServer(_HttpServer, _Handler, (host, port), owner=self, name="fake-slack-webapi")
        self._next_response_key = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeSlackWebApi:
        self._serving.start()
        return self

    def stop(self) -> None:
        self._serving.shutdown()
        self._serving.join()

    def __enter__(self) -> FakeSlackWebApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The server's root, e.g. http://127.0.0.1:PORT/."""
        host, port = self._serving.address("FakeSlackWebApi")
        return f"http://{host}:{port}/"

    @property
    def base_url(self) -> str:
        """What WebClient takes as `base_url` (keeps the trailing slash urljoin needs)."""
        return f"{self.url}api/"

    def attach_socket_mode(self, server: SocketModeEndpoint | None) -> None:
        self._socket_mode = server

    # ------------------------------------------------------------------ recorded calls
    def calls(self, method: str | None = None) -> list[ApiCall]:
        with self._cond:
            return [c for c in self._rec.calls if method is None or c.method == method]

    def last(self, method: str) -> ApiCall:
        """The latest call of `method`; LookupError (naming what was called) if none."""
        calls = self.calls(method)
        if not calls:
            raise LookupError(f"no {method} call; calls so far: {self._summary()}")
        return calls[-1]

    def wait_for(
        self,
        method: str,
        predicate: Callable[[ApiCall], bool] | None = None,
        timeout: float = 30.0,
    ) -> ApiCall:
        """The first call of `method` (matching `predicate`) recorded since the start or
        the last reset(), waiting up to `timeout` seconds for it."""

        def find() -> ApiCall | None:
            for c in self._rec.calls:
                if c.method == method and (predicate is None or predicate(c)):
                    return c
            return None

        with self._cond:
            found = self._cond.wait_for(find, timeout=timeout)
            if found is None:
                raise TimeoutError(
                    f"no matching {method} call within {timeout} s; calls so far: {self._summary()}"
                )
            return found

    def response_posts(self, key: str | None = None) -> list[ResponseUrlPost]:
        with self._cond:
            return [p for p in self._rec.posts if key is None or p.key == _key_of(key)]

    def wait_for_response(
        self,
        key: str | None = None,
        predicate: Callable[[ResponseUrlPost], bool] | None = None,
        timeout: float = 30.0,
    ) -> ResponseUrlPost:
        """The first POST to a response_url (to `key`'s, if given) matching `predicate`."""
        wanted = _key_of(key) if key is not None else None

        def find() -> ResponseUrlPost | None:
            for p in self._rec.posts:
                if (wanted is None or p.key == wanted) and (predicate is None or predicate(p)):
                    return p
            return None

        with self._cond:
            found = self._cond.wait_for(find, timeout=timeout)
            if found is None:
                raise TimeoutError(f"no matching response_url post within {timeout} s")
            return found

    def reset(self) -> None:
        """Forget recorded calls, response_url posts and pending injected failures (the
        workspace and the issued response_urls stay)."""
        with self._cond:
            self._rec.calls.clear()
            self._rec.posts.clear()
            self._rec.failures.clear()

    def _summary(self) -> str:
        return ", ".join(f"{c.method}({c.error or 'ok'})" for c in self._rec.calls) or "none"

    # ------------------------------------------------------------------ injected failures
    def fail_next(
        self,
        method: str,
        error: str | None = None,
        *,
        status: int = 429,
        retry_after: int = 1,
        times: int = 1,
    ) -> None:
        """Answer the next `times` calls of `method` with a failure: by default HTTP 429
        with `Retry-After` (what RateLimitErrorRetryHandler reacts to); with another
        status (200 for a plain `{"ok": false}`), the body's error is `error`."""
        default = {429: "ratelimited", 200: "internal_error"}.get(status, "fatal_error")
        failure = _Failure(
            status=status, error=error or default, retry_after=retry_after if status == 429 else None
        )
        with self._cond:
            self._rec.failures.setdefault(method, deque()).extend([failure] * times)

    def rate_limit(self, method: str, *, times: int = 1, retry_after: int = 1) -> None:
        self.fail_next(method, status=429, retry_after=retry_after, times=times)

    # ------------------------------------------------------------------ response_url
    def response_url(
        self,
        key: str | None = None,
        *,
        channel: str | None = None,
        message_ts: str | None = None,
        user: str | None = None,
    ) -> str:
        """Issue a response_url (http://127.0.0.1:PORT/response/<key>).

        Bound to a message (`channel`, `message_ts`) its `replace_original` and
        `delete_original` change that message; bound to a `channel` (and `user`),
        `in_channel` replies become messages there and ephemeral ones ephemerals."""
        with self._cond:
            if key is None:
                self._next_response_key += 1
                key = f"R{self._next_response_key:06d}"
            self._rec.response_urls[key] = _ResponseUrl(
                key=key, issued_at=self._clock(), channel=channel, message_ts=message_ts, user=user,
            )
        return f"{self.url}response/{key}"

    def expire_response_url(self, key_or_url: str) -> None:
        with self._cond:
            self._rec.response_urls[_key_of(key_or_url)].expired = True

    # ------------------------------------------------------------------ request handling
    def _handle_api(self, method: str, args: dict[str, Any], token: str | None) -> _HttpAnswer:
        status, headers, answer = self._answer_api(method, args, token)
        with self._cond:
            self._rec.calls.append(
                ApiCall(method=method, args=args, token=token, at=self._clock(), status=status, response=answer)
            )
            self._cond.notify_all()
        return status, headers, answer

    def _answer_api(self, method: str, args: dict[str, Any], token: str | None) -> _HttpAnswer:
        with self._cond:
            queue = self._rec.failures.get(method)
            failure = queue.popleft() if queue else None
        if failure is not None:
            headers = {"Retry-After": str(failure.retry_after)} if failure.retry_after is not None else {}
            return failure.status, headers, {"ok": False, "error": failure.error}
        if method not in methods.METHODS:
            return 200, {}, {"ok": False, "error": "unknown_method"}
        if not token:
            return 200, {}, {"ok": False, "error": "not_authed"}
        if token not in (self.bot_token, self.app_token):
            return 200, {}, {"ok": False, "error": "invalid_auth"}
        wants_app_token = method in methods.APP_TOKEN_METHODS
        if (token == self.app_token) != wants_app_token:
            return 200, {}, {"ok": False, "error": "not_allowed_token_type"}
        socket_mode = self._socket_mode
        ctx = MethodContext(
            workspace=self.workspace,
            upload_url=lambda file_id: f"{self.url}upload/{file_id}",
            socket_mode_url=socket_mode.connection_url if socket_mode is not None else None,
        )
        try:
            return 200, {}, methods.call(method, args, ctx)
        except SlackError as err:
            return 200, {}, err.answer()

    def _handle_response_url(self, key: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        status, answer = self._answer_response_url(key, body)
        with self._cond:
            self._rec.posts.append(
                ResponseUrlPost(key=key, body=body, at=self._clock(), status=status, response=answer)
            )
            self._cond.notify_all()
        return status, answer

    def _answer_response_url(self, key: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        with self._cond:
            url = self._rec.response_urls.get(key)
            if url is None:
                return 404, {"ok": False, "error": "expired_url", "detail": f"no response_url {key!r} was issued"}
            if self._clock() - url.issued_at > RESPONSE_URL_LIFETIME:
                url.expired = True
            if url.expired or url.uses >= RESPONSE_URL_USES:
                url.expired = True
                return 404, {"ok": False, "error": "expired_url"}
            if body is None:
                return 400, {"ok": False, "error": "invalid_payload"}
            try:
                methods.check_message_content(body, require_content=not body.get("delete_original"))
            except SlackError as err:
                return 400, err.answer()
            url.uses += 1
            bound = _ResponseUrl(**vars(url))
        self._apply_response(bound, body)
        return 200, {"ok": True}

    def _apply_response(self, url: _ResponseUrl, body: dict[str, Any]) -> None:
        ws = self.workspace
        if url.channel is None:
            return
        if body.get("delete_original") and url.message_ts:
            ws.delete_message(url.channel, url.message_ts)
        elif body.get("replace_original") and url.message_ts:
            changes = {name: body[name] for name in ("text", "blocks", "attachments") if name in body}
            ws.update_message(url.channel, url.message_ts, **changes)
        elif body.get("response_type") == "in_channel":
            ws.post_message(
                Message(
                    channel=url.channel, ts="", text=body.get("text"), blocks=body.get("blocks"),
                    attachments=body.get("attachments"), thread_ts=body.get("thread_ts"),
                    user=ws.team.bot_user_id,
                )
            )
        elif url.user:
            ws.post_ephemeral(
                Ephemeral(
                    channel=url.channel, user=url.user, ts=ws.new_ts(),
                    text=body.get("text"), blocks=body.get("blocks"),
                )
            )


def _key_of(key_or_url: str) -> str:
    return key_or_url.rstrip("/").rsplit("/", 1)[-1]


def decode_args(content_type: str, raw: bytes, query: str) -> dict[str, Any]:
    """A request's arguments from its query string and its form or JSON body."""
    args: dict[str, Any] = {k: v[-1] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}
    if raw:
        if content_type.startswith("application/json"):
            body = json.loads(raw.decode("utf-8"))
            if not isinstance(body, dict):
                raise ValueError("JSON body must be an object")
            args.update(body)
        else:
            form = urllib.parse.parse_qs(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
            args.update({k: v[-1] for k, v in form.items()})
    for name in _JSON_ARGS:
        if isinstance(args.get(name), str) and args[name].strip()[:1] in ("[", "{"):
            try:
                args[name] = json.loads(args[name])
            except json.JSONDecodeError:
                pass  # left a string: the method answers with its format error
    return args


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeSlackWebApi


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    server_version = "FakeSlack/1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._route()

    def do_POST(self) -> None:  # noqa: N802
        self._route()

    def _route(self) -> None:
        fake = self.server.fake
        path, _, query = self.path.partition("?")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        content_type = self.headers.get("Content-Type", "")
        kind, _, rest = path.lstrip("/").partition("/")
        if kind == "api" and rest:
            try:
                args = decode_args(content_type, raw, query)
            except (ValueError, UnicodeDecodeError):
                self._send_json(200, {"ok": False, "error": "invalid_form_data"})
                return
            token = self._bearer() or args.pop("token", None)
            args.pop("token", None)
            status, headers, answer = fake._handle_api(rest, args, token)
            self._send_json(status, answer, headers)
        elif kind == "response" and rest and self.command == "POST":
            try:
                body = json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                body = None
            status, answer = fake._handle_response_url(rest, body if isinstance(body, dict) else None)
            self._send_json(status, answer)
        elif kind == "upload" and rest and self.command == "POST":
            if fake.workspace.receive_upload(rest, raw):
                self._send_text(200, f"OK - {len(raw)}")
            else:
                self._send_text(404, "file_not_found")
        else:
            self._send_text(404, "not found")

    def _bearer(self) -> str | None:
        scheme, _, value = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return value.strip() or None

    def _send_json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, status: int, text: str) -> None:
        data = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("fake slack: " + format, *args)
