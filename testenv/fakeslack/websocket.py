"""The server side of RFC 6455 on a blocking stdlib socket: just what Socket Mode needs.

The handshake (`read_handshake`, `accept_response`), unmasked frames from the server
(`encode_frame`), and masked frames from the client reassembled into messages
(`MessageReader`: text and binary messages, continuation frames, and the control frames
ping, pong and close, which may arrive between the fragments of a message).
"""

from __future__ import annotations

import base64
import hashlib
import struct
import urllib.parse
from dataclasses import dataclass
from enum import IntEnum
from typing import BinaryIO

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_MESSAGE = 16 * 1024 * 1024
MAX_HEADER_LINE = 8192


class Opcode(IntEnum):
    CONTINUATION = 0x0
    TEXT = 0x1
    BINARY = 0x2
    CLOSE = 0x8
    PING = 0x9
    PONG = 0xA


class CloseCode(IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    TOO_BIG = 1009


class HandshakeError(Exception):
    """The opening request is not a WebSocket upgrade; `status` is the HTTP answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason


class ProtocolError(Exception):
    """The client broke the framing rules; the connection closes with `code`."""

    def __init__(self, message: str, code: CloseCode = CloseCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Handshake:
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    key: str


def read_handshake(rfile: BinaryIO) -> Handshake:
    request_line = rfile.readline(MAX_HEADER_LINE).decode("latin-1").strip()
    if not request_line:
        raise EOFError("connection closed before the handshake")
    parts = request_line.split(" ")
    if len(parts) != 3 or parts[0] != "GET":
        raise HandshakeError(400, "Bad Request")
    headers: dict[str, str] = {}
    while True:
        line = rfile.readline(MAX_HEADER_LINE).decode("latin-1")
        if not line:
            raise EOFError("connection closed during the handshake")
        line = line.strip()
        if not line:
            break
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if headers.get("upgrade", "").lower() != "websocket" or "upgrade" not in headers.get("connection", "").lower():
        raise HandshakeError(400, "Bad Request")
    if headers.get("sec-websocket-version") != "13":
        raise HandshakeError(426, "Upgrade Required")
    key = headers.get("sec-websocket-key", "")
    if not key:
        raise HandshakeError(400, "Bad Request")
    path, _, query = parts[1].partition("?")
    return Handshake(
        path=path,
        query={k: v[-1] for k, v in urllib.parse.parse_qs(query).items()},
        headers=headers,
        key=key,
    )


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + _GUID).encode("ascii")).digest()).decode("ascii")


def accept_response(key: str) -> bytes:
    return (
        "HTTP/1.1 101 Switching Protocols\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept_key(key)}\r\n"
        "\r\n"
    ).encode("ascii")


def reject_response(status: int, reason: str) -> bytes:
    return f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode("ascii")


def encode_frame(opcode: Opcode, payload: bytes = b"", *, fin: bool = True) -> bytes:
    """One frame from the server (servers never mask)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n <= 125:
        head += bytes([n])
    elif n <= 0xFFFF:
        head += struct.pack("!BH", 126, n)
    else:
        head += struct.pack("!BQ", 127, n)
    return head + payload


def close_payload(code: int, reason: str = "") -> bytes:
    return struct.pack("!H", code) + reason.encode("utf-8")[:123]


def parse_close_payload(payload: bytes) -> tuple[int, str]:
    if len(payload) < 2:
        return 1005, ""
    return struct.unpack("!H", payload[:2])[0], payload[2:].decode("utf-8", "replace")


class MessageReader:
    """Reads a client's frames and hands out whole messages as (opcode, payload)."""

    def __init__(self, rfile: BinaryIO, *, max_message: int = MAX_MESSAGE) -> None:
        self._rfile = rfile
        self._max = max_message
        # A fragmented message in progress (control frames may come between fragments).
        self._first: Opcode | None = None
        self._fragments: list[bytes] = []

    def _exactly(self, n: int) -> bytes:
        data = self._rfile.read(n) if n else b""
        if len(data) < n:
            raise EOFError("connection closed")
        return data

    def _frame(self) -> tuple[bool, int, bytes]:
        b1, b2 = self._exactly(2)
        if b1 & 0x70:
            raise ProtocolError("reserved bits set without an extension")
        fin, opcode = bool(b1 & 0x80), b1 & 0x0F
        if not b2 & 0x80:
            raise ProtocolError("a client frame must be masked")
        length = b2 & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", self._exactly(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", self._exactly(8))
        if opcode >= 0x8 and (length > 125 or not fin):
            raise ProtocolError("a control frame must be short and unfragmented")
        if length > self._max:
            raise ProtocolError(f"frame of {length} bytes is too big", CloseCode.TOO_BIG)
        mask = self._exactly(4)
        data = self._exactly(length)
        keystream = (mask * (length // 4 + 1))[:length]
        payload = (int.from_bytes(data, "big") ^ int.from_bytes(keystream, "big")).to_bytes(length, "big")
        return fin, opcode, payload

    def next(self) -> tuple[Opcode, bytes]:
        """The next control frame or whole data message; EOFError when the peer is gone."""
        while True:
            fin, opcode, payload = self._frame()
            if opcode >= 0x8:
                if opcode not in (Opcode.CLOSE, Opcode.PING, Opcode.PONG):
                    raise ProtocolError(f"unknown control opcode {opcode:#x}")
                return Opcode(opcode), payload
            if opcode == Opcode.CONTINUATION:
                if self._first is None:
                    raise ProtocolError("continuation frame without a message to continue")
            elif opcode in (Opcode.TEXT, Opcode.BINARY):
                if self._first is not None:
                    raise ProtocolError("new message before the previous one finished")
                self._first = Opcode(opcode)
            else:
                raise ProtocolError(f"unknown data opcode {opcode:#x}")
            self._fragments.append(payload)
            if sum(map(len, self._fragments)) > self._max:
                raise ProtocolError("message too big", CloseCode.TOO_BIG)
            if fin:
                message = (self._first, b"".join(self._fragments))
                self._first, self._fragments = None, []
                return message
