"""A Hugging Face style hub on the test origin: the model-info listing
(``/api/models/<repo>/revision/<rev>``, as with ``?blobs=true``) and
``/<repo>/resolve/<commit>/<path>`` files, written into the origin's directory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

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
