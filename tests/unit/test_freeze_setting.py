"""Setting a freeze, where the commands around it leave things open: the refusal a
non-admin gets from the service itself, word for word; a freeze ending exactly now refused
as not in the future (one ending a second later is set); a name that is no pool answered
with the pools it is close to, down to a loose match ("serving" for serve-b) and never
more than the three closest; someone the configuration does not name recorded by who they
really are; and a Slack delivery run again after its freeze replaced another answered
with that same reply, the replaced freeze included. The grammar and the audit rows are in
test_freezes.py and test_freeze_audit.py; lifting in test_freeze_records.py."""

from __future__ import annotations

import datetime as dt

import pytest

from commands.services import Services
from tests.unit.test_freeze_records import ROOT, db, service  # noqa: F401 (the fixture)
from tests.unit.test_freezes import ALICE, CONFIG, NOW, audit_actions, freeze_rows, gpu, services  # noqa: F401
from workflows.access import AccessDenied
from workflows.pools.freezes import FreezeRefused, FreezeService


def test_the_service_itself_refuses_a_non_admin_saying_freezing_needs_the_admin_role(db):  # noqa: F811
    with pytest.raises(AccessDenied) as denied:
        service(db).set(ALICE, target="cluster", until=NOW + dt.timedelta(hours=1), reason="let me",
                        let_running_finish=False, now=NOW)
    assert str(denied.value) == "Freezing changes needs the admin role; alice has operator, viewer"
    assert service(db).in_force(NOW) == []


def test_a_freeze_ending_exactly_now_is_refused_as_not_in_the_future_and_one_a_second_later_is_set(services):  # noqa: F811
    refused = gpu(services, "U0ERIN", "freeze cluster until today 10:00 too late")
    assert not refused.ok
    assert refused.summary == ("2026-12-02 10:00 UTC is not in the future (it is 2026-12-02 10:00 UTC now); a freeze "
                               "needs an end after now, e.g. until tomorrow 09:00.")
    assert freeze_rows(services) == [] and audit_actions(services) == []

    a_second_before = NOW - dt.timedelta(seconds=1)
    assert gpu(services, "U0ERIN", "freeze cluster until today 10:00 just in time", a_second_before).ok
    assert [(f["target"], f["reason"]) for f in freeze_rows(services)] == [("cluster", "just in time")]


def test_a_name_only_loosely_like_a_pool_is_refused_with_that_pool_as_the_suggestion(services):  # noqa: F811
    # "serving" is the kind of pool serve-b is; it is a little over half like its name.
    reply = gpu(services, "U0ERIN", "freeze serving until 09:00")
    assert not reply.ok
    assert reply.summary == ("'serving' is neither `cluster` nor a configured pool; pools: serve-b and train-a; "
                             "did you mean serve-b?")
    assert freeze_rows(services) == []


def test_an_unknown_pool_is_answered_with_at_most_the_three_closest_pools_the_closest_first(db):  # noqa: F811
    gpus = FreezeService(db, pools=["train-h100", "train-h200", "train-a100", "train-l40s"])
    with pytest.raises(FreezeRefused) as refused:
        gpus.check_target("train-h10")
    said = str(refused.value)
    assert said.startswith("'train-h10' is neither `cluster` nor a configured pool; "
                           "pools: train-a100, train-h100, train-h200 and train-l40s; did you mean ")
    suggested = said.split("; did you mean ")[1].removesuffix("?").split(" or ")
    # train-l40s is close too (it shares "train-" and a digit), but the furthest of the four.
    assert suggested[0] == "train-h100" and sorted(suggested) == ["train-a100", "train-h100", "train-h200"]


def test_a_freeze_set_from_the_command_line_is_by_the_name_it_gave_not_its_id(db):  # noqa: F811
    done = service(db).set(ROOT, target="train-a", until=NOW + dt.timedelta(hours=2), reason="kernel CVE",
                           let_running_finish=False, now=NOW)
    assert (done.freeze.set_by, done.freeze.set_by_name) == ("cli:root", "root")
    assert service(db).in_force(NOW)[0].set_by_name == "root"


def test_a_delivery_run_again_after_its_freeze_replaced_another_says_again_which_it_replaced(services):  # noqa: F811
    assert gpu(services, "U0ERIN", "freeze serve-b until 12:00 first").ok
    same = Services.on_database(config=CONFIG, fleet=services.fleet, database=services.database,
                                delivery="/gpu:U0ERIN:1002.1")
    words = "freeze serve-b until 18:00 longer"
    first = gpu(same, "U0ERIN", words)
    again = gpu(same, "U0ERIN", words, NOW + dt.timedelta(seconds=15))

    assert first.ok and again.ok
    replaced = ("Replaces the freeze that was in force: Pool serve-b is frozen by erin until 2026-12-02 12:00 UTC: "
                "first")
    assert first.sections[0].bullets[0].startswith(replaced)
    assert (again.title, again.summary, again.sections) == (first.title, first.summary, first.sections)
    assert audit_actions(services) == ["freeze.set", "freeze.lifted", "freeze.set"]
