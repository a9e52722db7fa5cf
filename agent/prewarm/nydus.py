"""Nydus images: which layers a pull fetches and which hold the file data (pure, no I/O).

A Nydus image marks its layers with annotations the image builders set (nydus-snapshotter
``pkg/label/label.go``, prewarm.md §2.1): ``containerd.io/snapshot/nydus-bootstrap`` on the
metadata layer, which a CRI pull downloads and unpacks, and ``containerd.io/snapshot/nydus-blob``
on the data blobs, which it skips; nydusd reads them chunk by chunk when the container runs. The
key's presence is the mark, whatever its value. An image with neither is a plain image, whole
once the pull is done.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from agent.prewarm.model import ImageWarmth, Warmth
from agent.prewarm.registry import Descriptor, Manifest

BOOTSTRAP_ANNOTATION = "containerd.io/snapshot/nydus-bootstrap"
BLOB_ANNOTATION = "containerd.io/snapshot/nydus-blob"
# nydusify's media type for data blobs; a blob carrying it is data even without the annotation.
BLOB_MEDIA_TYPE = "application/vnd.oci.image.layer.nydus.blob.v1"
# platform.os.features of the Nydus entry in an index that also holds the OCI original
# (nydusify --merge-platform).
NYDUS_FEATURE = "nydus.remoteimage.v1"


@dataclass(frozen=True, slots=True)
class ImagePlan:
    """An image's layers split by what a CRI pull does with them."""

    layers: tuple[Descriptor, ...]
    data_blobs: tuple[Descriptor, ...]  # Nydus data: fetched lazily, to warm through Dragonfly
    bootstrap: tuple[Descriptor, ...]

    @property
    def lazy(self) -> bool:
        return bool(self.data_blobs or self.bootstrap)


def is_data_blob(layer: Descriptor) -> bool:
    return BLOB_ANNOTATION in layer.annotations or layer.media_type == BLOB_MEDIA_TYPE


def classify(manifest: Manifest) -> ImagePlan:
    data: dict[str, Descriptor] = {}
    for layer in manifest.layers:
        if is_data_blob(layer):
            data.setdefault(layer.digest, layer)  # one blob listed twice is warmed once
    bootstrap = tuple(
        layer for layer in manifest.layers if BOOTSTRAP_ANNOTATION in layer.annotations
    )
    return ImagePlan(manifest.layers, tuple(data.values()), bootstrap)


def warmth(plan: ImagePlan, warm_blobs: Collection[str]) -> ImageWarmth:
    """How warm the image is once pulled, with the data blobs in ``warm_blobs`` (digests) warmed.

    Every layer that is not a Nydus data blob is warm after the pull (a plain image's layers, a
    Nydus bootstrap); a data blob counts once it passed through the node's Dragonfly.
    """
    total_blobs = len(plan.layers)
    total_bytes = sum(layer.size for layer in plan.layers)
    data_digests = {b.digest for b in plan.data_blobs}
    cold = [
        layer
        for layer in plan.layers
        if layer.digest in data_digests and layer.digest not in warm_blobs
    ]
    warm_data = [b for b in plan.data_blobs if b.digest in warm_blobs]
    if not cold:
        word = Warmth.FULL
    elif not warm_data:
        word = Warmth.BOOTSTRAP_ONLY
    else:
        word = Warmth.PARTIAL
    return ImageWarmth(
        word,
        lazy=plan.lazy,
        blobs_total=total_blobs,
        blobs_warm=total_blobs - len(cold),
        bytes_total=total_bytes,
        bytes_warm=total_bytes - sum(layer.size for layer in cold),
    )
