"""Warm an image past its CRI pull: a Nydus image's data blobs, through the node's Dragonfly.

A CRI pull of a Nydus image fetches its manifest, config and bootstrap only; nydusd fetches the
file data when the container runs (prewarm.md §2.1, §2.7). After the pull, `NydusWarmer.warm`
reads the manifest the node's platform resolves to (`agent.prewarm.registry`), splits its layers
(`agent.prewarm.nydus`) and:

- a plain image is whole after the pull: ``full``;
- a Nydus image on a node with Dragonfly: every data blob is requested at the URL nydusd's
  registry backend requests (``<scheme>://<registry>/v2/<repo>/blobs/<digest>``, same host,
  no tag or application) through dfdaemon, its HTTP proxy or its gRPC DownloadTask, so the
  task ids match and nydusd's later reads are served from dfdaemon's cache (§1.4, §2.5). The
  bytes are hashed and thrown away here; every digest is checked. ``full`` when all arrived;
- a Nydus image without Dragonfly: its data cannot be put where nydusd looks without running
  it. If a snapshotter socket and prefetch list are configured, a prefetch hint is sent (used at
  that image's next nydusd start). The image stays ``bootstrap-only``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent.errors import AgentError
from agent.prewarm.errors import Cancelled, FetchFailed, ImageWarmFailed
from agent.prewarm.fetch_http import CancelledFn, FetchSpec, ProgressFn
from agent.prewarm.nydus import NYDUS_FEATURE, classify, warmth
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.ports import FileFetcher, WarmResult
from agent.prewarm.registry import Descriptor, ImageName, RegistryClient
from agent.prewarm.sink import DigestSink
from agent.prewarm.snapshotter import SnapshotterClient

log = logging.getLogger(__name__)

# Builds the blob fetcher for one registry: the policy allows plain http for an insecure one.
BlobFetcherFactory = Callable[[UrlPolicy], FileFetcher]


class NydusWarmer:
    """The `ImageWarmer` of the service: registry manifest, Dragonfly blobs, snapshotter hint."""

    def __init__(
        self,
        registry: RegistryClient,
        blob_fetcher: BlobFetcherFactory | None = None,
        snapshotter: SnapshotterClient | None = None,
        prefetch_list: str | None = None,
    ) -> None:
        self._registry = registry
        self._blob_fetcher = blob_fetcher
        self._snapshotter = snapshotter
        self._prefetch_list = prefetch_list

    def warm(
        self,
        ref: str,
        runtime_handler: str | None,
        progress: ProgressFn,
        cancelled: CancelledFn,
    ) -> WarmResult:
        """Warm what the pull left cold; raises ImageWarmFailed (with how far it got)."""
        name = self._registry.name(ref)
        # With a runtime handler (a lazy snapshotter), prefer an index's Nydus entry.
        prefer = (NYDUS_FEATURE,) if runtime_handler else ()
        manifest, _ = self._registry.manifest(name, prefer, cancelled=cancelled)
        plan = classify(manifest)
        notes = {"manifest_digest": manifest.digest}
        if not plan.data_blobs:
            return WarmResult(warmth(plan, ()), notes)
        if self._blob_fetcher is None:
            notes.update(self._hint(name))
            return WarmResult(warmth(plan, ()), notes)
        fetcher = self._blob_fetcher(self._registry.policy_for(name.base_url))
        notes["via"] = fetcher.mode
        total = sum(b.size for b in plan.data_blobs)
        warm: list[str] = []
        for blob in plan.data_blobs:
            done = sum(b.size for b in plan.data_blobs if b.digest in warm)
            try:
                self._warm_blob(name, blob, fetcher, _offset(progress, done, total), cancelled)
            except Cancelled:
                raise
            except AgentError as exc:
                raise ImageWarmFailed(
                    f"data blob {blob.digest} of {ref}: {exc}", warmth(plan, warm)
                ) from None
            warm.append(blob.digest)
        return WarmResult(warmth(plan, warm), notes)

    def _warm_blob(
        self,
        name: ImageName,
        blob: Descriptor,
        fetcher: FileFetcher,
        progress: ProgressFn,
        cancelled: CancelledFn,
    ) -> None:
        algorithm, _, hexdigest = blob.digest.partition(":")
        if algorithm != "sha256":
            raise FetchFailed(f"cannot verify a {algorithm} digest; Nydus blobs use sha256")
        sink = DigestSink(hexdigest, blob.size)
        auth = self._registry.authorization(name, cancelled=cancelled)
        spec = FetchSpec(name.blob_url(blob.digest), auth, hexdigest)
        info = fetcher.fetch(spec, sink, progress, cancelled)
        size = sink.verify()
        log.info(
            "warmed Nydus data blob %s of %s (%d bytes) via %s%s",
            blob.digest,
            name.ref,
            size,
            fetcher.mode,
            f", dragonfly task {info.dragonfly_task_id}" if info.dragonfly_task_id else "",
        )

    def _hint(self, name: ImageName) -> dict[str, str]:
        """The snapshotter prefetch hint, when configured; what happened, for the options."""
        if self._snapshotter is None or self._prefetch_list is None:
            return {}
        refs = dict.fromkeys((name.normalized, name.ref))  # CRI records the normalized one
        try:
            self._snapshotter.prefetch([(r, self._prefetch_list) for r in refs])
        except AgentError as exc:
            log.warning("prefetch hint for %s not delivered: %s", name.ref, exc)
            return {"prefetch_hint": f"failed: {exc}"}
        return {"prefetch_hint": "sent"}


def _offset(progress: ProgressFn, done: int, total: int) -> ProgressFn:
    """Report one blob's bytes as progress over all the image's data blobs."""

    def report(n: int, _blob_total: int | None, /, *, retrying: str = "") -> None:
        progress(done + n, total, retrying=retrying)

    return report
