"""Whose a MIG claim is: a caller's SANs, told apart exactly (a SAN may hold a comma), and no
claim at all for a caller with none (every certificate without a URI or DNS SAN, admitted by a
``*`` role, would hold it alike)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent._proto.gpuagent.v1 import mig_pb2
from agent.api.auth import claimant_of
from agent.api.mig import MigServicer
from agent.errors import PermissionDenied


class _Context:
    def __init__(self, uris: tuple[str, ...] = (), dns: tuple[str, ...] = ()) -> None:
        self._auth = {
            "transport_security_type": [b"ssl"],
            "peer_uri": [u.encode() for u in uris],
            "peer_dns": [d.encode() for d in dns],
        }

    def peer(self) -> str:
        return "ipv4:10.0.0.7:40000"

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth


class _Runner:
    async def list(self, *_args: Any) -> list[Any]:
        return []


def servicer() -> MigServicer:
    return MigServicer(None, _Runner(), lambda: None, lambda: None, lambda _f: None)  # type: ignore[arg-type]


def test_a_uri_and_a_dns_san_are_not_one_uri_san_holding_a_comma() -> None:
    one = claimant_of(_Context(uris=("spiffe://c/ns/a,b.example",)))  # type: ignore[arg-type]
    two = claimant_of(_Context(uris=("spiffe://c/ns/a",), dns=("b.example",)))  # type: ignore[arg-type]
    assert one != two
    assert one == '["spiffe://c/ns/a,b.example"]'  # readable where it is shown


def test_the_other_caller_of_a_colliding_name_may_not_release_the_claim() -> None:
    mig = servicer()
    claim = mig_pb2.ClaimMigRequest(holder="coord-a", rollout="r1")
    taker = _Context(uris=("spiffe://c/ns/a,b.example",))
    asyncio.run(mig.ClaimMig(claim, taker))  # type: ignore[arg-type]
    other = _Context(uris=("spiffe://c/ns/a",), dns=("b.example",))
    release = mig_pb2.ReleaseMigClaimRequest(holder="coord-a")
    with pytest.raises(PermissionDenied, match="taken by another caller"):
        asyncio.run(mig.ReleaseMigClaim(release, other))  # type: ignore[arg-type]
    assert asyncio.run(mig.ReleaseMigClaim(release, taker)).released  # type: ignore[arg-type]


def test_a_caller_without_a_uri_or_dns_san_may_not_claim() -> None:
    mig = servicer()
    claim = mig_pb2.ClaimMigRequest(holder="coord-a", rollout="r1")
    with pytest.raises(PermissionDenied, match="no URI or DNS SAN"):
        asyncio.run(mig.ClaimMig(claim, _Context()))  # type: ignore[arg-type]
    got = asyncio.run(mig.GetMigClaim(mig_pb2.GetMigClaimRequest(), _Context()))  # type: ignore[arg-type]
    assert not got.HasField("claim")  # the refusal took nothing
