"""What the prewarm service is given to move bytes: a file fetcher, an image puller and an
image warmer (agent/prewarm/factory.py builds them; a test passes its own).

Below the service and the kinds' `Source`s, which both use them (`Work` hands them over).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agent.prewarm.fetch_http import CancelledFn, FetchInfo, FetchSpec, ProgressFn
from agent.prewarm.model import ImageWarmth
from agent.prewarm.sink import Sink


class FileFetcher(Protocol):
    """Moves one URL's bytes into a Sink (direct HTTP, Dragonfly proxy or dfdaemon gRPC)."""

    @property
    def mode(self) -> str: ...

    def fetch(
        self, spec: FetchSpec, partial: Sink, progress: ProgressFn, cancelled: CancelledFn
    ) -> FetchInfo:
        """Holds each blocking call on ``cancelled`` (`agent.prewarm.cancel.hold`), so the
        item's stop ends it at once."""
        ...


@dataclass(frozen=True, slots=True)
class PullResult:
    image_ref: str
    size: int | None
    cold: bool
    seconds: float


class ImagePuller(Protocol):
    """Pulls, checks, pins and removes images in the node's runtime (CRI)."""

    def pull(self, ref: str, runtime_handler: str | None) -> PullResult: ...

    def check_private(self, ref: str) -> None:
        """PermissionDenied when pulling ``ref`` with the node's registry credentials would
        make it usable by every pod on the node (agent/prewarm/private_images.py)."""

    def interrupt(self) -> None:
        """Cancel pulls in flight; each raises Cancelled."""

    def present(self, ref: str) -> bool:
        """Whether the runtime has ``ref``; raises AgentError when it cannot say."""
        ...

    def set_pinned(self, ref: str, pinned: bool) -> None: ...

    def remove(self, ref: str) -> None: ...


@dataclass(frozen=True, slots=True)
class WarmResult:
    warmth: ImageWarmth
    notes: Mapping[str, str] = field(default_factory=dict)  # facts for the item's options


class ImageWarmer(Protocol):
    """After the pull: warms what it left cold (a Nydus image's data) and says how warm the
    image is; raises ImageWarmFailed with the warmth reached when a blob cannot be warmed."""

    def warm(
        self,
        ref: str,
        runtime_handler: str | None,
        progress: ProgressFn,
        cancelled: CancelledFn,
    ) -> WarmResult: ...
