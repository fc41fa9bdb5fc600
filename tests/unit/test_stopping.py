"""Stopping `gpuops run` does not wait for good on a close that hangs: slack_sdk's Socket
Mode close() joins a receiving thread a dropped socket can leave blocked, and the Lease
must still be given back before the pod's grace period ends."""

from __future__ import annotations

import datetime as dt
import threading

from bot import cli


def test_a_close_that_hangs_is_left_behind_after_the_bound():
    release = threading.Event()
    try:
        assert cli._within(release.wait, dt.timedelta(milliseconds=100)) is False
    finally:
        release.set()


def test_a_close_that_ends_in_time_is_waited_for():
    closed = []
    assert cli._within(lambda: closed.append(True), dt.timedelta(seconds=10)) is True
    assert closed == [True]


def test_the_bound_leaves_room_in_kubernetes_default_grace_period():
    assert cli.SOCKET_CLOSE_WAIT < dt.timedelta(seconds=30) / 2
