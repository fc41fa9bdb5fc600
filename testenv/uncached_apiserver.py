"""A second kube-apiserver on the test control plane's etcd, without a watch cache.

The control plane's API server serves watches from its watch cache, which keeps events
long after etcd compacted them, so a watch resumed from an old resourceVersion rarely
meets 410 Gone there. This one serves every watch from etcd itself, as a busy cluster's
API server does once its cache window has moved on: after `ControlPlane.compact_etcd()`
a watch resumed from before the compaction answers 410 at once. Two API servers on one
etcd are an ordinary high-availability control plane; both run the same admission
(webhooks included) and authorisation.

It runs with exactly the flags the running API server was started with (read from its
command line, so a flag added to `testenv.controlplane` is kept), but another port, its
own audit log and `--watch-cache=false`; it dies with the test process."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from testenv.controlplane import ControlPlane, ControlPlaneError, _die_with_parent, free_port

# Flags replaced rather than copied.
_OWN = ("--secure-port=", "--audit-log-path=", "--watch-cache=", "--watch-cache-sizes=")


@dataclass
class UncachedApiServer:
    plane: ControlPlane
    folder: Path
    port: int = 0
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """host:port, as a TCP proxy's upstream."""
        return f"127.0.0.1:{self.port}"

    @property
    def server(self) -> str:
        return f"https://{self.address}"

    @property
    def audit_log(self) -> Path:
        """Its own audit log (the control plane's audit policy: the bot's writes)."""
        return self.folder / "audit-uncached.jsonl"

    @property
    def log(self) -> Path:
        return self.folder / "kube-apiserver-uncached.log"

    def _running_args(self) -> list[str]:
        state = self.plane.describe()
        names = list(state["logs"])  # type: ignore[arg-type]
        pid = state["pids"][names.index("kube-apiserver")]  # type: ignore[index]
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]

    def start(self, *, timeout: float = 90.0) -> UncachedApiServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        binary, *flags = self._running_args()
        self.port = free_port()
        flags = [f for f in flags if not f.startswith(_OWN)] + [
            f"--secure-port={self.port}", "--watch-cache=false",
            f"--audit-log-path={self.audit_log}"]
        with self.log.open("ab") as out:
            self._process = subprocess.Popen([binary, *flags], stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                                             cwd=self.folder)
        context = self._admin_tls()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ControlPlaneError(f"the uncached kube-apiserver exited with code {self._process.returncode}; "
                                        f"its log is {self.log}")
            with contextlib.suppress(urllib.error.URLError, OSError, ssl.SSLError):
                with urllib.request.urlopen(f"{self.server}/readyz", timeout=2, context=context) as answer:
                    if answer.status == 200:
                        return self
            time.sleep(0.2)
        self.stop()
        raise ControlPlaneError(f"the uncached kube-apiserver was not ready within {timeout:.0f}s; its log is {self.log}")

    def _admin_tls(self) -> ssl.SSLContext:
        config = yaml.safe_load(self.plane.kubeconfig.read_text())
        admin = next(u["user"] for u in config["users"] if u["name"] == "admin")
        context = ssl.create_default_context(cafile=config["clusters"][0]["cluster"]["certificate-authority"])
        context.load_cert_chain(admin["client-certificate"], admin["client-key"])
        return context

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=5)
        self._process = None
