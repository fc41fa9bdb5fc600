"""`/gpu status <pool> --chart`: the leader samples each pool's capacity (its scheduler's
capacity job), and the chart of the last day goes with the status answer: in Slack as a
PNG uploaded where the answer is seen (the fake Slack enforces the upload API), in the
console as a file whose path it prints. An upload Slack refuses leaves the answer as it is."""

from __future__ import annotations

import datetime as dt
import functools
import http.server
import io
import subprocess
import threading
import time

import pytest
import yaml

from bot.console import run_console
from bot.scheduler import sample_capacity
from commands.catalog import dispatch
from commands.services import Services
from storage import capacity
from storage.database import open_database
from testenv.fakeslack import signing
from testenv.install import wait_until
from testenv.prometheus import prometheus_binary
from tests.dcgm_pages import QuietHandler
from tests.e2e.harness import CHANNEL, StaticFleet, build_demo_fleet, demo_config, send, text_of
from workflows.prometheus.client import Endpoint, PrometheusUnavailable, range_query

UTC = dt.timezone.utc
PNG = b"\x89PNG\r\n\x1a\n"


def sampled_for_a_day(runtime) -> None:
    """The capacity job as the leader runs it, every hour over the last day."""
    now = dt.datetime.now(UTC)
    for hours in range(24, -1, -1):
        sample_capacity(runtime, now - dt.timedelta(hours=hours))


def test_the_leaders_samples_hold_each_pools_gpus_advertised_and_out(runtime):
    sampled_for_a_day(runtime)

    samples = capacity.of_pool(runtime.database.get(), cluster=runtime.config.cluster_name or "", pool="serving-a",
                               since=dt.datetime.now(UTC) - dt.timedelta(days=2))
    fleet = runtime.services().fleet.fleet(dt.datetime.now(UTC))
    pool = fleet.pool("serving-a")
    assert len(samples) == 25
    assert {(s.advertised, s.out) for s in samples} == {(pool.gpus_advertised, 0)}


def test_status_with_chart_answers_as_usual_and_uploads_the_pools_capacity_to_the_users_dm(http_bot):
    sampled_for_a_day(http_bot.runtime)
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="status serving-a --chart", user_id="U0DAVE",
                                                  response_url=url))

    post = http_bot.slack.wait_for_response(url)
    assert post.ok and "serving-a" in text_of(post.body["blocks"])
    http_bot.slack.wait_for("files.completeUploadExternal")
    (upload,) = http_bot.slack.workspace.files()
    assert upload.completed and upload.channel == http_bot.slack.last("conversations.open").response["channel"]["id"]
    assert upload.filename == "serving-a-capacity.png" and "serving-a" in (upload.title or "")
    assert upload.content is not None and upload.content.startswith(PNG) and 10_000 < len(upload.content) < 500_000


def test_status_without_chart_uploads_nothing(http_bot):
    sampled_for_a_day(http_bot.runtime)
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="status serving-a", user_id="U0DAVE", response_url=url))

    assert http_bot.slack.wait_for_response(url).ok
    assert not http_bot.slack.calls("files.getUploadURLExternal")


def test_a_chart_slack_refuses_to_take_leaves_the_answer_intact(http_bot):
    http_bot.slack.fail_next("files.getUploadURLExternal", "missing_scope", status=200)
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="status serving-a --chart", user_id="U0DAVE",
                                                  response_url=url))

    post = http_bot.slack.wait_for_response(url)
    assert post.ok and "serving-a" in text_of(post.body["blocks"])
    assert http_bot.slack.wait_for("files.getUploadURLExternal").error == "missing_scope"
    assert not [f for f in http_bot.slack.workspace.files() if f.completed]


def test_chart_without_a_pool_says_to_name_one(http_bot):
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")

    send(http_bot.url, signing.slash_command_body(text="status --chart", user_id="U0DAVE", response_url=url))

    assert "name the pool" in text_of(http_bot.slack.wait_for_response(url).body["blocks"])


def test_the_console_writes_the_chart_to_a_file_and_prints_its_path(runtime, tmp_path):
    sampled_for_a_day(runtime)
    out = io.StringIO()

    code = run_console(["/gpu status serving-a --chart"], runtime=runtime, out=out, as_user="U0DAVE",
                       pictures=tmp_path)

    path = tmp_path / "serving-a-capacity.png"
    assert code == 0 and f"Picture saved to {path}" in out.getvalue()
    assert path.read_bytes().startswith(PNG)


# ------------------------------------------------------------------ from Prometheus

GPUOPS_PAGE = """# TYPE gpuops_pool_gpus gauge
gpuops_pool_gpus{pool="serving-a",state="physical"} 24
gpuops_pool_gpus{pool="serving-a",state="advertised"} 16
gpuops_pool_gpus{pool="training-a",state="advertised"} 64
# TYPE gpuops_pool_gpus_out gauge
gpuops_pool_gpus_out{pool="serving-a",by="gpuops"} 8
gpuops_pool_gpus_out{pool="serving-a",by="hand"} 0
"""


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus scraping a page of gpuops' capacity gauges every second."""
    tmp_path = tmp_path_factory.mktemp("capacity")
    served = tmp_path / "pages"
    served.mkdir()
    (served / "metrics.txt").write_text(GPUOPS_PAGE)
    page = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(served)))
    threading.Thread(target=page.serve_forever, daemon=True).start()
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler) as probe:
        web = probe.server_address[1]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "gpuops", "metrics_path": "/metrics.txt",
         "static_configs": [{"targets": [f"127.0.0.1:{page.server_address[1]}"]}]}]}))
    process = subprocess.Popen([str(prometheus_binary()), f"--config.file={config}",
                                f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{web}"

    def scraped() -> bool:
        """Scraped before the last whole second: a chart asks up to then."""
        end = float(int(time.time()))
        try:
            return bool(range_query(Endpoint(url=url), "gpuops_pool_gpus_out", start=end - 60, end=end, step=60))
        except PrometheusUnavailable:
            return False  # still starting

    try:
        wait_until(scraped, timeout=60, what="Prometheus to scrape gpuops' gauges")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        page.shutdown()
        page.server_close()


def chart_of(config, tmp_path, text: str = "status serving-a --chart"):
    fleet = StaticFleet(build_demo_fleet(nodes=6, unhealthy=0, config=config))
    with open_database(tmp_path / "db") as db:
        services = Services.on_database(config=config, fleet=fleet, database=db,
                                        signals=config.signals.service() if config.signals else None)
        return dispatch(text, actor=config.actor("U0DAVE"), services=services, now=dt.datetime.now(UTC))


def test_where_prometheus_is_configured_the_chart_reads_gpuops_gauges_from_it(prometheus, tmp_path):
    config = demo_config(signals={"prometheus": {"url": prometheus}})

    reply = chart_of(config, tmp_path)

    chart = reply.picture
    assert reply.ok and chart is not None and chart.source == f"Prometheus at {prometheus}"
    assert chart.points and {(p.advertised, p.out) for p in chart.points} == {(16, 8)}


def test_a_prometheus_that_does_not_answer_leaves_the_chart_to_gpuops_samples_and_says_why(tmp_path):
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler) as probe:
        closed = probe.server_address[1]
    config = demo_config(signals={"prometheus": {"url": f"http://127.0.0.1:{closed}"}})

    reply = chart_of(config, tmp_path)

    assert reply.ok and reply.picture is not None
    assert reply.picture.source.startswith("gpuops' samples; ") and "cannot be reached" in reply.picture.source
