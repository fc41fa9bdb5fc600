"""A watch that expires while the cache is away: the API answers 410 Gone, the cache
lists again and applies what it missed, deletions included."""

from __future__ import annotations

import datetime as dt

import pytest
from kubernetes import config

from testenv import build
from testenv import fleet as fl
from testenv.controlplane import ControlPlane
from testenv.install import Installer, apply_fleet, wait_until
from workflows.fleet.settings import InventorySettings
from workflows.fleet.watchcache import FleetCache
from workflows.kube.errors import Gone
from workflows.kube.gateway import KubeGateway
from workflows.kube.gateway.paths import NODES


@pytest.fixture(scope="module")
def etcd_watched_plane(tmp_path_factory):
    # Without the API server's watch cache, watches are served by etcd itself, so a
    # compaction makes older resourceVersions expire at once, as they do after a long
    # disconnection on a busy cluster.
    plane = ControlPlane(bin_dir=build.ensure_binaries(), folder=tmp_path_factory.mktemp("etcd-watched"),
                         apiserver_args=("--watch-cache=false",))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def test_a_watch_that_expired_while_away_is_replaced_by_a_fresh_list(etcd_watched_plane):
    plane = etcd_watched_plane
    spec = fl.FleetSpec(name="expiry", system_nodes=0, operator=fl.OperatorSpec(installed=False),
                        pools=(fl.PoolSpec(name="pool-a", nodes=3),))
    installer = Installer(config.new_client_from_config(config_file=str(plane.kubeconfig)))
    apply_fleet(installer, spec, advertise=True)
    gateway = KubeGateway.connect(kubeconfig=plane.kubeconfig)
    cache = FleetCache(gateway, settings=InventorySettings()).start()
    now = dt.datetime.now(dt.timezone.utc)
    assert sorted(cache.fleet(now).nodes) == ["pool-a-01", "pool-a-02", "pool-a-03"]
    seen_version = gateway.list(NODES).resource_version

    cache.stop()  # away: nothing below is seen as it happens
    installer.delete({"kind": "Node", "metadata": {"name": "pool-a-01"}})
    installer.call("PATCH", "/api/v1/nodes/pool-a-02", body={"metadata": {"labels": {fl.POOL_LABEL: "pool-b"}}},
                   content_type="application/merge-patch+json")
    installer.create(fl.node_object(spec, spec.pools[0], "pool-a-04", advertise=True))
    plane.compact_etcd()
    with pytest.raises(Gone):  # the version the cache holds is gone for everyone
        next(iter(gateway.watch(NODES, resource_version=seen_version, timeout_seconds=5)))

    cache.watch()
    try:
        def caught_up() -> bool:
            fleet = cache.fleet(dt.datetime.now(dt.timezone.utc), max_age=dt.timedelta(0))
            return sorted(fleet.nodes) == ["pool-a-02", "pool-a-03", "pool-a-04"] and \
                fleet.nodes["pool-a-02"].pool == "pool-b"

        wait_until(caught_up, timeout=30, what="the cache to list again after 410 Gone")
        assert cache.relists("nodes") >= 1
        # And it is watching again: a change after the re-list arrives as an event.
        installer.delete({"kind": "Node", "metadata": {"name": "pool-a-03"}})
        wait_until(lambda: "pool-a-03" not in cache.fleet(dt.datetime.now(dt.timezone.utc), max_age=dt.timedelta(0)).nodes,
                   timeout=30, what="the deletion to arrive by watch")
    finally:
        cache.stop()
