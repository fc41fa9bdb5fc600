"""The HTTP endpoint against hostile and unlucky clients: bursts, silent and slow
clients, unsigned or malformed bodies, early hang-ups and chunked bodies. Every
request that should pass is really signed; the server is the real one, on a real port."""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from bot.http_server import HttpSettings
from testenv.fakeslack import signing
from testenv.install import wait_until
from tests.e2e.harness import CHANNEL, SECRET, HttpAnswer, send

BURST = 32


def _address(bot) -> tuple[str, int]:
    url = urllib.parse.urlsplit(bot.url)
    return url.hostname, url.port


def _silent_client(bot, *, announce_body: int = 100) -> socket.socket:
    """A client that sends the headers of a POST announcing a body, then nothing."""
    sock = socket.create_connection(_address(bot), timeout=10)
    sock.sendall(b"POST /slack/events HTTP/1.1\r\nHost: gpuops\r\nContent-Type: application/x-www-form-urlencoded"
                 b"\r\nContent-Length: " + str(announce_body).encode() + b"\r\n\r\n")
    return sock


def _closed_by_server(sock: socket.socket, *, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


# How long a test waits for the server to close a connection it must close: only a bound,
# so a loaded machine does not fail the test (the server's own timings are its settings).
CLOSED_WITHIN = 30
# The logger the endpoint says what it refused on.
ENDPOINT_LOG = "gpuops.bot.http"


class _Drip(threading.Thread):
    """Sends the headers of a request one byte every `every` seconds and never ends them,
    so its connection is never idle; stops when the server closes it or on `stop()`."""

    def __init__(self, bot, *, every: float) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(_address(bot), timeout=10)
        self._every = every
        self._done = threading.Event()

    def run(self) -> None:
        header = b"POST /slack/events HTTP/1.1\r\nHost: gpuops\r\nX-Slow: " + b"a" * 100_000
        for byte in header:
            try:
                self.sock.send(bytes([byte]))
            except OSError:
                return
            if self._done.wait(self._every):
                return

    def stop(self) -> None:
        self._done.set()
        self.join(10)
        self.sock.close()


def _records(caplog, level=logging.INFO) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= level]


# ------------------------------------------------------------------ load


def test_a_burst_of_concurrent_signed_commands_loses_none(http_bot):
    start = threading.Barrier(BURST)
    answers: list[HttpAnswer | Exception] = [None] * BURST  # type: ignore[list-item]

    def post(i: int) -> None:
        url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")
        body = signing.slash_command_body(text="help", user_id="U0DAVE", response_url=url)
        start.wait(10)
        try:
            answers[i] = send(http_bot.url, body)
        except Exception as err:  # noqa: BLE001 - a lost request is what is counted
            answers[i] = err

    threads = [threading.Thread(target=post, args=(i,)) for i in range(BURST)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    lost = [a for a in answers if not isinstance(a, HttpAnswer) or a.status != 200]
    assert lost == []
    http_bot.deliveries.wait_for(lambda ds: len(ds) == BURST)


# The request deadline cuts the silent clients off; the real request arrives whole in one
# packet, so no timing of this test's own can fail it on a loaded machine.
@pytest.mark.parametrize("http_settings", [HttpSettings(request_deadline=1, threads=2)])
def test_a_client_that_announces_a_body_and_sends_nothing_is_cut_off_and_holds_no_worker(http_bot):
    silent = [_silent_client(http_bot) for _ in range(4)]  # more than the server's threads
    try:
        # Meanwhile a real request is answered (however long a loaded machine takes to):
        # waiting for a body holds no thread.
        answer = send(http_bot.url, signing.slash_command_body(text="help", user_id="U0DAVE"), timeout=CLOSED_WITHIN)
        assert answer.status == 200
        assert all(_closed_by_server(s, within=CLOSED_WITHIN) for s in silent)
        http_bot.deliveries.wait_for(lambda ds: len(ds) == 1, timeout=CLOSED_WITHIN)
    finally:
        for s in silent:
            s.close()


@pytest.mark.parametrize("http_settings", [HttpSettings(request_deadline=1, report_every=0.5)])
def test_a_client_that_drips_its_headers_is_cut_off_at_the_request_deadline_though_never_idle(http_bot, caplog):
    caplog.set_level(logging.INFO)
    drip = _Drip(http_bot, every=0.2)  # far more often than the 10 s idle timeout
    drip.start()
    try:
        assert _closed_by_server(drip.sock, within=CLOSED_WITHIN)
        drip.join(CLOSED_WITHIN)
        assert not drip.is_alive()  # its next byte found the connection closed
        # Said once, without the client's bytes; the server goes on answering.
        wait_until(lambda: _records(caplog, logging.WARNING), timeout=CLOSED_WITHIN, what="the slow-client line")
        (line,) = _records(caplog, logging.WARNING)
        assert line.name == "gpuops.bot.http" and line.getMessage().startswith(
            "slow clients on the http port in the last 0.5 s: closed 1 connection(s) whose request was not in "
            "whole within 1 s of its first byte and 0")
        assert "aaaa" not in line.getMessage()
        assert send(http_bot.url, signing.slash_command_body(text="help", user_id="U0DAVE")).status == 200
    finally:
        drip.stop()


@pytest.mark.parametrize("http_settings", [HttpSettings(max_connections=2, read_timeout=30, request_deadline=30)])
def test_past_the_connection_cap_the_connection_waiting_longest_for_a_request_makes_room(http_bot, caplog):
    caplog.set_level(logging.INFO)
    oldest = _silent_client(http_bot)
    newer = _silent_client(http_bot)
    waiting = socket.create_connection(_address(http_bot), timeout=10)
    try:
        waiting.sendall(b"GET /healthz HTTP/1.1\r\nHost: gpuops\r\nConnection: close\r\n\r\n")
        waiting.settimeout(CLOSED_WITHIN)
        assert waiting.recv(1024).startswith(b"HTTP/1.1 200")  # long before the 30 s timeouts
        assert _closed_by_server(oldest, within=CLOSED_WITHIN)
        assert not _closed_by_server(newer, within=0.2)  # one was enough
        # Quiet: not waitress's line each time the connections are all taken (many a second
        # under slow clients); the guard's own comes once a minute at most.
        assert _records(caplog, logging.WARNING) == []
    finally:
        for s in (oldest, newer, waiting):
            s.close()


@pytest.mark.parametrize("setting", ["request_deadline", "make_room_after", "report_every"])
def test_a_guard_setting_of_zero_is_refused_with_its_name(setting):
    with pytest.raises(ValueError, match=f"HttpSettings.{setting} must be more than 0, not 0"):
        HttpSettings(**{setting: 0})


# ------------------------------------------------------------------ verified before parsed


def test_a_malformed_unsigned_body_gets_401_and_one_log_line(http_bot, caplog, capfd):
    caplog.set_level(logging.INFO)

    answer = send(http_bot.url, b"payload=%7Bthis-is-not-json", secret="not-the-signing-secret-at-all")

    assert answer.status == 401
    (line,) = _records(caplog)
    assert line.name == "gpuops.bot.http" and "signature does not match" in line.getMessage()
    assert "Traceback" not in capfd.readouterr().err
    assert http_bot.deliveries.all() == []


def test_a_request_without_signature_headers_gets_401(http_bot, caplog):
    caplog.set_level(logging.INFO)
    request = urllib.request.Request(http_bot.url, data=b"command=%2Fgpu&text=status", method="POST")

    try:
        urllib.request.urlopen(request, timeout=10)
        status = 200
    except urllib.error.HTTPError as err:
        status = err.code

    assert status == 401
    assert [r.getMessage() for r in _records(caplog)] == [
        "refused a request to /slack/events from 127.0.0.1 with 401: it has no X-Slack-Signature or "
        "X-Slack-Request-Timestamp header"]


def test_a_timestamp_that_is_not_a_number_gets_401_not_a_failed_command(http_bot, caplog):
    caplog.set_level(logging.INFO)
    body = signing.slash_command_body(text="status", user_id="U0DAVE")

    answer = send(http_bot.url, body, headers={"X-Slack-Request-Timestamp": "soon"}, timeout=CLOSED_WITHIN)

    assert answer.status == 401
    # The endpoint's own lines only: the fakes, and on a loaded machine the threads of
    # earlier tests still finishing, log on threads of their own.
    lines = [(r.levelno, r.getMessage()) for r in _records(caplog) if r.name == ENDPOINT_LOG]
    assert lines == [(logging.WARNING, "refused a request to /slack/events from 127.0.0.1 with 401: "
                                       "X-Slack-Request-Timestamp is not a number of seconds")]
    assert http_bot.deliveries.all() == []


def test_a_signed_body_that_is_not_a_slack_payload_gets_400_and_one_log_line(http_bot, caplog, capfd):
    caplog.set_level(logging.INFO)

    answers = [send(http_bot.url, b"payload=%7Bthis-is-not-json"), send(http_bot.url, b"\xff\xfe not utf-8"),
               send(http_bot.url, b"[1, 2]", content_type=signing.JSON)]

    assert [a.status for a in answers] == [400, 400, 400]
    lines = [r.getMessage() for r in _records(caplog)]
    assert len(lines) == 3 and all("with 400: the signed body is not a Slack payload" in m for m in lines)
    assert "Traceback" not in capfd.readouterr().err


def test_a_forged_body_is_never_written_to_the_log(http_bot, caplog):
    caplog.set_level(logging.DEBUG)
    forged = b"text=" + b"A" * (512 * 1024) + b"&token=" + b"B" * 40

    answer = send(http_bot.url, forged, secret="not-the-signing-secret-at-all")

    assert answer.status == 401
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert len(logged) < 1000 and "AAAA" not in logged and "BBBB" not in logged


def test_a_client_that_hangs_up_mid_body_leaves_no_trace_in_the_log(http_bot, caplog, capfd):
    caplog.set_level(logging.INFO)
    body = signing.slash_command_body(text="status", user_id="U0DAVE")
    signed = signing.sign(body, secret=SECRET, timestamp=int(time.time()))
    sock = socket.create_connection(_address(http_bot), timeout=10)
    sock.sendall(b"POST /slack/events HTTP/1.1\r\nHost: gpuops\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in signed.items()) + b"\r\n" + body[:10])
    sock.close()

    # The server goes on serving, and said nothing about the hang-up.
    assert send(http_bot.url, signing.slash_command_body(text="help", user_id="U0DAVE")).status == 200
    http_bot.deliveries.wait_for(lambda ds: len(ds) == 1)
    assert _records(caplog) == []
    assert "Traceback" not in capfd.readouterr().err


# ------------------------------------------------------------------ framing


def test_a_chunked_signed_body_is_read_whole_and_the_next_request_on_the_connection_is_its_own(http_bot):
    url = http_bot.slack.response_url(channel=CHANNEL, user="U0DAVE")
    body = signing.slash_command_body(text="status", user_id="U0DAVE", response_url=url)
    headers = {**signing.sign(body, secret=SECRET, timestamp=int(time.time())), "Content-Type": signing.FORM}
    connection = http.client.HTTPConnection(*_address(http_bot), timeout=10)
    try:
        connection.request("POST", "/slack/events", body=iter([body[:40], body[40:]]), headers=headers,
                           encode_chunked=True)
        first = connection.getresponse()
        assert (first.status, first.read()) == (200, b"")
        connection.request("GET", "/healthz")
        second = connection.getresponse()
        assert (second.status, second.read()) == (200, b"ok\n")
    finally:
        connection.close()
    assert "GPU fleet status" in http_bot.slack.wait_for_response(url).body["text"]


def test_healthz_answers_on_the_same_server_and_other_paths_are_not_found(http_bot):
    base = http_bot.url.rsplit("/slack", 1)[0]
    with urllib.request.urlopen(base + "/healthz", timeout=5) as answer:
        assert (answer.status, answer.read()) == (200, b"ok\n")
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(base + "/metrics", timeout=5)
    assert missing.value.code == 404
