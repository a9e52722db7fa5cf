"""Inventory renderings (node labels, metrics), manifests and the progress meter."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.errors import InvalidSpec
from agent.prewarm.budget import Usage
from agent.prewarm.inventory import Inventory, PrewarmCollector
from agent.prewarm.labels import node_labels
from agent.prewarm.manifest import parse_manifest
from agent.prewarm.model import (
    CacheItem,
    FileRequest,
    GroupRequest,
    ImagePull,
    ImageRequest,
    ImageWarmth,
    ItemKind,
    ItemState,
    PullPolicy,
    Warmth,
)
from agent.prewarm.progress import ProgressMeter


def item(name: str, state: ItemState, **kw: object) -> CacheItem:
    return CacheItem(
        id=name, kind=ItemKind.FILE, name=name, source="https://h/x", state=state, **kw
    )  # type: ignore[arg-type]


def test_only_ready_items_get_a_label() -> None:
    items = [item("llama", ItemState.READY), item("mistral", ItemState.FETCHING)]
    assert node_labels(items) == {"gpu-agent.io/cache.llama": "ready"}


def test_metrics_render_state_size_hits_and_pull_times() -> None:
    inv = Inventory(
        items=[item("llama", ItemState.READY, size=10, hits=3, warm_seconds=1.5, last_used=100.0)],
        usage=Usage(10, 0, 0, 100, 100, 1000),
        pulls=[ImagePull("reg/vllm:1", True, 12.0, 1.0), ImagePull("reg/vllm:1", False, 0.2, 2.0)],
    )
    registry = CollectorRegistry()
    registry.register(PrewarmCollector(lambda: inv))
    text = generate_latest(registry).decode()
    assert 'gpu_agent_prewarm_item_state{kind="file",name="llama",state="ready"} 1.0' in text
    assert 'gpu_agent_prewarm_item_state{kind="file",name="llama",state="failed"} 0.0' in text
    assert 'gpu_agent_prewarm_item_size_bytes{kind="file",name="llama"} 10.0' in text
    assert 'gpu_agent_prewarm_item_hits_total{kind="file",name="llama"} 3.0' in text
    assert 'gpu_agent_prewarm_item_warm_seconds{kind="file",name="llama"} 1.5' in text
    assert 'gpu_agent_prewarm_cache_bytes{kind="capacity"} 100.0' in text
    assert 'gpu_agent_prewarm_image_pull_seconds{cold="true",image="reg/vllm:1"} 12.0' in text
    assert 'gpu_agent_prewarm_image_pull_seconds{cold="false",image="reg/vllm:1"} 0.2' in text


def test_manifest_parses_files_and_images_in_order() -> None:
    parsed = parse_manifest(
        {
            "version": 1,
            "items": [
                {
                    "url": "https://h/m",
                    "name": "m",
                    "pin": True,
                    "header_files": {"Authorization": "/s/t"},
                },
                {"image": "reg/x:1", "runtime_handler": "nydus"},
            ],
        }
    )
    assert isinstance(parsed[0], FileRequest) and parsed[0].pin
    assert str(parsed[0].header_files["Authorization"]) == "/s/t"
    assert parsed[1] == ImageRequest("reg/x:1", runtime_handler="nydus")


def test_manifest_reports_every_bad_field_with_its_path() -> None:
    with pytest.raises(InvalidSpec) as err:
        parse_manifest(
            {
                "version": 2,
                "items": [
                    {"url": "https://h/m", "shaa256": "x"},
                    {"url": "u", "image": "i"},
                    {"image": 3},
                ],
            }
        )
    fields = [v.field for v in err.value.violations]
    assert fields == ["version", "items[0].shaa256", "items[1]", "items[2].image"]
    assert "did you mean sha256" in err.value.violations[1].description


def test_progress_rate_and_eta_from_a_fake_clock() -> None:
    now = [0.0]
    meter = ProgressMeter("i", clock=lambda: now[0])
    for t, done in ((0, 0), (1, 100), (2, 200)):
        now[0] = t
        meter.update(done, 1000)
    snap = meter.snapshot()
    assert (snap.rate_bps, snap.eta_s) == (100.0, 8.0)
    now[0] = 3
    meter.update(0, 1000)  # restart from zero forgets the old rate
    assert meter.snapshot().rate_bps == 0.0


def test_images_are_labelled_only_when_fully_warm_and_export_their_warmth() -> None:
    def image(name: str, warmth: ImageWarmth | None) -> CacheItem:
        options = warmth.to_options() if warmth else {}
        return CacheItem(name, ItemKind.IMAGE, name, "r/x:1", ItemState.READY, options=options)

    items = [
        image("full", ImageWarmth(Warmth.FULL, True, 3, 3, 300, 300)),
        image("lazy", ImageWarmth(Warmth.BOOTSTRAP_ONLY, True, 3, 1, 300, 30)),
        image("unknown", ImageWarmth(Warmth.UNKNOWN)),
        image("old", None),
    ]
    assert node_labels(items) == {"gpu-agent.io/cache.full": "ready"}
    registry = CollectorRegistry()
    registry.register(PrewarmCollector(lambda: Inventory(items, Usage(0, 0, 0, 1, 1, 1), [])))
    text = generate_latest(registry).decode()
    assert 'gpu_agent_prewarm_image_warm_ratio{name="full"} 1.0' in text
    assert 'gpu_agent_prewarm_image_warm_ratio{name="lazy"} 0.1' in text
    assert 'gpu_agent_prewarm_image_warmth{name="lazy",warmth="bootstrap-only"} 1.0' in text
    assert 'gpu_agent_prewarm_image_warmth{name="unknown",warmth="unknown"} 1.0' in text
    assert 'gpu_agent_prewarm_image_warm_ratio{name="unknown"}' not in text
    assert 'gpu_agent_prewarm_image_blobs{kind="warm",name="lazy"} 1.0' in text
    assert 'name="old"' not in text.split("gpu_agent_prewarm_image_warm_ratio", 1)[1]


def test_manifest_images_take_a_pull_policy_and_a_repull_interval() -> None:
    [image] = parse_manifest(
        {
            "version": 1,
            "items": [{"image": "r.example/a:latest", "pull_policy": "Always", "repull_hours": 6}],
        }
    )
    assert isinstance(image, ImageRequest)
    assert (image.pull_policy, image.repull_hours) == (PullPolicy.ALWAYS, 6.0)
    with pytest.raises(InvalidSpec) as bad:
        parse_manifest(
            {
                "version": 1,
                "items": [
                    {"image": "r.example/a:1", "pull_policy": "Sometimes"},
                    {"image": "r.example/a:2", "repull_hours": 0},
                ],
            }
        )
    assert [v.field for v in bad.value.violations] == [
        "items[0].pull_policy",
        "items[1].repull_hours",
    ]


def test_manifest_lists_models_as_groups() -> None:
    [model] = parse_manifest(
        {
            "version": 1,
            "items": [
                {
                    "model": "org/Tiny",
                    "revision": "v1",
                    "include": ["*.safetensors", "config.json"],
                    "header_files": {"Authorization": "/secrets/hf"},
                }
            ],
        }
    )
    assert model == GroupRequest(
        "org/Tiny",
        revision="v1",
        include=("*.safetensors", "config.json"),
        header_files={"Authorization": Path("/secrets/hf")},
    )
    with pytest.raises(InvalidSpec) as bad:
        parse_manifest(
            {
                "version": 1,
                "items": [{"model": "org/Tiny", "url": "https://h/x"}, {"model": "o/m", "inc": 1}],
            }
        )
    assert [v.field for v in bad.value.violations] == ["items[0]", "items[1].inc"]


def test_the_pull_history_keeps_a_few_pulls_of_each_named_image(tmp_path: Path) -> None:
    """Every CRI pull added a row for good: an image pulled with pull policy Always, and every
    image deleted long ago, grew the state database (read whole at each scrape) and kept a
    gpu_agent_prewarm_image_pull_seconds series as long as the agent ran. It keeps the last
    few cold and warm pulls of an image, and none once its last item is deleted."""
    from agent.prewarm.index import PULLS_KEPT, PrewarmIndex
    from agent.state import StateStore

    def image(name: str, ref: str) -> CacheItem:
        return CacheItem(id=name, kind=ItemKind.IMAGE, name=name, source=ref, state=ItemState.READY)

    with StateStore(tmp_path / "state.db") as store:
        index = PrewarmIndex(store)
        index.insert(image("vllm", "reg/vllm:1"))
        index.insert(image("gone", "reg/gone:1"))
        index.record_pull(ImagePull("reg/gone:1", True, 3.0, 0.5))
        for n in range(PULLS_KEPT + 5):
            index.record_pull(ImagePull("reg/vllm:1", n == 0, 1.0 + n, 1.0 + n))
        index.delete("gone")
        kept = index.pulls()
    assert [p.ref for p in kept] == ["reg/vllm:1"] * (PULLS_KEPT + 1)
    assert kept[0].cold and kept[0].at == 1.0  # the one cold pull stays among the warm ones
    assert [p.at for p in kept[1:]] == [6.0 + n for n in range(PULLS_KEPT)]  # the latest warm
