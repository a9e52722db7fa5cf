"""Cache items on the wire: an image's warmth travels with it, files carry none."""

from __future__ import annotations

from agent._proto.gpuagent.v1 import cache_pb2
from agent.api.convert import cache_item_pb
from agent.prewarm.model import CacheItem, ImageWarmth, ItemKind, ItemState, Warmth


def _image(options: dict[str, str]) -> CacheItem:
    return CacheItem("i1", ItemKind.IMAGE, "llm", "r.io/llm:1", ItemState.READY, options=options)


def test_a_bootstrap_only_nydus_image_says_so_with_its_counts() -> None:
    warmth = ImageWarmth(Warmth.BOOTSTRAP_ONLY, True, 3, 0, 3 << 30, 0)
    pb = cache_item_pb(_image({"runtime_handler": "nydus", **warmth.to_options()}))
    assert pb.HasField("image_warmth")
    got = pb.image_warmth
    assert got.level == cache_pb2.IMAGE_WARMTH_LEVEL_BOOTSTRAP_ONLY
    assert got.lazy
    assert (got.blobs_total, got.blobs_warm, got.bytes_total, got.bytes_warm) == (3, 0, 3 << 30, 0)


def test_every_warmth_level_has_a_wire_value() -> None:
    levels = {cache_item_pb(_image(ImageWarmth(w).to_options())).image_warmth.level for w in Warmth}
    assert len(levels) == len(Warmth)
    assert cache_pb2.IMAGE_WARMTH_LEVEL_UNSPECIFIED not in levels


def test_files_and_images_not_yet_warmed_carry_no_warmth() -> None:
    file = CacheItem("f1", ItemKind.FILE, "w", "https://o/w", ItemState.READY, options={})
    assert not cache_item_pb(file).HasField("image_warmth")
    assert not cache_item_pb(_image({})).HasField("image_warmth")


def test_every_item_kind_has_a_wire_value() -> None:
    """A model (group) item must not break ListPrewarmItems."""
    kinds = {cache_item_pb(CacheItem("i", k, "n", "s", ItemState.READY)).kind for k in ItemKind}
    assert len(kinds) == len(ItemKind) and cache_pb2.CACHE_ITEM_KIND_UNSPECIFIED not in kinds
