"""Roles as configuration gives them: what each role implies, roles held for one pool
only, and the sentence a refusal says."""

from __future__ import annotations

import pytest

from workflows.access import AccessDenied, Actor, Role, UserId, public_name, require

eve = Actor(user_id=UserId("U0EVE"), name="Eve", roles=frozenset({Role.VIEWER}))
pat = Actor(user_id=UserId("U0PAT"), name="Pat", pool_roles={"train-a": frozenset({Role.OPERATOR})})
dan = Actor(user_id=UserId("U0DAN"), name="Dan", roles=frozenset({Role.ADMIN}))


def test_a_refusal_names_the_role_the_pool_and_what_the_person_holds():
    with pytest.raises(AccessDenied) as refused:
        require(eve, Role.OPERATOR, action="A run being paused", pool="train-a")
    assert str(refused.value) == "A run being paused needs the operator role for pool train-a; Eve has viewer"


def test_a_refusal_for_an_action_on_no_pool_names_no_pool():
    with pytest.raises(AccessDenied) as refused:
        require(eve, Role.ADMIN, action="Exporting the audit log")
    assert str(refused.value) == "Exporting the audit log needs the admin role; Eve has viewer"


def test_a_role_held_for_one_pool_counts_there_only_and_is_not_listed_as_held_globally():
    require(pat, Role.OPERATOR, action="Starting a run", pool="train-a")
    with pytest.raises(AccessDenied, match="for pool serving-a; Pat has no role$"):
        require(pat, Role.OPERATOR, action="Starting a run", pool="serving-a")
    assert pat.has_anywhere(Role.OPERATOR) and pat.has(Role.VIEWER, pool="train-a")
    assert not pat.has(Role.OPERATOR) and not pat.has_anywhere(Role.APPROVER)


def test_an_admin_holds_every_role_everywhere_and_a_viewer_only_reads():
    assert all(dan.has(role, pool="any") and dan.has(role) for role in Role)
    assert [role for role in Role if eve.has(role, pool="train-a")] == [Role.VIEWER]


@pytest.mark.parametrize(("role", "holds"), [
    (Role.VIEWER, {Role.VIEWER}),
    (Role.OPERATOR, {Role.OPERATOR, Role.VIEWER}),
    (Role.APPROVER, {Role.APPROVER, Role.VIEWER}),
    (Role.ADMIN, set(Role)),
])
def test_operators_and_approvers_also_read_and_neither_holds_the_others_role(role, holds):
    person = Actor(user_id=UserId("U0ANY"), name="Any", roles=frozenset({role}))
    for_one_pool = Actor(user_id=UserId("U0ONE"), name="One", pool_roles={"train-a": frozenset({role})})

    assert {r for r in Role if person.has(r)} == holds
    assert {r for r in Role if for_one_pool.has(r, pool="train-a")} == holds
    assert not any(for_one_pool.has(r, pool="serving-a") for r in Role)


def test_people_are_named_by_configured_name_by_mention_or_off_slack_by_their_id():
    names = {"U0ADA": "ada"}
    assert public_name("U0ADA", names=names) == "ada"
    assert public_name("U0BOB", names=names, fallback="Bob the renamer") == "<@U0BOB>"
    assert public_name("root", names=names, fallback="root@laptop") == "root@laptop"
    assert public_name("root", names=names) == "root"
