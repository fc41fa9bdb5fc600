"""Several `gpuops run --http` replicas as real processes, and a Service in front of them.

A `Replica` is one pod: `gpuops run --http` in its own process with its own ports and
identity ($POD_NAME), the configuration, database URL ($GPUOPS_DATABASE_URL) and Slack
(the fake Web API, $SLACK_API_URL) every replica shares, acting on the control plane as
the bot's ServiceAccount, its Lease in the bot's namespace ($POD_NAMESPACE). Its log goes
to a file; `kill()` is SIGKILL (a node that dies takes the pod with it).

The `Service` sends each request to a ready replica, round robin over those whose /readyz
answers 200 now, as a Kubernetes Service does with its endpoints. A request whose
connection is refused or reset (its replica died) is sent once more to another, with
X-Slack-Retry-Num as Slack's own retry carries, so the product's retry dedupe is what keeps
it from running twice."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from testenv.fakeslack import signing
from testenv.install import wait_until
from tests.e2e.harness import SECRET, HttpAnswer

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "gpuops"  # the bot's own namespace: deploy/rbac.yaml lets it hold its Lease there
LEASE = "gpuops-engine"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Shared:
    """What every replica of one installation is started with."""

    config: Path
    kubeconfig: Path
    database_url: str
    slack_url: str
    bot_token: str
    logs: Path


class Replica:
    """One pod: `gpuops run --http` as its own process."""

    def __init__(self, name: str, shared: Shared) -> None:
        self.name, self.shared = name, shared
        self.port, self.health_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log = shared.logs / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "POD_NAME": name, "POD_NAMESPACE": NAMESPACE,
               "SLACK_BOT_TOKEN": shared.bot_token, "SLACK_SIGNING_SECRET": SECRET,
               "SLACK_API_URL": shared.slack_url, "GPUOPS_DATABASE_URL": shared.database_url,
               "GPUOPS_LOG_FORMAT": "text"}
        env.pop("SLACK_APP_TOKEN", None)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bot.cli", "run", "--http", "--host", "127.0.0.1",
                 "--port", str(self.port), "--health-port", str(self.health_port),
                 "--metrics-port", str(self.metrics_port), "--config", str(shared.config),
                 "--kubeconfig", str(shared.kubeconfig), "--context", "bot", "-v"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/slack/events"

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        if not self.alive():
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as answer:
                return answer.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self, timeout: float = 120) -> Replica:
        wait_until(lambda: self.ready() or not self.alive(), timeout=timeout, what=f"replica {self.name} to be ready")
        assert self.alive(), f"replica {self.name} exited {self.process.returncode}:\n{self.tail()}"
        return self

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, as Kubernetes stops a pod (the Lease is given back)."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def errors(self) -> list[str]:
        """The ERROR lines of its log (a traceback's first line)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [line for line in text.splitlines() if " ERROR " in line or line.startswith("Traceback")]

    def lines(self, containing: str) -> list[str]:
        """The lines of its log that contain `containing`."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [line for line in text.splitlines() if containing in line]


@dataclass
class Delivery:
    """What the Service did with one request: the answer, and which replicas it tried."""

    answer: HttpAnswer
    tried: list[str]


class Service:
    """Round robin over the replicas whose /readyz answers; a refused or reset connection
    is retried once on another, with X-Slack-Retry-Num."""

    def __init__(self) -> None:
        self.replicas: list[Replica] = []
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._ready: dict[str, tuple[float, bool]] = {}
        self.retried = 0

    def add(self, replica: Replica) -> None:
        with self._lock:
            self.replicas.append(replica)

    def remove(self, replica: Replica) -> None:
        with self._lock:
            self.replicas.remove(replica)

    def _endpoints(self) -> list[Replica]:
        """The ready replicas, /readyz looked at again when older than half a second (an
        endpoint controller's view is never fresher than its probes)."""
        with self._lock:
            replicas = list(self.replicas)
        ready = []
        for replica in replicas:
            seen = self._ready.get(replica.name)
            if seen is None or time.monotonic() - seen[0] > 0.5:
                seen = (time.monotonic(), replica.ready())
                self._ready[replica.name] = seen
            if seen[1]:
                ready.append(replica)
        return ready

    def send(self, body: bytes, *, headers: dict[str, str] | None = None) -> Delivery:
        tried: list[str] = []
        retry = 0
        deadline = time.monotonic() + 30
        while True:
            endpoints = [r for r in self._endpoints() if r.name not in tried] or self._endpoints()
            if not endpoints:
                assert time.monotonic() < deadline, "no replica ready for 30 s"
                time.sleep(0.1)
                continue
            replica = endpoints[next(self._turn) % len(endpoints)]
            tried.append(replica.name)
            extra = dict(headers or {})
            if retry:
                extra.update({"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_error"})
            try:
                return Delivery(_post(replica.url, body, extra), tried)
            except (ConnectionError, urllib.error.URLError, TimeoutError) as err:
                if retry or not _connection_lost(err):
                    raise
                retry += 1
                with self._lock:
                    self.retried += 1
                self._ready[replica.name] = (time.monotonic(), False)


def _connection_lost(err: BaseException) -> bool:
    reason = getattr(err, "reason", err)
    return isinstance(reason, (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError,
                               BrokenPipeError)) or "Remote end closed" in str(reason)


def _post(url: str, body: bytes, headers: dict[str, str]) -> HttpAnswer:
    signed = signing.sign(body, secret=SECRET, timestamp=int(time.time()))
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={**signed, "Content-Type": signing.FORM, **headers})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return HttpAnswer(answer.status, answer.read().decode(), time.perf_counter() - started)
    except urllib.error.HTTPError as err:
        return HttpAnswer(err.code, err.read().decode(), time.perf_counter() - started)
