"""Build the prewarm service from PrewarmSettings: the one place that picks the fetcher."""

from __future__ import annotations

from pathlib import Path

from agent.config import PrewarmSettings
from agent.prewarm.fetch_http import HttpFetcher
from agent.prewarm.index import PrewarmIndex
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.service import FileFetcher, ImagePuller, PrewarmService
from agent.prewarm.store import CacheStore


def policy_from(settings: PrewarmSettings) -> UrlPolicy:
    return UrlPolicy(settings.allow_http, settings.allowed_hosts, settings.denied_hosts)


def fetcher_from(settings: PrewarmSettings, policy: UrlPolicy) -> FileFetcher:
    """dfdaemon's gRPC socket when set, else its HTTP proxy when set, else direct (§1)."""
    if settings.dragonfly_socket is not None:
        from agent.prewarm.fetch_dragonfly import DragonflyFetcher

        return DragonflyFetcher(policy, settings.dragonfly_socket)
    return HttpFetcher(policy, proxy=settings.dragonfly_proxy)


def puller_from(settings: PrewarmSettings) -> ImagePuller:
    from agent.prewarm.images import CriPuller

    return CriPuller(settings.containerd_socket, settings.docker_config)


def build_service(settings: PrewarmSettings, db_path: Path) -> PrewarmService:
    index = PrewarmIndex.open(db_path)
    store = CacheStore(settings.cache_dir, index, settings.budget_bytes, settings.max_volume_share)
    policy = policy_from(settings)
    return PrewarmService(
        index,
        store,
        policy,
        fetcher_from(settings, policy),
        puller=puller_from(settings),
        header_dirs=[Path(d) for d in settings.header_dirs],
    )
