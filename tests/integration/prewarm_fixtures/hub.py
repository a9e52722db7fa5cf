"""A Hugging Face style hub on the test origin: the model-info listing
(``/api/models/<repo>/revision/<rev>``, as with ``?blobs=true``) and
``/<repo>/resolve/<commit>/<path>`` files, written into the origin's directory."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from agent._proto.gpuagent.v1 import cache_pb2
from agent.prewarm.labels import READY_VALUE, node_labels
from agent.prewarm.naming import label_key
from agent.wire.prewarm import cache_item_from
from tests.integration.prewarm_fixtures.origin import Origin

LFS_SUFFIXES = (".safetensors", ".bin")


def publish(
    origin: Origin, repo: str, files: dict[str, bytes], revision: str = "main"
) -> tuple[str, str]:
    """Publish ``files`` (path -> bytes) as one commit of ``repo``; returns (endpoint, commit)."""
    commit = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
    siblings = []
    for path, data in sorted(files.items()):
        target = origin.root / repo / "resolve" / commit / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        sibling: dict[str, object] = {"rfilename": path, "size": len(data), "blobId": "0" * 40}
        if path.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            sibling["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
        siblings.append(sibling)
    listing = origin.root / "api" / "models" / repo / "revision" / revision
    listing.parent.mkdir(parents=True, exist_ok=True)
    listing.write_text(json.dumps({"id": repo, "sha": commit, "siblings": siblings}))
    return f"http://127.0.0.1:{origin.port}", commit


def listing_path(origin: Origin, repo: str, revision: str = "main") -> Path:
    return origin.root / "api" / "models" / repo / "revision" / revision


def tiny_model(shards: int = 2, shard_size: int = 64 * 1024) -> dict[str, bytes]:
    """A small repo snapshot: config, tokenizer and ``shards`` safetensors shards (LFS)."""
    files = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b'{"version": "1.0"}'}
    for i in range(1, shards + 1):
        data = hashlib.sha256(f"shard{i}".encode()).digest() * (shard_size // 32)
        files[f"model-{i:05d}-of-{shards:05d}.safetensors"] = data
    return files


def ready_model(items: Sequence[cache_pb2.CacheItem], name: str) -> cache_pb2.CacheItem | None:
    """The ready model item ``name`` of a node's cache answer, if the node would label itself
    ``gpu-agent.io/cache.<name>=ready`` for it (the label its publisher derives from it)."""
    labels = node_labels([cache_item_from(i) for i in items])
    for item in items:
        if (
            item.name == name
            and item.kind == cache_pb2.CACHE_ITEM_KIND_GROUP
            and item.state == cache_pb2.CACHE_ITEM_STATE_READY
            and labels.get(label_key(name)) == READY_VALUE
        ):
            return item
    return None
