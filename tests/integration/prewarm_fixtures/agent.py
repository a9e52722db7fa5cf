"""Build a PrewarmService on a temp cache and database, as node.py would."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.prewarm import kinds
from agent.prewarm.fetch_http import HttpFetcher
from agent.prewarm.headers import HeaderDir
from agent.prewarm.index import PrewarmIndex
from agent.prewarm.inuse import ProcScanner
from agent.prewarm.policy import UrlPolicy, origin_of
from agent.prewarm.ports import FileFetcher, ImagePuller, ImageWarmer, PullResult
from agent.prewarm.service import PrewarmService
from agent.prewarm.store import CacheStore

# The test origins, registries and proxies listen on loopback, which the agent refuses unless
# the operator opens it (prewarm.egress_allow): the tests open it, as an operator would.
LOOPBACK = ("127.0.0.0/8", "::1")


def make_service(
    tmp: Path,
    *,
    budget: int = 1 << 30,
    share: float = 1.0,
    cache_dir: Path | None = None,
    fetcher: FileFetcher | None = None,
    proxy: str | None = None,
    policy: UrlPolicy | None = None,
    puller: ImagePuller | None = None,
    warmer: ImageWarmer | None = None,
    retries: int = 5,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    header_origins: Sequence[str] = (),
    proc_root: Path | None = None,
) -> PrewarmService:
    """``header_origins``: the origins header files under ``tmp`` may be sent to;
    ``proc_root``: the /proc scanned for readers of blobs (the real one when None)."""
    index = PrewarmIndex.open(tmp / "state" / "agent.db")
    scanner = ProcScanner(proc_root) if proc_root is not None else None
    store = CacheStore(
        cache_dir or tmp / "cache", index, budget, share, scanner=scanner, layout_of=kinds.layout_of
    )
    policy = policy or UrlPolicy(allow_http=True, egress_allow=LOOPBACK)
    fetcher = fetcher or HttpFetcher(
        policy, proxy=proxy, backoff_s=0.01, timeout_s=10, retries=retries
    )
    return PrewarmService(
        index,
        store,
        policy,
        fetcher,
        puller=puller,
        warmer=warmer,
        header_dirs=[HeaderDir(origin_of(o), tmp) for o in header_origins],
        clock=clock,
        monotonic=monotonic,
    )


class RecordingPuller:
    """A CRI that records what it was asked to pull."""

    def __init__(self) -> None:
        self.pulled: list[str] = []

    def pull(self, ref: str, runtime_handler: str | None) -> PullResult:
        self.pulled.append(ref)
        return PullResult(ref, 1, True, 0.0)

    def check_private(self, ref: str) -> None:
        pass  # anonymous pulls only

    def interrupt(self) -> None:
        pass  # a recorded pull returns at once: nothing waits

    def present(self, ref: str) -> bool:
        return ref in self.pulled

    def set_pinned(self, ref: str, pinned: bool) -> None:
        pass  # no image store behind it: nothing for containerd's GC to spare

    def remove(self, ref: str) -> None:
        pass  # the record of pulls stays: the tests read what was asked
