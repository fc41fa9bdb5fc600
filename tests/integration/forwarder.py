"""A TCP forwarder in front of the test API server that a test can cut and restore, so
the client side sees what a lost API server looks like (connections refused, open
watches reset) while the control plane itself keeps running for the other tests."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import yaml


class Forwarder:
    """Listens on 127.0.0.1:<port> and pipes each connection to `target` (host, port)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = 0
        self.accepted = 0

    def start(self) -> Forwarder:
        listener = socket.create_server(("127.0.0.1", self.port))
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def cut(self) -> None:
        """Stop listening (new connections are refused) and reset every open one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            # NB: close() alone does not wake a thread blocked in accept(), which would
            # go on accepting; shutdown() does.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def restore(self) -> None:
        """Listen again on the same port."""
        self.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.accepted += 1
                self._sockets.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


def kubeconfig_through(kubeconfig: Path, forwarder: Forwarder, folder: Path) -> Path:
    """A copy of `kubeconfig` whose clusters point at the forwarder."""
    doc = yaml.safe_load(kubeconfig.read_text())
    for cluster in doc["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{forwarder.port}"
    path = folder / "kubeconfig-forwarded"
    path.write_text(yaml.safe_dump(doc))
    return path
