"""A watch on a dead connection does not hold the watch cache for the watch's whole
timeout: a server whose answer never comes fails the watch after the answer timeout, and
a stream that says nothing (no event, no bookmark) is ended after the idle timeout, so the
caller resumes from its last version.

Found by tests/reliability/controlplane/test_api_faults.py: a watch of pods opened through Toxiproxy
while its connections were being cut waited 104 s for an answer that never came (the
read timeout was the watch's 300 s plus 15), and the cache missed three pods' deletions
for that long. Toxiproxy (built by testenv) holds the answer here, as a half-open
connection behind a proxy or NAT would."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from testenv.install import wait_until
from testenv.toxiproxy import Proxy, Toxiproxy, kubeconfig_via
from workflows.kube.errors import Unavailable
from workflows.kube.gateway import KubeGateway


# A collection nobody writes to while the test runs: its watch only ever hears bookmarks.
QUIET = "/api/v1/namespaces/kube-public/configmaps"
QUIET_SELECTOR = "gpuops.io/test=watch-dead-connection"


def _api_address(kubeconfig: Path) -> str:
    config = yaml.safe_load(kubeconfig.read_text())
    return config["clusters"][0]["cluster"]["server"].removeprefix("https://")


class _Watcher(threading.Thread):
    """Runs one watch to its end, keeping how it ended."""

    def __init__(self, gateway: KubeGateway, version: str, **timeouts: float) -> None:
        super().__init__(daemon=True)
        self.gateway, self.version, self.timeouts = gateway, version, timeouts
        self.opened = threading.Event()
        self.events: list[str] = []
        self.error: Exception | None = None
        self.ended = threading.Event()

    def run(self) -> None:
        try:
            for event in self.gateway.watch(QUIET, resource_version=self.version, timeout_seconds=240,
                                            label_selector=QUIET_SELECTOR,
                                            on_open=lambda _: self.opened.set(), **self.timeouts):
                self.events.append(event.type)
        except Exception as err:  # noqa: BLE001 - kept for the test to read
            self.error = err
        finally:
            self.ended.set()


@pytest.fixture
def proxied(cluster, tmp_path) -> Iterator[tuple[Toxiproxy, Proxy, KubeGateway]]:
    """Toxiproxy in front of the API server, and a gateway (admin) through it."""
    with Toxiproxy(folder=tmp_path / "toxiproxy") as toxiproxy:
        proxy = toxiproxy.create_proxy("apiserver", _api_address(cluster.kubeconfig))
        gateway = KubeGateway.connect(kubeconfig=kubeconfig_via(cluster.kubeconfig, proxy.server,
                                                                tmp_path / "kubeconfig"), context="admin")
        try:
            yield toxiproxy, proxy, gateway
        finally:
            gateway.close()


def test_a_watch_whose_answer_never_comes_fails_at_the_answer_timeout(proxied):
    toxiproxy, proxy, gateway = proxied
    # The list leaves its connection in the pool, open: the watch is sent on it.
    version = gateway.list(QUIET, label_selector=QUIET_SELECTOR).resource_version
    # From now on everything the server sends is held back, and no connection closes.
    toxiproxy.add_toxic(proxy, "hold", "timeout", {"timeout": 0})
    watcher = _Watcher(gateway, version, answer_timeout=3)
    watcher.start()
    # Without the answer timeout the watch waits 255 s (its 240 s and 15 more).
    wait_until(watcher.ended.is_set, timeout=60, what="the held watch to give up")
    toxiproxy.remove_toxic(proxy, "hold")

    assert not watcher.opened.is_set()
    assert isinstance(watcher.error, Unavailable), watcher.error


def test_a_silent_watch_stream_ends_at_the_idle_timeout_and_the_next_one_opens(proxied):
    toxiproxy, proxy, gateway = proxied
    version = gateway.list(QUIET, label_selector=QUIET_SELECTOR).resource_version
    watcher = _Watcher(gateway, version, idle_timeout=3)
    watcher.start()
    wait_until(watcher.opened.is_set, timeout=30, what="the watch to open")
    # From now on the stream says nothing, as on a connection that died quietly.
    toxiproxy.add_toxic(proxy, "hold", "timeout", {"timeout": 0})
    wait_until(watcher.ended.is_set, timeout=60, what="the silent watch to end")
    toxiproxy.remove_toxic(proxy, "hold")
    gateway.close_idle_connections()
    # The caller resumes from its version: the next watch opens and hears on.
    again = _Watcher(gateway, version, idle_timeout=3)
    again.start()
    wait_until(again.opened.is_set, timeout=30, what="the next watch to open")
    wait_until(again.ended.is_set, timeout=60, what="the next watch to end")

    assert watcher.error is None and again.error is None, (watcher.error, again.error)
    assert watcher.events == [] and set(again.events) <= {"BOOKMARK"}
