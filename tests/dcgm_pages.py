"""The real dcgm-exporter captures in ../shared/reference/dcgm-exporter as five demo nodes'
pages (two unchanged, three changed to carry an XID 79, a double-bit ECC error and a
failed row remap), and local stand-ins that serve them: one HTTP server for a Prometheus
to scrape (`QuietHandler` over a folder), or one exporter per node on its own loopback
address (`StandInExporters`: 127.0.0.N, all on one port, as pods share the exporter's)."""

from __future__ import annotations

import errno
import http.server
import socket
import threading
from collections.abc import Mapping
from pathlib import Path

CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "reference" / "dcgm-exporter"
T4 = (CAPTURES / "real-sample-tesla-t4-datadog-fixture.prom").read_text()
VGPU = (CAPTURES / "real-sample-gpu-operator-vgpu-a100-vks.prom").read_text()
T4_HOST = 'Hostname="424773df46e0"'
VGPU_HOST = 'Hostname="vks-cluster-0-0-np1-worker-xtxww-xw4wp-wn7j2"'
T4_UUID = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"
VGPU_UUID = "GPU-f809e614-a528-4083-acbf-334600000000"
# The demo fleet's first five nodes: healthy, XID 79, DBE, row-remap failure, healthy vGPU.
NODES = ("serving-a-000", "training-a-001", "inference-mig-002", "serving-a-003", "training-a-004")
HEALTHY, XID79, DBE, REMAP, VGPU_NODE = NODES


def added(text: str, host: str, series: Mapping[str, str]) -> str:
    """The T4 capture named for `host`, with series added (name -> value) on its GPU."""
    labels = text.split("DCGM_FI_DEV_SM_CLOCK{", 1)[1].split("}", 1)[0].replace(T4_HOST, host)
    return text.replace(T4_HOST, host) + "".join(
        f"# HELP {name} (added for the test)\n# TYPE {name} counter\n{name}{{{labels}}} {value}\n"
        for name, value in series.items())


def pages(hostnames: Mapping[str, str] | None = None) -> dict[str, str]:
    """Per node, its page; `hostnames` (node -> Hostname label) names them otherwise than
    by node (an exporter that labels by pod hostname)."""
    def host(node: str) -> str:
        return f'Hostname="{(hostnames or {}).get(node, node)}"'

    xid79 = VGPU.replace('err_code="0",err_msg="No Error"} 0', 'err_code="79",err_msg="GPU has fallen off the bus"} 79')
    assert xid79 != VGPU
    return {
        HEALTHY: T4.replace(T4_HOST, host(HEALTHY)),
        XID79: xid79.replace(VGPU_HOST, host(XID79)),
        DBE: added(T4, host(DBE), {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "2", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "7"}),
        REMAP: added(T4, host(REMAP), {"DCGM_FI_DEV_ROW_REMAP_FAILURE": "1",
                                       "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "5"}),
        VGPU_NODE: VGPU.replace(VGPU_HOST, host(VGPU_NODE)),
    }


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's name
        pass


class _ExporterHandler(http.server.BaseHTTPRequestHandler):
    """Serves its server's current page at /metrics, as dcgm-exporter does."""

    def do_GET(self):  # noqa: N802 - the stdlib's name
        server = self.server
        server.asked.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = server.page.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - the stdlib's name
        pass


class StandInExporters:
    """One exporter per node on 127.0.0.2, .3, ... (all on one port); `page(node, text)`
    changes what a node serves, `stop(node)` closes its exporter (refused from then on),
    and `stall(node)` leaves one that accepts connections and never answers."""

    def __init__(self, pages: Mapping[str, str]) -> None:
        self.ips = {node: f"127.0.0.{i + 2}" for i, node in enumerate(pages)}
        self.servers: dict[str, http.server.ThreadingHTTPServer] = {}
        self._stalled: list[socket.socket] = []
        self.port = self._bind_all(pages)
        for server in self.servers.values():
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def _bind_all(self, pages: Mapping[str, str]) -> int:
        for _ in range(20):
            first = None
            try:
                for node, text in pages.items():
                    port = first.server_address[1] if first is not None else 0
                    server = http.server.ThreadingHTTPServer((self.ips[node], port), _ExporterHandler)
                    server.page, server.asked = text, []  # type: ignore[attr-defined]
                    self.servers[node] = server
                    first = first or server
                return first.server_address[1] if first is not None else 0
            except OSError as err:
                if err.errno != errno.EADDRINUSE:
                    raise
                self._close_servers()  # the port is taken on another address: try another
        raise RuntimeError("no port free on every stand-in address")

    def page(self, node: str, text: str) -> None:
        self.servers[node].page = text  # type: ignore[attr-defined]

    def asked(self, node: str) -> list[str | None]:
        """The Authorization header of each request the node's exporter answered."""
        return self.servers[node].asked  # type: ignore[attr-defined]

    def stop(self, node: str) -> None:
        server = self.servers.pop(node)
        server.shutdown()
        server.server_close()

    def stall(self, node: str) -> None:
        self.stop(node)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.ips[node], self.port))
        listener.listen(8)  # accepted by the kernel, never read: the request waits for its timeout
        self._stalled.append(listener)

    def _close_servers(self) -> None:
        for server in self.servers.values():
            server.server_close()
        self.servers.clear()

    def close(self) -> None:
        for server in self.servers.values():
            server.shutdown()
        self._close_servers()
        for listener in self._stalled:
            listener.close()

    def __enter__(self) -> StandInExporters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
