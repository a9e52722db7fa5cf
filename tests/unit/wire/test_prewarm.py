"""A client reads a cache item whatever kind or state a newer agent sends (agent/wire)."""

from __future__ import annotations

import pytest

from agent._proto.gpuagent.v1 import cache_pb2
from agent.prewarm import kinds
from agent.prewarm.budget import Usage
from agent.prewarm.inventory import Inventory, PrewarmCollector
from agent.prewarm.labels import node_labels
from agent.prewarm.model import CacheItem, ItemKind, ItemState
from agent.wire.prewarm import (
    UNKNOWN_KIND,
    cache_contents_from,
    cache_item_from,
    cache_item_pb,
    item_state_pb,
)


def _item(kind: int, state: int) -> cache_pb2.CacheItem:
    return cache_pb2.CacheItem(id="i1", kind=kind, name="weights", source="s", state=state)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", [cache_pb2.CACHE_ITEM_KIND_UNSPECIFIED, 99])
def test_a_kind_the_client_does_not_know_reads_as_unknown(kind: int) -> None:
    item = cache_item_from(_item(kind, cache_pb2.CACHE_ITEM_STATE_READY))
    assert (item.kind, item.state, item.name) == (UNKNOWN_KIND, ItemState.READY, "weights")


@pytest.mark.parametrize("state", [cache_pb2.CACHE_ITEM_STATE_UNSPECIFIED, 42])
def test_a_state_the_client_does_not_know_reads_as_unknown(state: int) -> None:
    item = cache_item_from(_item(cache_pb2.CACHE_ITEM_KIND_FILE, state))
    assert (item.kind, item.state) == (ItemKind.FILE, ItemState.UNKNOWN)
    assert item.state.value == "unknown"
    assert not kinds.label_ready(item)  # not known to be ready: no label


def test_a_listing_with_an_unknown_item_reads_whole() -> None:
    pb = cache_pb2.CacheInventory(
        items=[
            _item(7, 9),
            _item(cache_pb2.CACHE_ITEM_KIND_IMAGE, cache_pb2.CACHE_ITEM_STATE_READY),
        ]
    )
    items = cache_contents_from(pb).items
    assert [(i.kind, i.state) for i in items] == [
        (UNKNOWN_KIND, ItemState.UNKNOWN),
        (ItemKind.IMAGE, ItemState.READY),
    ]


def test_the_known_values_still_round_trip() -> None:
    for state in ItemState:
        if state is ItemState.UNKNOWN:
            continue
        item = CacheItem("i", ItemKind.FILE, "n", "https://example.com/f", state)
        assert cache_item_from(cache_item_pb(item)).state is state
    assert item_state_pb(ItemState.UNKNOWN) == cache_pb2.CACHE_ITEM_STATE_UNSPECIFIED


def test_an_agent_never_labels_nor_counts_an_unknown_state() -> None:
    item = CacheItem("i", ItemKind.FILE, "n", "https://example.com/f", ItemState.UNKNOWN)
    assert node_labels([item]) == {}
    usage = Usage(0, 0, 0, 0, 0, 0)
    (state, *_) = PrewarmCollector(lambda: Inventory([item], usage, [])).collect()
    assert {s.labels["state"] for s in state.samples} == {
        "queued",
        "fetching",
        "ready",
        "failed",
        "evicted",
    }


@pytest.mark.parametrize(
    ("hours", "said"),
    [(1e9, "<= 8760"), (10_000.0, "<= 8760"), (float("inf"), "finite"), (-1.0, "more than 0")],
)
def test_repull_hours_out_of_range_are_refused_saying_the_range(hours: float, said: str) -> None:
    """`--repull-hours 1e9` was refused as "more than 0 hours", which it is; the API's check
    (up to 1e6) and the image kind's (up to a year) named two different limits."""
    from agent._proto.gpuagent.v1 import prewarm_pb2
    from agent.coordinator.rollout.targets import target_violations

    schema = kinds.schema_for("image")
    assert schema is not None
    msg = prewarm_pb2.ImageTarget(ref="r.example/a:1", repull_hours=hours)
    bad = target_violations(schema, msg, "image")
    assert [v.field for v in bad] == ["image.repull_hours"]
    assert said in bad[0].description, bad
