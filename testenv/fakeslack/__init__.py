"""A fake Slack for tests: everything the bot talks to, running on 127.0.0.1 port 0.

What belongs here:
- `webapi`: the Web API (`/api/<method>`), `response_url` endpoints and file uploads,
  recording every call and enforcing the limits Slack enforces;
- `blockkit`: the Block Kit limits, as pure functions returning precise error texts;
- `workspace`: the Slack-side state (channels, users, user groups, messages, views,
  files) that the Web API reads and changes;
- `methods`: one function per Web API method the fake answers;
- `socketmode` and `websocket`: a Socket Mode server (stdlib WebSocket) that slack_sdk's
  builtin SocketModeClient connects to;
- `signing`: what Slack sends to an app in HTTP mode (payload builders and signatures);
- `fixtures`: pytest fixtures (import them into a test module or a conftest).

Nothing here imports slack_sdk or slack_bolt: the fake speaks Slack's wire format, so
the bot's real Slack clients are what the tests exercise.
"""

from testenv.fakeslack.socketmode import FakeSocketModeServer
from testenv.fakeslack.webapi import ApiCall, FakeSlackWebApi, ResponseUrlPost
from testenv.fakeslack.workspace import Workspace

__all__ = ["ApiCall", "FakeSlackWebApi", "FakeSocketModeServer", "ResponseUrlPost", "Workspace"]
