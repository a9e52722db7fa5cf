"""Push a "Nydus-shaped" image to a registry with the distribution HTTP API.

The manifest is what nydusify writes: data layers annotated ``containerd.io/snapshot/nydus-blob``
and a last layer annotated ``containerd.io/snapshot/nydus-bootstrap``. The layer *contents* are
ordinary gzip tars with matching diff_ids, because the containerd in these tests has no Nydus
snapshotter: it unpacks every layer, so they must be valid. What the agent reads (annotations,
digests, sizes, blob URLs) is exactly what it reads from a real Nydus image.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.client
import io
import json
import tarfile
from dataclasses import dataclass
from urllib.parse import urlsplit

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
BLOB = "containerd.io/snapshot/nydus-blob"
BOOTSTRAP = "containerd.io/snapshot/nydus-bootstrap"


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]


@dataclass(frozen=True)
class PushedImage:
    ref: str
    repo: str
    layers: list[Blob]
    data_blobs: list[Blob]
    bootstrap: Blob | None
    manifest_digest: str

    @property
    def bytes_total(self) -> int:
        return sum(b.size for b in self.layers)


def tar_gz(files: dict[str, bytes]) -> tuple[bytes, str]:
    """A gzip'd tar of ``files`` and its diff_id (sha256 of the uncompressed tar)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    plain = raw.getvalue()
    return gzip.compress(plain, mtime=0), "sha256:" + hashlib.sha256(plain).hexdigest()


def _request(
    registry: str,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    creds: str | None = None,
) -> http.client.HTTPResponse:
    host, _, port = registry.partition(":")
    conn = http.client.HTTPConnection(host, int(port or 80), timeout=30)
    sent = dict(headers or {})
    if creds:
        sent["Authorization"] = "Basic " + base64.b64encode(creds.encode()).decode()
    conn.request(method, path, body=body, headers=sent)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def push_blob(registry: str, repo: str, data: bytes, creds: str | None = None) -> Blob:
    """POST /v2/<repo>/blobs/uploads/ then PUT <location>?digest=… (monolithic upload)."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    start = _request(registry, "POST", f"/v2/{repo}/blobs/uploads/", creds=creds)
    assert start.status == 202, start.status
    location = urlsplit(start.getheader("Location", ""))
    sep = "&" if location.query else "?"
    path = f"{location.path}?{location.query}{sep}digest={digest}".replace("?&", "?")
    done = _request(
        registry,
        "PUT",
        path,
        data,
        {"Content-Type": "application/octet-stream", "Content-Length": str(len(data))},
        creds,
    )
    assert done.status == 201, done.status
    return Blob(digest, len(data))


def push_manifest(
    registry: str, repo: str, tag: str, manifest: dict[str, object], creds: str | None = None
) -> str:
    body = json.dumps(manifest).encode()
    path = f"/v2/{repo}/manifests/{tag}"
    resp = _request(registry, "PUT", path, body, {"Content-Type": OCI_MANIFEST}, creds)
    assert resp.status == 201, resp.status
    return "sha256:" + hashlib.sha256(body).hexdigest()


def push_nydus_shaped(
    registry: str,
    repo: str,
    tag: str,
    payloads: list[bytes],
    nydus: bool = True,
    creds: str | None = None,
) -> PushedImage:
    """One data layer per payload, then a bootstrap layer; annotated as Nydus when ``nydus``.
    ``creds`` (user:password) for a registry that asks for basic auth."""
    layers: list[tuple[Blob, str, dict[str, str]]] = []
    for i, payload in enumerate(payloads):
        data, diff_id = tar_gz({f"data/blob{i}.bin": payload})
        blob = push_blob(registry, repo, data, creds)
        layers.append((blob, diff_id, {BLOB: "true"} if nydus else {}))
    boot, boot_diff = tar_gz({"image/image.boot": b"RAFS bootstrap stand-in " + tag.encode()})
    boot_blob = push_blob(registry, repo, boot, creds)
    layers.append((boot_blob, boot_diff, {BOOTSTRAP: "true"} if nydus else {}))
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [diff for _, diff, _ in layers]},
        }
    ).encode()
    config_blob = push_blob(registry, repo, config, creds)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_blob.digest, "size": config_blob.size},
        "layers": [
            {"mediaType": OCI_LAYER, "digest": b.digest, "size": b.size, "annotations": notes}
            if notes
            else {"mediaType": OCI_LAYER, "digest": b.digest, "size": b.size}
            for b, _, notes in layers
        ],
    }
    digest = push_manifest(registry, repo, tag, manifest, creds)
    blobs = [b for b, _, _ in layers]
    return PushedImage(
        ref=f"{registry}/{repo}:{tag}",
        repo=repo,
        layers=blobs,
        data_blobs=blobs[:-1] if nydus else [],
        bootstrap=blobs[-1] if nydus else None,
        manifest_digest=digest,
    )
