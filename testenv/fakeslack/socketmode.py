"""A fake Socket Mode endpoint: the WebSocket server Slack runs for apps.connections.open.

    with FakeSlackWebApi() as api, FakeSocketModeServer() as sm:
        api.attach_socket_mode(sm)
        ...  # start the bot's SocketModeClient with base_url=api.base_url
        envelope_id = sm.send_envelope("slash_commands", payload)
        ack = sm.wait_for_ack(envelope_id)

On connect it sends `hello`, as Slack does; each envelope goes to one open connection, in
turn over those open (Slack hands each envelope to one connection of the app, so several
replicas share the traffic); every text message the client sends is recorded and those
carrying an `envelope_id` are acks. An envelope whose connection goes away before it was
acked is sent again to another open connection (or the next one to open), with
`retry_attempt` one higher and `retry_reason` "timeout", as Slack sends an unacknowledged
envelope again; `connection_of(envelope_id)` says which connection it went to last, and
`drop_connection(number)` cuts that one alone (a replica's process killed). `disconnect()` sends Slack's
`disconnect` message (the client opens a new connection, and the old one is dropped
once it has); `close_connections()` closes the sockets with a close frame instead, and
`drop_connections()` cuts them without one.

Each URL from `connection_url()` carries a one-time ticket, as Slack's do; a connection
with an unknown or used ticket is refused with HTTP 401.
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
import socketserver
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from testenv.fakeslack.serving import BackgroundServer
from testenv.fakeslack.websocket import (
    CloseCode,
    HandshakeError,
    MessageReader,
    Opcode,
    ProtocolError,
    accept_response,
    close_payload,
    encode_frame,
    parse_close_payload,
    read_handshake,
    reject_response,
)

log = logging.getLogger("gpuops.testenv.fakeslack.socketmode")

ENVELOPE_TYPES = ("slash_commands", "interactive", "events_api")
# Interactive payloads whose envelope lets the app answer in the ack (Slack sets
# accepts_response_payload for these; block_actions and shortcuts are ack-only).
_INTERACTIVE_WITH_RESPONSE = frozenset({"view_submission", "block_suggestion"})


@dataclass(eq=False)
class _Connection:
    number: int
    ticket: str
    sock: socket.socket
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    open: bool = True
    refreshing: bool = False  # told to reconnect: new envelopes wait for the next one

    def send(self, opcode: Opcode, payload: bytes) -> None:
        with self.send_lock:
            self.sock.sendall(encode_frame(opcode, payload))

    def send_json(self, message: dict[str, Any]) -> None:
        self.send(Opcode.TEXT, json.dumps(message).encode("utf-8"))


class FakeSocketModeServer:
    """A Socket Mode server on `host:port` (port 0: a free one) for app `app_id`."""

    def __init__(self, *, app_id: str = "A0GPUOPS", host: str = "127.0.0.1", port: int = 0) -> None:
        self.app_id = app_id
        self._cond = threading.Condition()
        self._tickets: set[str] = set()
        self._connections: list[_Connection] = []
        self._numbers = itertools.count(1)
        self._received: list[Any] = []
        self._acks: list[dict[str, Any]] = []
        self._pongs: list[bytes] = []
        self._envelopes: list[dict[str, Any]] = []
        self._sent_on: dict[str, _Connection] = {}  # envelope_id: the connection it went to last
        self._waiting: list[dict[str, Any]] = []  # to send again once a connection opens
        self._turn = itertools.count()
        self._serving = BackgroundServer(_TcpServer, _Handler, (host, port), owner=self, name="fake-socket-mode")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeSocketModeServer:
        self._serving.start()
        return self

    def stop(self) -> None:
        self._serving.shutdown()
        self.drop_connections()
        self._serving.join()

    def __enter__(self) -> FakeSocketModeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host, port = self._serving.address("FakeSocketModeServer")
        return f"ws://{host}:{port}/link/"

    def connection_url(self) -> str:
        """A new URL to connect to, as apps.connections.open hands out."""
        ticket = uuid.uuid4().hex
        with self._cond:
            self._tickets.add(ticket)
        return f"{self.url}?ticket={ticket}&app_id={self.app_id}"

    # ------------------------------------------------------------------ what tests read
    @property
    def connections_made(self) -> int:
        """How many connections got their `hello` so far."""
        with self._cond:
            return len(self._connections)

    @property
    def open_connections(self) -> int:
        with self._cond:
            return sum(1 for c in self._connections if c.open)

    @property
    def acks(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self._acks)

    @property
    def received(self) -> list[Any]:
        """Every text message from clients, JSON-decoded when it is JSON."""
        with self._cond:
            return list(self._received)

    @property
    def envelopes(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self._envelopes)

    def wait_for_connections(self, count: int, timeout: float = 30.0) -> None:
        """Wait until `count` connections in all have been made (and greeted)."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._connections) >= count, timeout=timeout):
                raise TimeoutError(
                    f"{len(self._connections)} Socket Mode connection(s) within {timeout} s, expected {count}"
                )

    def wait_for_ack(self, envelope_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The ack the client sent for an envelope (`{"envelope_id": ..., "payload": ...}`)."""

        def find() -> dict[str, Any] | None:
            return next((a for a in self._acks if a.get("envelope_id") == envelope_id), None)

        with self._cond:
            ack = self._cond.wait_for(find, timeout=timeout)
            if ack is None:
                raise TimeoutError(f"no ack for envelope {envelope_id} within {timeout} s")
            return ack

    # ------------------------------------------------------------------ what Slack sends
    def connection_of(self, envelope_id: str) -> int:
        """The number of the connection an envelope was sent to last."""
        with self._cond:
            return self._sent_on[envelope_id].number

    def send_envelope(
        self,
        type: str,  # noqa: A002 - Slack's field name
        payload: dict[str, Any],
        *,
        envelope_id: str | None = None,
        retry_attempt: int = 0,
        retry_reason: str = "",
        accepts_response_payload: bool | None = None,
        timeout: float = 30.0,
    ) -> str:
        """Send an envelope to the next open connection in turn (waiting up to `timeout`
        for one); returns its envelope_id. `accepts_response_payload` defaults to what Slack sets
        for the type: true for slash commands, view submissions and option loads."""
        if type not in ENVELOPE_TYPES:
            raise ValueError(f"envelope type must be one of {ENVELOPE_TYPES}, not {type!r}")
        if accepts_response_payload is None:
            accepts_response_payload = type == "slash_commands" or (
                type == "interactive" and payload.get("type") in _INTERACTIVE_WITH_RESPONSE
            )
        envelope: dict[str, Any] = {
            "envelope_id": envelope_id or str(uuid.uuid4()),
            "type": type,
            "payload": payload,
            "accepts_response_payload": accepts_response_payload,
        }
        if type == "events_api" or retry_attempt or retry_reason:
            envelope["retry_attempt"] = retry_attempt
            envelope["retry_reason"] = retry_reason
        connection = self._current(timeout)
        with self._cond:
            self._envelopes.append(envelope)
            self._sent_on[envelope["envelope_id"]] = connection
        connection.send_json(envelope)
        return envelope["envelope_id"]

    def drop_connection(self, number: int) -> None:
        """Cut connection `number` alone without a close frame (its process was killed)."""
        with self._cond:
            connection = next(c for c in self._connections if c.number == number)
        self._drop(connection)

    def disconnect(self, reason: str = "refresh_requested") -> None:
        """Tell the open connections to reconnect, as Slack does before it drops one."""
        with self._cond:
            connections = [c for c in self._connections if c.open and not c.refreshing]
            for connection in connections:
                connection.refreshing = True
        for connection in connections:
            debug_info = {"host": f"applink-fake-{connection.number}"}
            connection.send_json({"type": "disconnect", "reason": reason, "debug_info": debug_info})

    def close_connections(self, code: int = CloseCode.GOING_AWAY, reason: str = "") -> None:
        """Close every open connection with a close frame (the client should reconnect)."""
        with self._cond:
            connections = [c for c in self._connections if c.open]
            for connection in connections:
                connection.refreshing = True
        for connection in connections:
            try:
                connection.send(Opcode.CLOSE, close_payload(code, reason))
            except OSError:
                pass
            self._drop(connection)

    def drop_connections(self) -> None:
        """Cut every connection without a close frame, as a network failure would.

        Do this before closing a builtin SocketModeClient: its close() otherwise waits
        for a 3 s receive timeout."""
        with self._cond:
            connections = [c for c in self._connections if c.open]
        for connection in connections:
            self._drop(connection)

    def close_client(self, client: Any) -> None:
        """Close slack_sdk's builtin SocketModeClient (bolt: `handler.client`) at once.

        Its close() otherwise takes seconds: it waits for its receive loop (3 s socket
        timeout) and its message loop (1 s queue poll). So: stop it reconnecting, cut its
        connection, wake its message loop, then close it. Duck-typed on the attributes
        slack_sdk 3.x declares (`auto_reconnect_enabled`, `closed`, `message_queue`)."""
        client.auto_reconnect_enabled = False
        client.closed = True
        self.drop_connections()
        # Not JSON: message listeners see an empty dict, request listeners nothing.
        client.message_queue.put("")
        client.close()

    def ping(self, payload: bytes = b"fake-slack", *, timeout: float = 30.0) -> None:
        """Ping the newest connection and wait for its pong."""
        connection = self._current(timeout)
        connection.send(Opcode.PING, payload)
        with self._cond:
            if not self._cond.wait_for(lambda: payload in self._pongs, timeout=timeout):
                raise TimeoutError(f"no pong within {timeout} s")

    # ------------------------------------------------------------------ internals
    def _current(self, timeout: float) -> _Connection:
        def next_open() -> _Connection | None:
            usable = [c for c in self._connections if c.open and not c.refreshing]
            return usable[next(self._turn) % len(usable)] if usable else None

        with self._cond:
            connection = self._cond.wait_for(next_open, timeout=timeout)
            if connection is None:
                raise TimeoutError(f"no open Socket Mode connection within {timeout} s")
            return connection

    def _admit(self, ticket: str | None) -> bool:
        with self._cond:
            if ticket not in self._tickets:
                return False
            self._tickets.discard(ticket)
            return True

    def _greet(self, sock: socket.socket, ticket: str) -> _Connection:
        connection = _Connection(number=next(self._numbers), ticket=ticket, sock=sock)
        with self._cond:
            open_count = 1 + sum(1 for c in self._connections if c.open)
        connection.send_json(
            {
                "type": "hello",
                "num_connections": open_count,
                "debug_info": {
                    "host": f"applink-fake-{connection.number}",
                    "build_number": 1,
                    "approximate_connection_time": 18060,
                },
                "connection_info": {"app_id": self.app_id},
            }
        )
        with self._cond:
            self._connections.append(connection)
            replaced = [c for c in self._connections if c.open and c.refreshing]
            self._cond.notify_all()
        # Slack drops a connection it asked to refresh once the new one is up. Dropping
        # it at once also frees the builtin client, whose switch to the new connection
        # otherwise waits for a 3 s receive timeout on the old one.
        for old in replaced:
            self._drop(old)
        with self._cond:
            waiting, self._waiting = self._waiting, []
        for envelope in waiting:
            self._send_again(envelope, connection)
        return connection

    def _on_text(self, text: str) -> None:
        try:
            message: Any = json.loads(text)
        except ValueError:
            message = text
        with self._cond:
            self._received.append(message)
            if isinstance(message, dict) and "envelope_id" in message:
                self._acks.append(message)
            self._cond.notify_all()

    def _on_pong(self, payload: bytes) -> None:
        with self._cond:
            self._pongs.append(payload)
            self._cond.notify_all()

    def _drop(self, connection: _Connection) -> None:
        with self._cond:
            was_open, connection.open = connection.open, False
            acked = {a.get("envelope_id") for a in self._acks}
            unacked = [e for e in self._envelopes if self._sent_on.get(e["envelope_id"]) is connection
                       and e["envelope_id"] not in acked] if was_open else []
            usable = [c for c in self._connections if c.open and not c.refreshing]
            if not usable:
                self._waiting.extend(unacked)
            self._cond.notify_all()
        try:
            connection.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if usable:
            for envelope in unacked:
                self._send_again(envelope, usable[next(self._turn) % len(usable)])

    def _send_again(self, envelope: dict[str, Any], connection: _Connection) -> None:
        """An unacknowledged envelope, sent again as Slack does: the same envelope_id, the
        retry counted."""
        again = {**envelope, "retry_attempt": int(envelope.get("retry_attempt") or 0) + 1, "retry_reason": "timeout"}
        with self._cond:
            self._envelopes.append(again)
            self._sent_on[again["envelope_id"]] = connection
        try:
            connection.send_json(again)
        except OSError:
            pass

    def _serve(self, sock: socket.socket, rfile: Any) -> None:
        """One client connection, from handshake to close."""
        try:
            handshake = read_handshake(rfile)
        except HandshakeError as err:
            sock.sendall(reject_response(err.status, err.reason))
            return
        except (EOFError, OSError):
            return
        ticket = handshake.query.get("ticket")
        if handshake.path.rstrip("/") != "/link" or not self._admit(ticket):
            sock.sendall(reject_response(401, "Unauthorized"))
            return
        sock.sendall(accept_response(handshake.key))
        connection = self._greet(sock, ticket or "")
        reader = MessageReader(rfile)
        try:
            while True:
                opcode, payload = reader.next()
                if opcode == Opcode.TEXT:
                    self._on_text(payload.decode("utf-8"))
                elif opcode == Opcode.BINARY:
                    log.warning("ignoring a binary message from a Socket Mode client")
                elif opcode == Opcode.PING:
                    connection.send(Opcode.PONG, payload)
                elif opcode == Opcode.PONG:
                    self._on_pong(payload)
                elif opcode == Opcode.CLOSE:
                    code, _reason = parse_close_payload(payload)
                    connection.send(Opcode.CLOSE, close_payload(code if code != 1005 else CloseCode.NORMAL))
                    return
        except ProtocolError as err:
            log.warning("Socket Mode client broke the protocol: %s", err)
            try:
                connection.send(Opcode.CLOSE, close_payload(err.code, str(err)))
            except OSError:
                pass
        except (EOFError, OSError, UnicodeDecodeError):
            pass  # the client went away (the builtin client just closes its socket)
        finally:
            self._drop(connection)


class _TcpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeSocketModeServer


class _Handler(socketserver.StreamRequestHandler):
    server: _TcpServer

    def handle(self) -> None:
        self.server.fake._serve(self.connection, self.rfile)
