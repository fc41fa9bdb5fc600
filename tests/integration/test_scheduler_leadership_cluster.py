"""`gpuops run`'s composition on a real API server (the local control plane): two
replicas built as `gpuops run` builds them elect one leader through the Kubernetes
Lease; the leader runs the engine, the scheduler, the notifier and the Kubernetes Events
sender, the other runs none of them, and when the leader stops (handing the lease back)
the other takes over."""

from __future__ import annotations

from bot.slack_api import web_client
from bot.wiring import build_runtime


def test_of_two_replicas_only_the_lease_holder_runs_the_leaders_work_and_the_other_takes_over_when_it_stops(
        cluster, config, slack, tmp_path, monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "default")
    client = web_client(slack.bot_token, base_url=slack.base_url)
    replicas = [build_runtime(config, kubeconfig=str(cluster.kubeconfig), context="admin",
                              database=tmp_path / "gpuops.db") for _ in range(2)]
    first, second = replicas
    try:
        leader = first.start_background("replica-a", slack=client)
        leader.wait_until(True, timeout=20)
        assert {w.name for w in leader.workers} == {"notifier", "scheduler", "engine", "events"}

        follower = second.start_background("replica-b", slack=client)
        follower.wait_until(False, checks=3, timeout=20)
        assert follower.workers == [] and follower.terms == 0

        first.close()  # stops its work and hands the lease back
        assert not leader.leading
        follower.wait_until(True, timeout=20)
        assert {w.name for w in follower.workers} == {"notifier", "scheduler", "engine", "events"}
    finally:
        for runtime in replicas:
            runtime.close()


def test_a_leader_that_loses_its_database_hands_the_lease_back_and_the_replica_that_reaches_it_takes_over(
        cluster, config, slack, tmp_path, monkeypatch):
    # One database file; replica A reaches it through a link that is then taken away (its
    # volume gone), replica B directly. A's open connections go on answering: the probe
    # must notice, A must stop and give the Lease up, and B must take it over.
    monkeypatch.setenv("POD_NAMESPACE", "default")
    client = web_client(slack.bot_token, base_url=slack.base_url)
    shared = tmp_path / "shared" / "gpuops.db"
    second = build_runtime(config, kubeconfig=str(cluster.kubeconfig), context="admin", database=shared)
    through = tmp_path / "a" / "gpuops.db"
    through.parent.mkdir()
    through.symlink_to(shared)
    first = build_runtime(config, kubeconfig=str(cluster.kubeconfig), context="admin", database=through)
    try:
        leader = first.start_background("replica-a", slack=client)
        leader.wait_until(True, timeout=20)
        follower = second.start_background("replica-b", slack=client)
        follower.wait_until(False, checks=3, timeout=20)

        through.unlink()
        through.mkdir()  # nothing can make a new file there meanwhile
        leader.wait_until(False, timeout=20)
        assert leader.workers == [] and leader.standing_down == f"FileNotFoundError: {through} is not there"
        follower.wait_until(True, timeout=20)
        assert {w.name for w in follower.workers} == {"notifier", "scheduler", "engine", "events"}
        leader.wait_until(False, checks=leader.checks + 3, timeout=20)  # and A stays out
    finally:
        for runtime in (first, second):
            runtime.close()
