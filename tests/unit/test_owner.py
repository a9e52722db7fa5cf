"""Who owns work after someone asks for it again (agent/owner.py `claimed_by`)."""

from __future__ import annotations

import pytest

from agent.errors import PermissionDenied
from agent.owner import ADMIN, Actor, check_may_undo, claimed_by

ADMIN_CALLER = Actor("local", ADMIN)
TEAM = Actor("spiffe://team", "prewarm")
OTHER_TEAM = Actor("spiffe://other-team", "prewarm")


def test_an_admin_who_asks_again_takes_a_lower_roles_work_over() -> None:
    owner = claimed_by(ADMIN_CALLER, TEAM.identity, TEAM.role)
    assert owner == ("local", ADMIN)
    with pytest.raises(PermissionDenied, match="belongs to an admin caller"):
        check_may_undo(TEAM, owner[1], "model", "evict")


def test_a_lower_roles_repeat_leaves_the_first_owner() -> None:
    assert claimed_by(TEAM, "local", ADMIN) == ("local", ADMIN)
    assert claimed_by(OTHER_TEAM, TEAM.identity, TEAM.role) == (TEAM.identity, TEAM.role)
    assert claimed_by(ADMIN_CALLER, "coordinator", ADMIN) == ("coordinator", ADMIN)


def test_work_without_an_owner_goes_to_whoever_asks_and_the_agent_claims_nothing() -> None:
    assert claimed_by(TEAM, None, None) == (TEAM.identity, TEAM.role)
    assert claimed_by(None, TEAM.identity, TEAM.role) == (TEAM.identity, TEAM.role)
    assert claimed_by(None, None, None) == (None, None)
