"""A node's fleet-prewarm outcome: failed items fail it; a ready image that is not fully warm
is named, since its pod would still fetch that data."""

from __future__ import annotations

from agent._proto.gpuagent.v1 import cache_pb2
from agent.coordinator.rollout.actions import prewarm_result
from agent.coordinator.rollout.execute import NodeResult
from agent.coordinator.rollout.schedule import NodeState
from agent.wire.prewarm import item_status_from

READY = cache_pb2.CACHE_ITEM_STATE_READY


def _image(name: str, level: int) -> cache_pb2.CacheItem:
    return cache_pb2.CacheItem(
        name=name,
        kind=cache_pb2.CACHE_ITEM_KIND_IMAGE,
        state=READY,
        image_warmth=cache_pb2.ImageWarmth(level=level),
    )


def test_every_item_warm_is_a_plain_success() -> None:
    items = [
        cache_pb2.CacheItem(name="weights", state=READY),
        _image("server", cache_pb2.IMAGE_WARMTH_LEVEL_FULL),
    ]
    assert prewarm_result([item_status_from(i) for i in items]) == NodeResult(
        NodeState.SUCCEEDED, "2 item(s) ready"
    )


def test_a_bootstrap_only_image_is_named() -> None:
    items = [_image("server", cache_pb2.IMAGE_WARMTH_LEVEL_BOOTSTRAP_ONLY)]
    result = prewarm_result([item_status_from(i) for i in items])
    assert result.state is NodeState.SUCCEEDED
    assert result.detail == "1 item(s) ready; not fully warm: server bootstrap-only"


def test_a_failed_item_fails_the_node_with_its_error() -> None:
    items = [
        cache_pb2.CacheItem(name="weights", state=READY),
        cache_pb2.CacheItem(
            name="shard", state=cache_pb2.CACHE_ITEM_STATE_FAILED, error="sha256 mismatch"
        ),
    ]
    assert prewarm_result([item_status_from(i) for i in items]) == NodeResult(
        NodeState.FAILED, "shard: sha256 mismatch"
    )
