"""Cache items on the wire: an image's warmth travels with it, files carry none."""

from __future__ import annotations

import dataclasses

from agent._proto.gpuagent.v1 import cache_pb2
from agent.prewarm.model import CacheItem, ImageWarmth, ItemKind, ItemState, Warmth
from agent.wire.prewarm import cache_item_pb


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


def test_a_cache_item_survives_the_round_trip_a_client_makes() -> None:
    """The CLI renders what the agent sent back into the record the agent holds: every field
    but the ones the API leaves out (start time, owner) and the header files (secrets' paths)."""
    from agent.prewarm.model import CacheItem, ItemKind, ItemState
    from agent.wire.prewarm import cache_item_from, cache_item_pb

    item = CacheItem(
        "i1",
        ItemKind.IMAGE,
        "server",
        "registry.example/llm/server:1.4",
        ItemState.READY,
        pinned=True,
        size=123,
        sha256=None,
        fetched_bytes=0,
        created_at=1_700_000_000.0,
        finished_at=1_700_000_010.5,
        last_used=1_700_000_020.0,
        hits=3,
        warm_seconds=10.5,
        options={"via": "cri", "image_format": "oci", "header:Authorization": "/secrets/tok"},
    )
    back = cache_item_from(cache_item_pb(item))
    assert back.options == {"via": "cri", "image_format": "oci"}
    assert back == dataclasses.replace(item, options={"via": "cri", "image_format": "oci"})


def test_what_the_api_leaves_out_is_left_out_of_the_cli_s_json_not_shown_as_null() -> None:
    """`prewarm list -o json` once printed ``"started_at": null`` for an item the agent had
    fetched, and ``"owner": null`` for one somebody asked for: a client's copy lacks what the
    API does not carry, and null there would say "unknown" or "nobody"."""
    from agent.cli.prewarm import item_record
    from agent.wire.prewarm import NOT_CARRIED, cache_item_from, cache_item_pb

    item = CacheItem(
        "f1",
        ItemKind.FILE,
        "w",
        "https://o/w",
        ItemState.READY,
        started_at=1_700_000_000.0,
        owner="cn=ci",
        owner_role="prewarm",
    )
    back = cache_item_from(cache_item_pb(item))
    assert {f: getattr(back, f) for f in NOT_CARRIED} == dict.fromkeys(NOT_CARRIED)
    carried = {f.name for f in dataclasses.fields(CacheItem)} - NOT_CARRIED
    assert {f: getattr(back, f) for f in carried} == {f: getattr(item, f) for f in carried}
    record = item_record(back)
    assert NOT_CARRIED.isdisjoint(record) and carried <= set(record)


def test_an_image_of_unknown_warmth_shows_no_counts_in_the_cli_s_json() -> None:
    """An image whose manifest could not be read is `unknown`: nobody counted its layers. `prewarm
    list -o json` still printed ``"blobs_total": 0, "bytes_total": 0, "lazy": false``, as if
    the image had no layers and were not a Nydus image; they are null now, as the ratio is
    (the metrics leave them out)."""
    from agent.cli.prewarm import item_record
    from agent.wire.prewarm import cache_item_from

    options = {**ImageWarmth(Warmth.UNKNOWN).to_options(), "warmth_error": "registry denied"}
    item = CacheItem("i1", ItemKind.IMAGE, "app", "r/app:1", ItemState.READY, options=options)
    record = item_record(cache_item_from(cache_item_pb(item)))
    assert record["warmth"] == {
        "warmth": "unknown",
        "lazy": None,
        "blobs_total": None,
        "blobs_warm": None,
        "bytes_total": None,
        "bytes_warm": None,
        "ratio": None,
    }
    known = dataclasses.replace(
        item, options=ImageWarmth(Warmth.FULL, False, 2, 2, 9, 9).to_options()
    )
    assert item_record(known)["warmth"]["blobs_total"] == 2
