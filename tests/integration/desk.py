"""People at Slack, for tests of requests that run on the control plane: alice asks, bob
and carol approve; an approved request's run starts as the scheduler starts it, and an
engine runs it as `user` (the bot's ServiceAccount)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import html
from typing import Any

import yaml

from bot.clicks import Click, press
from bot.slack_api import SlackApi, web_client
from bot.slack_app import SlackBot
from bot.wiring import Runtime
from commands.catalog import dispatch
from commands.services import Services
from testenv.fakeslack import FakeSlackWebApi
from testenv.bot_identity import RBAC, grant_bot_rbac, revoke_bot_rbac
from testenv.install import wait_until
from testenv.operator import NAMESPACE as OPERATOR_NAMESPACE
from tests.integration import engine_harness as h
from workflows.config import GpuopsConfig
from workflows.engine.runs import RunService


# Who is who at the desk, as a configuration's `access`: alice asks, bob and carol approve.
ACCESS = {"users": {"U0ALICE": ["operator"], "U0BOB": ["approver"], "U0CAROL": ["approver"]},
          "names": {"U0ALICE": "alice", "U0BOB": "bob", "U0CAROL": "carol"}}


def bot_granted_for_the_test(cluster) -> Iterator[str]:
    """A test's `as_bot` fixture: the bot's RBAC for the test, taken back after it."""
    installer = cluster.installer()
    try:
        yield grant_bot_rbac(installer)
    finally:
        revoke_bot_rbac(installer)


@contextmanager
def bot_rbac_granted(installer) -> Iterator[str]:
    """`grant_bot_rbac` for the length of a test, taking away after what it made (grant
    after the fleet: the operator's namespace must be the fleet's own)."""
    docs = list(yaml.safe_load_all(RBAC.read_text()))
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                  for n in sorted({d["metadata"].get("namespace") for d in docs} - {None})]
    made = [d for d in docs + namespaces if not installer.exists(d)]
    try:
        yield grant_bot_rbac(installer)
    finally:
        for doc in made:
            if installer.exists(doc):
                installer.delete(doc)
        for doc in made:  # the next test's grant must find its namespace gone, not going
            if doc["kind"] == "Namespace":
                wait_until(lambda doc=doc: not installer.exists(doc), timeout=60,
                           what=f"namespace {doc['metadata']['name']} made for this test to go")


@contextmanager
def operator_namespace_as_found(installer) -> Iterator[None]:
    """Leave the operator's namespace as found: a test that makes it (to hold a Role there)
    removes it, since a fleet's operator installs there next and must find it gone, as a
    fleet leaves it (else the next fleet's objects, its faults ConfigMap among them, are
    found already there and kept)."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}
    had = installer.exists(namespace)
    try:
        yield
    finally:
        if not had:
            installer.delete(namespace)
            wait_until(lambda: not installer.exists(namespace), timeout=60,
                       what="the operator's namespace made for this test to go")


class Desk:
    def __init__(self, cluster, db, services: Services, config: GpuopsConfig, *, user: str = "bot") -> None:
        self.cluster, self.db, self.services, self.config, self.user = cluster, db, services, config, user

    def say(self, who: str, text: str):
        return dispatch(text, actor=self.config.actor(who), services=self.services, now=h.now(), channel="C0OPS")

    def click(self, button, who: str = "U0ALICE"):
        return press(Click(action=button.action, value=button.value, actor=self.config.actor(who), now=h.now()),
                     self.services).notice

    def rollback_request(self, run_id: str, pool: str) -> str:
        found = self.services.requests.rollback_asked(run_id, pool=pool)  # type: ignore[union-attr]
        assert found is not None, f"no rollback of {run_id} asked for"
        return found.id

    def approve_and_run(self, request_id: str, *, timeout: float = 240):
        view = self.services.requests.get(request_id)  # type: ignore[union-attr]
        for approver in ("U0BOB", "U0CAROL"):
            answer = self.say(approver, f"approve {view.id} {view.short_hash}")
            assert answer.ok, answer.summary
        run = RunService(self.db, requests=self.services.requests).start(view.id, dry_run=False, now=h.now(),
                                                                         plan_hash=view.plan_hash)
        with h.EngineThread(self.cluster.kubeconfig, self.db.path, user=self.user):
            return h.wait_run(self.db, run.id, timeout=timeout)


def app_home(runtime: Runtime, user: str, name: str) -> str:
    """What `user` reads on App Home as the bot publishes it (views.publish to a fake
    Slack), unescaped, one line per text."""
    with FakeSlackWebApi() as slack:
        slack.workspace.add_user(user, name=name)
        bot = SlackBot(runtime, SlackApi(web_client(slack.bot_token, base_url=slack.base_url)))
        assert bot.publish_home(user)
        view = slack.workspace.home_view(user)
    assert view is not None
    parts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("type") in ("plain_text", "mrkdwn") and "text" in value:
                parts.append(html.unescape(value["text"]))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(view["blocks"])
    return "\n".join(parts)
