"""Nydus layer classification, how warm an image is, and the hash-only sink blobs go through."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from agent.config import PrewarmSettings
from agent.errors import NotFound
from agent.prewarm import kinds
from agent.prewarm.errors import DigestMismatch, FetchFailed
from agent.prewarm.factory import blob_fetcher_from
from agent.prewarm.model import CacheItem, ImageWarmth, ItemKind, ItemState, Warmth
from agent.prewarm.nydus import NYDUS_FEATURE, classify, warmth
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.registry import (
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
    Index,
    Manifest,
    parse_manifest,
    select_manifest,
)
from agent.prewarm.sink import DigestSink

BLOB = "containerd.io/snapshot/nydus-blob"
BOOT = "containerd.io/snapshot/nydus-bootstrap"


def digest(seed: str) -> str:
    return "sha256:" + hashlib.sha256(seed.encode()).hexdigest()


def layer(
    seed: str, size: int, annotations: dict[str, str] | None = None, media: str = ""
) -> dict[str, object]:
    out: dict[str, object] = {
        "mediaType": media or "application/vnd.oci.image.layer.v1.tar+gzip",
        "digest": digest(seed),
        "size": size,
    }
    if annotations:
        out["annotations"] = annotations
    return out


def manifest(*layers: dict[str, object]) -> Manifest:
    body = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "x", "digest": digest("cfg"), "size": 10},
            "layers": list(layers),
        }
    ).encode()
    parsed = parse_manifest(body, "", digest("m"))
    assert isinstance(parsed, Manifest)
    return parsed


def test_annotations_split_bootstrap_data_and_plain_layers() -> None:
    """Nydusify's shape: data blobs (annotated, or by media type), then the bootstrap."""
    m = manifest(
        layer("a", 100, {BLOB: "true"}),
        layer("b", 50, media="application/vnd.oci.image.layer.nydus.blob.v1"),
        layer("boot", 7, {BOOT: "true"}),
    )
    plan = classify(m)
    assert plan.lazy
    assert [b.digest for b in plan.data_blobs] == [digest("a"), digest("b")]
    assert [b.digest for b in plan.bootstrap] == [digest("boot")]
    # The key marks the layer, whatever its value (nydus-snapshotter checks presence).
    assert classify(manifest(layer("c", 1, {BLOB: ""}))).data_blobs[0].digest == digest("c")


def test_a_plain_image_is_full_after_its_pull() -> None:
    plan = classify(
        manifest(layer("x", 10, {"org.opencontainers.image.title": "x"}), layer("y", 5))
    )
    assert not plan.lazy and plan.data_blobs == ()
    assert warmth(plan, ()) == ImageWarmth(Warmth.FULL, False, 2, 2, 15, 15)


def test_warmth_words_and_counts_follow_the_data_blobs() -> None:
    plan = classify(
        manifest(
            layer("a", 100, {BLOB: "true"}),
            layer("b", 50, {BLOB: "true"}),
            layer("boot", 7, {BOOT: "true"}),
        )
    )
    assert warmth(plan, ()) == ImageWarmth(Warmth.BOOTSTRAP_ONLY, True, 3, 1, 157, 7)
    assert warmth(plan, [digest("b")]) == ImageWarmth(Warmth.PARTIAL, True, 3, 2, 157, 57)
    done = warmth(plan, [digest("a"), digest("b")])
    assert done == ImageWarmth(Warmth.FULL, True, 3, 3, 157, 157)
    assert done.ratio == 1.0
    assert warmth(plan, ()).ratio == pytest.approx(7 / 157)


def test_a_blob_listed_twice_is_warmed_once() -> None:
    plan = classify(manifest(layer("a", 9, {BLOB: "1"}), layer("a", 9, {BLOB: "1"})))
    assert len(plan.data_blobs) == 1
    assert warmth(plan, [digest("a")]).warmth is Warmth.FULL


def test_warmth_survives_the_options_round_trip_and_decides_the_label() -> None:
    w = ImageWarmth(Warmth.BOOTSTRAP_ONLY, True, 3, 1, 157, 7)
    assert ImageWarmth.from_options(w.to_options()) == w
    assert ImageWarmth.from_options({"warmth": "lukewarm"}) is None

    def image(options: dict[str, str], state: ItemState = ItemState.READY) -> CacheItem:
        return CacheItem("i", ItemKind.IMAGE, "n", "r/x:1", state, options=options)

    assert not kinds.label_ready(image(w.to_options()))
    full = ImageWarmth(Warmth.FULL, True, 3, 3, 157, 157).to_options()
    assert kinds.label_ready(image(full))
    assert not kinds.label_ready(image(full, ItemState.FAILED))
    assert not kinds.label_ready(image({}))  # never warmed by this version: not known to be warm
    assert ImageWarmth(Warmth.UNKNOWN).ratio is None


def index(*entries: dict[str, object]) -> Index:
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": list(entries)})
    parsed = parse_manifest(body.encode(), "", digest("idx"))
    assert isinstance(parsed, Index)
    return parsed


def entry(seed: str, arch: str, features: list[str] | None = None) -> dict[str, object]:
    platform: dict[str, object] = {"os": "linux", "architecture": arch}
    if features:
        platform["os.features"] = features
    return {"mediaType": OCI_MANIFEST, "digest": digest(seed), "size": 1, "platform": platform}


def test_index_resolves_to_the_node_platform_and_prefers_nydus_with_a_handler() -> None:
    """nydusify --merge-platform: the OCI original and the Nydus manifest for one platform."""
    idx = index(
        entry("arm", "arm64"),
        entry("oci", "amd64"),
        entry("nydus", "amd64", [NYDUS_FEATURE]),
    )
    assert select_manifest(idx, "amd64").digest == digest("oci")
    assert select_manifest(idx, "amd64", prefer_features=[NYDUS_FEATURE]).digest == digest("nydus")
    assert select_manifest(idx, "arm64", prefer_features=[NYDUS_FEATURE]).digest == digest("arm")
    with pytest.raises(NotFound, match=r"no linux/s390x manifest .*linux/amd64, linux/arm64"):
        select_manifest(idx, "s390x")


def test_manifest_media_type_comes_from_the_body_or_the_header() -> None:
    body = json.dumps({"schemaVersion": 2, "layers": [layer("a", 1)], "config": None}).encode()
    parsed = parse_manifest(body, f"{DOCKER_MANIFEST}; charset=utf-8", digest("m"))
    assert isinstance(parsed, Manifest) and parsed.media_type == DOCKER_MANIFEST
    with pytest.raises(FetchFailed, match="not JSON"):
        parse_manifest(b"<html>", "text/html", digest("m"))
    with pytest.raises(FetchFailed, match="no valid size"):
        parse_manifest(json.dumps({"layers": [{"digest": digest("a")}]}).encode(), "", "d")


def test_digest_sink_verifies_in_order_and_out_of_order_pieces() -> None:
    data = bytes(range(256)) * 64
    hexd = hashlib.sha256(data).hexdigest()
    sink = DigestSink(hexd, len(data))
    sink.admit(len(data))
    sink.write(data[:1000])
    sink.write(data[1000:])
    assert sink.verify() == len(data)

    pieces = DigestSink(hexd, len(data))
    for start in reversed(range(0, len(data), 4096)):  # as P2P pieces may arrive
        pieces.write_at(start, data[start : start + 4096])
    assert pieces.verify() == len(data)


def test_digest_sink_refuses_wrong_bytes_sizes_and_gaps() -> None:
    data = b"nydus" * 1000
    hexd = hashlib.sha256(data).hexdigest()
    wrong = DigestSink(hexd, len(data))
    wrong.write(b"x" + data[1:])
    with pytest.raises(DigestMismatch, match=f"sha256:{hexd}: the bytes hash to sha256:"):
        wrong.verify()
    with pytest.raises(DigestMismatch, match="announced 9 bytes"):
        DigestSink(hexd, len(data)).admit(9)
    over = DigestSink(hexd, len(data))
    with pytest.raises(DigestMismatch, match="more than"):
        over.write(data + b"!")
    gap = DigestSink(hexd, len(data))
    gap.write_at(100, data[100:])
    with pytest.raises(FetchFailed, match="pieces missing before offset 100"):
        gap.verify()


def test_blobs_go_through_the_proxy_nydusd_uses_else_dfdaemon_grpc_else_nowhere(
    tmp_path: Path,
) -> None:
    policy = UrlPolicy()
    both = PrewarmSettings(dragonfly_proxy="http://127.0.0.1:4001", dragonfly_socket=tmp_path)
    make = blob_fetcher_from(both)
    assert make is not None and make(policy).mode == "dragonfly-proxy"
    grpc_only = blob_fetcher_from(PrewarmSettings(dragonfly_socket=tmp_path / "df.sock"))
    assert grpc_only is not None and grpc_only(policy).mode == "dragonfly-grpc"
    assert blob_fetcher_from(PrewarmSettings()) is None  # no Dragonfly: nothing to warm into
