"""A run's timeline on the real control plane: a drain of three nodes in two waves runs
to its end, the notifier delivers its thread to the fake Slack, and the run's last word is
followed by its timeline, uploaded into the thread: a row per node, its four steps as bars,
both waves."""

from __future__ import annotations

from commands.pictures import run_timeline
from storage import requests as stored_requests
from storage import steps as stored_steps
from bot.notifier import Notifier, OutboxSlack
from bot.slack_api import web_client
from bot.wiring import runtime_from_fleet_source
from testenv import fleet as fl
from testenv.install import wait_until
from testenv.summary import advertised
from tests.e2e.harness import StaticFleet, build_demo_fleet
from tests.integration import engine_harness as h


def test_a_drain_that_ran_to_its_end_posts_its_timeline_in_its_thread(fleet, cluster, db, fake_slack):
    fleet(fl.FleetSpec(name="drain", system_nodes=0, pools=(fl.PoolSpec(name="drain", nodes=3),)))
    installer = cluster.installer()
    wait_until(lambda: all(advertised(h.node(installer, n)) == 8 for n in ("drain-01", "drain-02", "drain-03")),
               timeout=60, what="the drain pool's nodes to advertise their GPUs")
    fake_slack.workspace.add_channel(h.CHANNEL, name="gpuops")

    run = h.start_run(db, h.plan("drain", "drain", [["drain-01", "drain-02"], ["drain-03"]]))
    with h.EngineThread(cluster.kubeconfig, db.path):
        finished = h.wait_run(db, run.id)
    assert finished.state == "succeeded", finished.halted_reason

    runtime = runtime_from_fleet_source(h.CONFIG, StaticFleet(build_demo_fleet(nodes=3, unhealthy=0, config=h.CONFIG)),
                                        db.path)
    try:
        notifier = Notifier(runtime, OutboxSlack.like(web_client(fake_slack.bot_token, base_url=fake_slack.base_url)))
        while notifier.deliver_due():
            pass
    finally:
        runtime.close()

    thread = stored_requests.get(db, id=run.request_id).thread_ts
    (picture,) = fake_slack.workspace.files()
    assert picture.completed and picture.channel == h.CHANNEL and picture.thread_ts == thread
    assert picture.filename == f"{run.id}-timeline.png" and picture.content.startswith(b"\x89PNG")
    last_word = fake_slack.last("chat.postMessage")
    assert last_word.args.get("thread_ts") == thread and run.id in last_word.args["text"]
    timeline = run_timeline(finished, stored_steps.for_run(db, run_id=run.id),
                            stored_requests.get(db, id=run.request_id))
    assert [(r.node, r.wave) for r in timeline.rows] == [("drain-01", 0), ("drain-02", 0), ("drain-03", 1)]
    assert all([b.kind for b in r.bars] == ["cordon", "evict", "wait-for", "uncordon"] for r in timeline.rows)
    assert [w.wave for w in timeline.waves] == [0, 1] and timeline.waves[0].end <= timeline.waves[1].start
