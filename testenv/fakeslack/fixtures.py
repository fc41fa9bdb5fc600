"""pytest fixtures for the fake Slack; load them in a conftest or a test module with

    pytest_plugins = ["testenv.fakeslack.fixtures"]

`fake_slack` is a running FakeSlackWebApi with the default workspace; `fake_socket_mode`
is a running FakeSocketModeServer already attached to it (so apps.connections.open
hands out its URLs). Both stop when the test ends. Close a SocketModeClient (or bolt's
SocketModeHandler.client) with `fake_socket_mode.close_client(client)`: it is instant,
where the client's own close() takes seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testenv.fakeslack.socketmode import FakeSocketModeServer
from testenv.fakeslack.webapi import FakeSlackWebApi


@pytest.fixture
def fake_slack() -> Iterator[FakeSlackWebApi]:
    with FakeSlackWebApi() as fake:
        yield fake


@pytest.fixture
def fake_socket_mode(fake_slack: FakeSlackWebApi) -> Iterator[FakeSocketModeServer]:
    with FakeSocketModeServer(app_id=fake_slack.workspace.team.app_id) as server:
        fake_slack.attach_socket_mode(server)
        yield server
        fake_slack.attach_socket_mode(None)
