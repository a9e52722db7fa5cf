"""Build the prewarm service from PrewarmSettings: the one place that picks the fetcher."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from agent.prewarm import kinds
from agent.prewarm.fetch_http import HttpFetcher
from agent.prewarm.headers import parse_header_dir
from agent.prewarm.index import PrewarmIndex
from agent.prewarm.inuse import ProcScanner
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.ports import FileFetcher, ImagePuller, ImageWarmer
from agent.prewarm.private_images import PrivateImageRule
from agent.prewarm.service import PrewarmService
from agent.prewarm.store import CacheStore
from agent.state import StateStore


class PrewarmSettings(Protocol):
    """The ``prewarm`` part of the agent config that building the service reads
    (agent/config/prewarm.py provides a dataclass of it, documented and checked there)."""

    @property
    def cache_dir(self) -> Path: ...
    @property
    def budget_bytes(self) -> int: ...
    @property
    def max_volume_share(self) -> float: ...
    @property
    def allow_http(self) -> bool: ...
    @property
    def allowed_hosts(self) -> tuple[str, ...]: ...
    @property
    def denied_hosts(self) -> tuple[str, ...]: ...
    @property
    def egress_allow(self) -> tuple[str, ...]: ...
    @property
    def dragonfly_socket(self) -> Path | None: ...
    @property
    def dragonfly_output(self) -> str: ...
    @property
    def dragonfly_proxy(self) -> str | None: ...
    @property
    def dragonfly_ca_file(self) -> Path | None: ...
    @property
    def containerd_socket(self) -> Path: ...
    @property
    def docker_config(self) -> Path | None: ...
    @property
    def insecure_registries(self) -> tuple[str, ...]: ...
    @property
    def private_images(self) -> str: ...
    @property
    def kubelet_config(self) -> Path: ...
    @property
    def kubelet_config_dir(self) -> Path | None: ...
    @property
    def nydus_system_socket(self) -> Path | None: ...
    @property
    def nydus_prefetch_list(self) -> Path | None: ...
    @property
    def retry_initial_s(self) -> float: ...
    @property
    def retry_max_s(self) -> float: ...
    @property
    def ignored_query_params(self) -> tuple[str, ...]: ...
    @property
    def header_dirs(self) -> tuple[str, ...]: ...


def policy_from(settings: PrewarmSettings) -> UrlPolicy:
    return UrlPolicy(
        settings.allow_http,
        settings.allowed_hosts,
        settings.denied_hosts,
        settings.egress_allow,
    )


def proxy_ssl_context(settings: PrewarmSettings) -> ssl.SSLContext | None:
    """The system CAs, plus dfdaemon's CA when set: its proxy signs https origins with it."""
    if settings.dragonfly_ca_file is None:
        return None
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=str(settings.dragonfly_ca_file))
    return context


def fetcher_from(settings: PrewarmSettings, policy: UrlPolicy) -> FileFetcher:
    """dfdaemon's gRPC socket when set, else its HTTP proxy when set, else direct (§1).

    dfdaemon follows redirects itself, so its fetchers get URLs whose redirects the agent
    resolved and checked first (agent.prewarm.redirects)."""
    from agent.prewarm.redirects import ResolvingFetcher

    if settings.dragonfly_socket is not None:
        from agent.prewarm.fetch_dragonfly import DragonflyFetcher

        dfdaemon = DragonflyFetcher(
            policy, settings.dragonfly_socket, output=settings.dragonfly_output
        )
        return ResolvingFetcher(dfdaemon, policy)
    if settings.dragonfly_proxy is not None:
        context = proxy_ssl_context(settings)
        proxied = HttpFetcher(policy, proxy=settings.dragonfly_proxy, ssl_context=context)
        return ResolvingFetcher(proxied, policy, ssl_context=context)
    return HttpFetcher(policy)


def private_image_rule(settings: PrewarmSettings) -> PrivateImageRule:
    """When an image pulled with the node's credentials may go to the runtime."""
    return PrivateImageRule(
        settings.private_images, settings.kubelet_config, settings.kubelet_config_dir
    )


def puller_from(settings: PrewarmSettings) -> ImagePuller:
    from agent.prewarm.images import CriPuller

    return CriPuller(
        settings.containerd_socket,
        settings.docker_config,
        private_images=private_image_rule(settings),
    )


def blob_fetcher_from(settings: PrewarmSettings) -> Callable[[UrlPolicy], FileFetcher] | None:
    """What Nydus data blobs go through: the node's Dragonfly, or nothing (prewarm.md §2.7).

    dfdaemon's HTTP proxy first, because it is the path nydusd itself reads through; its gRPC
    socket otherwise (same URL, so the same task id). Without Dragonfly there is no cache that
    nydusd would read the bytes from, so they are not fetched at all.
    """
    if settings.dragonfly_proxy is not None:
        proxy = settings.dragonfly_proxy
        context = proxy_ssl_context(settings)
        return lambda policy: HttpFetcher(policy, proxy=proxy, ssl_context=context)
    if settings.dragonfly_socket is not None:
        from agent.prewarm.fetch_dragonfly import DragonflyFetcher

        socket = settings.dragonfly_socket
        return lambda policy: DragonflyFetcher(policy, socket)
    return None


def warmer_from(settings: PrewarmSettings, policy: UrlPolicy) -> ImageWarmer:
    from agent.prewarm.image_warm import NydusWarmer
    from agent.prewarm.registry import RegistryClient
    from agent.prewarm.snapshotter import SnapshotterClient

    snapshotter = None
    if settings.nydus_system_socket is not None:
        snapshotter = SnapshotterClient(settings.nydus_system_socket)
    return NydusWarmer(
        RegistryClient(policy, settings.docker_config, settings.insecure_registries),
        blob_fetcher_from(settings),
        snapshotter,
        str(settings.nydus_prefetch_list) if settings.nydus_prefetch_list else None,
    )


def build_service(
    settings: PrewarmSettings, state: StateStore, proc_root: Path = Path("/proc")
) -> PrewarmService:
    """``proc_root``: the host's /proc (telemetry.proc_root), scanned for readers of blobs."""
    index = PrewarmIndex(state)
    store = CacheStore(
        settings.cache_dir,
        index,
        settings.budget_bytes,
        settings.max_volume_share,
        scanner=ProcScanner(proc_root),
        layout_of=kinds.layout_of,
    )
    policy = policy_from(settings)
    return PrewarmService(
        index,
        store,
        policy,
        fetcher_from(settings, policy),
        puller=puller_from(settings),
        warmer=warmer_from(settings, policy),
        header_dirs=[parse_header_dir(d) for d in settings.header_dirs],
        ignored_query_params=settings.ignored_query_params,
        retry_initial_s=settings.retry_initial_s,
        retry_max_s=settings.retry_max_s,
        lister=HttpFetcher(policy),  # listings name moving revisions: never from a P2P cache
    )
