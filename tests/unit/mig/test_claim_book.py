"""The node's claim book by its own clock: an apply admitted under a claim starts only while
that very claim holds, and binds that one (a plan takes time: the claim may lapse or be taken
again, by another caller, under the same holder, meanwhile)."""

from __future__ import annotations

import pytest

from agent.errors import Claimed, PermissionDenied
from agent.mig.claim import ClaimBook

A, B = '["spiffe://a"]', '["spiffe://b"]'


def book_at(t: list[float]) -> ClaimBook:
    return ClaimBook(clock=lambda: t[0])


def test_an_apply_never_binds_the_claim_another_caller_took_again_under_its_holder() -> None:
    t = [0.0]
    book = book_at(t)
    book.take("rollout-h", "r1", "1", 30, set(), A)
    admitted = book.admit("rollout-h", set(), A)
    t[0] += 31  # the plan outlasted the claim
    book.take("rollout-h", "r2", "1", 300, set(), B)
    with pytest.raises(Claimed, match=r"claimed by rollout-h .* since the apply was admitted"):
        book.hold(admitted, set())
    # Refused before any operation: B's claim is as it was, unbound, still B's.
    claim = book.current(set())
    assert claim is not None
    assert (claim.caller, claim.rollout, claim.operation) == (B, "r2", "")


def test_an_apply_whose_claim_lapsed_while_it_planned_starts_nothing() -> None:
    t = [0.0]
    book = book_at(t)
    book.take("coord-a", "r1", "1", 30, set(), A)
    admitted = book.admit("coord-a", set(), A)
    t[0] += 31
    with pytest.raises(Claimed, match="claim of coord-a lapsed while the apply was planned"):
        book.hold(admitted, set())
    # Nor does the same caller's claim taken afresh stand for it: another node may have been
    # counted in between.
    book.take("coord-a", "r1", "1", 30, set(), A)
    with pytest.raises(Claimed):
        book.hold(admitted, set())
    assert book.current(set()) is not None


def test_an_unclaimed_apply_is_refused_when_a_claim_was_taken_while_it_planned() -> None:
    t = [0.0]
    book = book_at(t)
    assert book.admit("", set(), A) is None
    book.take("coord-b", "r2", "1", 30, set(), B)
    with pytest.raises(Claimed, match="claimed by coord-b"):
        book.hold(None, set())


def test_a_renewal_is_the_same_claim_and_a_held_claim_neither_lapses_nor_is_taken() -> None:
    t = [0.0]
    book = book_at(t)
    book.take("coord-a", "r1", "1", 30, set(), A)
    admitted = book.admit("coord-a", set(), A)
    t[0] += 20
    book.take("coord-a", "r1", "1", 30, set(), A)  # renewed while it planned
    book.hold(admitted, set())
    t[0] += 60  # the operation's creation is slow: the held claim stays
    with pytest.raises(Claimed):
        book.take("coord-b", "r2", "1", 30, set(), B)
    assert not book.release("coord-a", A)
    book.bind(admitted, "operations/x")
    claim = book.current({"operations/x"})
    assert claim is not None and (claim.holder, claim.operation) == ("coord-a", "operations/x")


def test_while_an_unclaimed_apply_starts_no_claim_is_taken_and_a_failed_start_frees_it() -> None:
    t = [0.0]
    book = book_at(t)
    book.hold(book.admit("", set(), A), set())
    with pytest.raises(Exception, match="a MIG apply is starting"):
        book.take("coord-b", "r2", "1", 30, set(), B)
    book.unhold()  # its operation was never created
    assert book.take("coord-b", "r2", "1", 30, set(), B).holder == "coord-b"


def test_a_caller_without_an_identity_takes_no_claim() -> None:
    book = ClaimBook()
    with pytest.raises(PermissionDenied, match="no URI or DNS SAN"):
        book.take("coord-a", "r1", "1", 30, set(), "")
    assert book.current(set()) is None
