"""`fleet prewarm --dry-run`, and the desired-state loop that reads the same preview to find
drift: a node whose item of the target's name is another source's (another URL, image or
model revision, another sha256) is `refused`, as that node's agent refuses the submit, not
`unchanged` because an item of that name is warm."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from agent._proto.gpuagent.v1 import agent_pb2, cache_pb2
from agent.coordinator.rollout.actions import _preview_prewarm
from agent.coordinator.rollout.specs import prewarm_spec
from agent.prewarm import kinds
from agent.wire.node import NodeView, node_from

URL = "https://models.example.com/llama/model.safetensors"
SHA = "a" * 64
READY = cache_pb2.CACHE_ITEM_STATE_READY


def _preview(kind: str, values: dict[str, Any], *held: cache_pb2.CacheItem) -> Any:
    schema = kinds.schema_for(kind)
    assert schema is not None
    spec = prewarm_spec(schema, values)
    record = SimpleNamespace(spec=spec, request_id=lambda node: f"r-{node}")
    node = agent_pb2.Node(name="a")
    node.cache.items.extend(held)

    class Agent:
        async def node(self) -> NodeView:
            return node_from(node)

    return asyncio.run(_preview_prewarm(Agent(), record, "a"))  # type: ignore[arg-type]


def _file(source: str, sha256: str = SHA, **more: Any) -> cache_pb2.CacheItem:
    return cache_pb2.CacheItem(
        name="llama-8b",
        kind=cache_pb2.CACHE_ITEM_KIND_FILE,
        source=source,
        state=READY,
        sha256=sha256,
        **more,
    )


def test_a_name_warm_with_another_url_is_refused_not_unchanged() -> None:
    """The node holds llama-8b ready from v1's URL; the rollout asks v2's under that name. The
    agent refuses it ('already exists for another source'); the dry run said 'unchanged:
    every item is warm', and the coordinator's loop so never saw the drift."""
    held = _file(URL.replace("/llama/", "/llama-v1/"))
    p = _preview("file", {"url": URL, "name": "llama-8b"}, held)
    assert p.would == "refused", p
    assert "another source" in p.detail and "llama-v1" in p.detail, p.detail


def test_a_name_warm_with_another_sha256_is_refused() -> None:
    """Same URL, the desired sha256 moved on: the agent refuses the submit naming sha256."""
    p = _preview("file", {"url": URL, "name": "llama-8b", "sha256": "b" * 64}, _file(URL))
    assert p.would == "refused", p
    assert "sha256" in p.detail, p.detail


def test_the_same_source_is_unchanged_also_when_re_signed() -> None:
    """The node shows a URL without its query (`?…`), so a re-signed URL of the same item is
    still the same source: unchanged, as the agent's hit is."""
    signed = _file(URL + "?…")
    assert _preview("file", {"url": URL, "name": "llama-8b"}, _file(URL)).would == "unchanged"
    assert _preview(
        "file", {"url": URL + "?X-Amz-Signature=1", "name": "llama-8b"}, signed
    ).would == ("unchanged")
    assert _preview("file", {"url": URL, "name": "llama-8b", "sha256": SHA}, _file(URL)).would == (
        "unchanged"
    )


def test_an_image_or_model_name_held_by_another_reference_is_refused() -> None:
    image = cache_pb2.CacheItem(
        name="vllm", kind=cache_pb2.CACHE_ITEM_KIND_IMAGE, source="r.example/vllm:0.5", state=READY
    )
    p = _preview("image", {"ref": "r.example/vllm:0.6", "name": "vllm"}, image)
    assert p.would == "refused" and "r.example/vllm:0.5" in p.detail, p
    same = _preview("image", {"ref": "r.example/vllm:0.5", "name": "vllm"}, image)
    assert same.would == "unchanged", same
    listing = "https://hub.example/api/models/org/m/revision/{}?…"
    model = cache_pb2.CacheItem(
        name="m", kind=cache_pb2.CACHE_ITEM_KIND_GROUP, source=listing.format("v1"), state=READY
    )
    asked = {"repo": "org/m", "endpoint": "https://hub.example", "name": "m"}
    p = _preview("model", {**asked, "revision": "v2"}, model)
    assert p.would == "refused", p
    assert _preview("model", {**asked, "revision": "v1"}, model).would == "unchanged"


def test_a_file_target_on_a_name_an_image_holds_is_refused() -> None:
    image = cache_pb2.CacheItem(
        name="llama-8b", kind=cache_pb2.CACHE_ITEM_KIND_IMAGE, source="r/x:1", state=READY
    )
    p = _preview("file", {"url": URL, "name": "llama-8b"}, image)
    assert p.would == "refused", p
    assert p.detail == "llama-8b is an item of kind image on the node, not file", p.detail


def _model(include: list[str] | None) -> cache_pb2.CacheItem:
    """A ready model item as its node shows it: the listing URL redacted (its include, a
    fragment, shown as `#…`), the include in its options."""
    source = "https://hub.example/api/models/org/m/revision/main?…" + ("#…" if include else "")
    options = {"repo": "org/m", "revision": "main", "endpoint": "https://hub.example"}
    item = cache_pb2.CacheItem(
        name="m", kind=cache_pb2.CACHE_ITEM_KIND_GROUP, source=source, state=READY
    )
    item.options.update(options | {"include": json.dumps(include or [])})
    return item


def test_a_model_name_held_with_another_include_is_refused_as_the_agent_refuses_it() -> None:
    """A model's include is part of what its item is: the agent refuses the same repo with
    other globs under that name ('already exists for another source'). The dry run compared
    the repo alone and said 'unchanged: every item is warm', so the desired-state loop never
    saw the drift."""
    asked = {"repo": "org/m", "endpoint": "https://hub.example", "name": "m"}
    json_only = {**asked, "include": ["*.json"]}
    cases = [
        (asked, _model(["*.json"]), "refused"),
        (json_only, _model(None), "refused"),
        (json_only, _model(["*.json", "*.safetensors"]), "refused"),
        (json_only, _model(["*.json"]), "unchanged"),
        (asked, _model(None), "unchanged"),
    ]
    for values, held, would in cases:
        p = _preview("model", values, held)
        assert p.would == would, (values, held.options["include"], p)
        if would == "refused":
            assert "include" in p.detail, p.detail
    # An agent that shows no options: whether the item has an include is in its source alone.
    bare = _model(["*.json"])
    bare.ClearField("options")
    assert _preview("model", asked, bare).would == "refused"
    assert _preview("model", json_only, bare).would == "unchanged"  # its globs are unknown
