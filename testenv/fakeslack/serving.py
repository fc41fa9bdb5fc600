"""One socketserver in a daemon thread, shared by the fake Web API and the fake Socket
Mode server: start, stop, and the address it listens on."""

from __future__ import annotations

import socketserver
import threading
from typing import Any


class BackgroundServer:
    def __init__(self, server_class: type[socketserver.BaseServer], handler: type[Any],
                 address: tuple[str, int], *, owner: object, name: str) -> None:
        self._server_class = server_class
        self._handler = handler
        self._address = address
        self._owner = owner
        self._name = name
        self._server: socketserver.BaseServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._server is not None:
            return
        server = self._server_class(self._address, self._handler)
        server.fake = self._owner  # type: ignore[attr-defined] - the handlers find their fake here
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=self._name, daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop accepting and serving; `join` waits for the thread."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def address(self, what: str) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError(f"{what} is not started: use start() or `with`")
        host, port = self._server.server_address[:2]  # type: ignore[misc]
        return str(host), int(port)
