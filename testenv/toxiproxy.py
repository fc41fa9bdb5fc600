"""Toxiproxy between gpuops and the test API server: a TCP proxy whose "toxics" add
latency, reset connections, stall them until they time out, or hold their close, each on
a share of the connections (its toxicity). TLS passes through untouched, so the client
still checks the API server's certificate (its SANs hold 127.0.0.1, the proxy's address).

The server is built from the Go module proxy like the control plane's binaries
(`testenv.build`) and cached beside them, one folder per version: `go install` of one
pinned release into a scratch folder, then moved into the cache whole. Its `go.mod` has
no replace directives, so `go install module@version` builds it as released.

`Toxiproxy` runs the server as a child process that dies with the test process, and is
also the small client of its HTTP API the tests need: proxies, toxics, enabling and
disabling a proxy (disabling cuts every open connection: a dropped watch, on demand)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from testenv.build import BuildError, cache_root, go_install_cached
from testenv.controlplane import _die_with_parent, free_port

TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2"
# The newest v2 release the Go module proxy serves here (`go list -m -versions`: v2.3.0, v2.5.0).
TOXIPROXY_VERSION = "v2.5.0"
# Without it `toxiproxy-server -version` says "git", as a build outside its Makefile does.
_LDFLAGS = f"-s -w -X {TOXIPROXY_MODULE}.Version={TOXIPROXY_VERSION}"

ToxicType = Literal["latency", "reset_peer", "timeout", "slow_close", "bandwidth", "slicer", "limit_data"]
Stream = Literal["downstream", "upstream"]


class ToxiproxyError(RuntimeError):
    """The Toxiproxy server did not start, or its API refused a call (the message says which)."""


def toxiproxy_path() -> Path:
    """Where the cached toxiproxy-server is (or will be, once built)."""
    return cache_root() / f"toxiproxy-{TOXIPROXY_VERSION}" / "toxiproxy-server"


def toxiproxy_binary(*, verbose: bool = True) -> Path:
    """The cached toxiproxy-server, built on first use (35 s on two cores with empty Go
    module and build caches: 15 modules downloaded, 230 packages compiled)."""
    return go_install_cached(toxiproxy_path(),
                             f"{TOXIPROXY_MODULE}/cmd/server@{TOXIPROXY_VERSION}", what=f"toxiproxy {TOXIPROXY_VERSION}",
                             built="server", ldflags=_LDFLAGS, verbose=verbose)


@dataclass(frozen=True)
class Proxy:
    """One proxy: clients connect to `listen` ("127.0.0.1:port"), it connects to `upstream`."""

    name: str
    listen: str
    upstream: str

    @property
    def server(self) -> str:
        """The proxy as an API server URL (the upstream speaks HTTPS)."""
        return f"https://{self.listen}"


@dataclass
class Toxiproxy:
    """The server and its API client: `start()`, then proxies and toxics, then `stop()`."""

    folder: Path
    seed: int = 0  # toxiproxy draws each toxic's toxicity from a generator seeded with it
    port: int = 0
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.folder / "toxiproxy.log"

    def start(self, *, timeout: float = 30.0) -> Toxiproxy:
        binary = toxiproxy_binary()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(
                [str(binary), "-host", "127.0.0.1", "-port", str(self.port), "-seed", str(self.seed)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                # Its default level traces every connection; proxies and toxics are enough.
                env={**os.environ, "LOG_LEVEL": "info"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ToxiproxyError(f"toxiproxy-server exited with code {self._process.returncode}; "
                                     f"its log is {self.log}")
            with contextlib.suppress(OSError, ToxiproxyError):
                self.version()
                return self
            time.sleep(0.05)
        self.stop()
        raise ToxiproxyError(f"toxiproxy-server did not answer within {timeout:.0f}s; its log is {self.log}")

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=5)
        self._process = None

    def __enter__(self) -> Toxiproxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the HTTP API ------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.api}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except urllib.error.HTTPError as err:
            raise ToxiproxyError(f"toxiproxy {method} {path}: {err.code} {err.read().decode(errors='replace')}") \
                from None
        return json.loads(text) if text.strip() else None

    def version(self) -> str:
        request = urllib.request.Request(f"{self.api}/version")
        with urllib.request.urlopen(request, timeout=2) as response:
            text = response.read().decode().strip()
        # v2.5.0 answers plain text; later releases a JSON object.
        with contextlib.suppress(ValueError, AttributeError):
            return str(json.loads(text)["version"])
        return text

    def create_proxy(self, name: str, upstream: str) -> Proxy:
        """A proxy to `upstream` ("host:port") on a free port of 127.0.0.1."""
        answer = self._call("POST", "/proxies", {"name": name, "listen": f"127.0.0.1:{free_port()}",
                                                 "upstream": upstream, "enabled": True})
        return Proxy(name=name, listen=answer["listen"], upstream=answer["upstream"])

    def set_enabled(self, proxy: Proxy, enabled: bool) -> None:
        """Disabling closes every connection through the proxy and refuses new ones."""
        self._call("POST", f"/proxies/{proxy.name}", {"enabled": enabled})

    def add_toxic(self, proxy: Proxy, name: str, kind: ToxicType, attributes: dict[str, Any], *,
                  toxicity: float = 1.0, stream: Stream = "downstream") -> None:
        """A toxic on `toxicity` of the connections (drawn per connection and direction,
        as each starts; connections open when it is added draw too)."""
        self._call("POST", f"/proxies/{proxy.name}/toxics", {"name": name, "type": kind, "stream": stream,
                                                             "toxicity": toxicity, "attributes": attributes})

    def remove_toxic(self, proxy: Proxy, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy.name}/toxics/{name}")

    def toxics(self, proxy: Proxy) -> list[dict[str, Any]]:
        return list(self._call("GET", f"/proxies/{proxy.name}/toxics") or ())


def kubeconfig_via(kubeconfig: Path, server: str, dest: Path) -> Path:
    """A copy of `kubeconfig` whose clusters reach the API server at `server` (a proxy): same
    users and contexts, same CA (the proxy only forwards bytes, TLS is end to end)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for cluster in config.get("clusters") or ():
        cluster["cluster"]["server"] = server
    dest.write_text(yaml.safe_dump(config, sort_keys=False))
    dest.chmod(0o600)
    return dest


if __name__ == "__main__":
    try:
        print(toxiproxy_binary())
    except BuildError as err:
        sys.exit(f"testenv toxiproxy: {err}")
