"""Stopping the HTTP server: the loop closes waitress's wake-up pipe when it ends, and a
stop that came after (or a second stop, as a test fixture and a signal handler both do)
must not write to that closed descriptor."""

from __future__ import annotations

import urllib.request

from bot.http_server import HEALTH_PATH, WaitressServer


def _app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def test_a_server_stopped_twice_stops_once_and_raises_nothing():
    server = WaitressServer(_app, host="127.0.0.1", port=0, name="stop-test").start()
    with urllib.request.urlopen(server.base_url + HEALTH_PATH, timeout=10) as answer:
        assert answer.status == 200
    server.stop()
    server.stop()  # the loop has closed its trigger: nothing to wake, nothing written
    assert server.open_connections == 0


def test_a_server_never_started_stops_without_error():
    server = WaitressServer(_app, host="127.0.0.1", port=0, name="stop-test")
    server.stop()
    server.stop()
