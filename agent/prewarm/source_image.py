"""The image kind: a container image pulled through the node's CRI (containerd), so the
kubelet finds it in place, then warmed by the service's `ImageWarmer` (a Nydus image's data
blobs through Dragonfly); ready for a label only when fully warm. Its bytes live in the
runtime, not the cache: presence, pins and removal go to the runtime."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from agent.errors import AgentError, FieldViolation, InvalidSpec
from agent.kube_names import is_dns_label
from agent.prewarm.docker_auth import registry_host
from agent.prewarm.errors import Cancelled, FetchFailed, ImageWarmFailed
from agent.prewarm.model import (
    CacheItem,
    ImagePull,
    ImageRequest,
    ImageWarmth,
    ItemKind,
    ItemState,
    Layout,
    PullPolicy,
    Warmth,
)
from agent.prewarm.registry import parse_reference
from agent.prewarm.source import (
    Claim,
    Failed,
    Outcome,
    Ready,
    Source,
    SourceRequest,
    Stopped,
    Target,
    Work,
)
from agent.prewarm.target import TargetSchema

log = logging.getLogger("agent.prewarm.service")

_MAX_REPULL_H = 24 * 365
# Options an image request sets; the rest are results of the last run and are replaced.
_REQUEST_OPTIONS = ("runtime_handler", "pull_policy", "repull_hours")
_NO_PULLER = "no image puller (CRI) is configured"


class ImageSource(Source):
    kind = ItemKind.IMAGE
    request_type = ImageRequest
    layout = Layout.RUNTIME
    shared_as = "image"
    schema = TargetSchema(
        "image",
        ImageRequest,
        """Pull image REF through the node's CRI (containerd, namespace k8s.io).

        \b
        Example:
          gpu-agent prewarm image registry.example.com/llm/server:1.4 --runtime-handler nydus
        """,
    )

    def check(self, request: SourceRequest) -> None:
        assert isinstance(request, ImageRequest)
        if not request.ref or any(c.isspace() for c in request.ref):
            raise InvalidSpec(
                "image reference is empty or has spaces",
                [FieldViolation("image", "e.g. registry.example.com/repo:tag")],
            )
        parse_reference(request.ref)  # refused here, naming `image`, not failed at pull time
        handler = request.runtime_handler
        # What the kubelet can ask the CRI for: a RuntimeClass handler, a DNS label.
        if handler and not is_dns_label(handler):
            raise InvalidSpec(
                f"runtime handler {handler!r} is not a RuntimeClass handler",
                [FieldViolation("runtime_handler", "a DNS label, e.g. nydus or runc")],
            )
        if request.repull_hours is not None and not 0 < request.repull_hours <= _MAX_REPULL_H:
            raise InvalidSpec(
                f"repull_hours must be > 0 and <= {_MAX_REPULL_H}",
                [FieldViolation("repull_hours", f"hours, 0 < h <= {_MAX_REPULL_H}")],
            )

    def validate(self, request: SourceRequest, work: Work) -> None:
        assert isinstance(request, ImageRequest)
        work.policy.check_registry(registry_host(request.ref))
        if work.puller is not None:
            work.puller.check_private(request.ref)  # refused before anything is written

    def target(self, request: SourceRequest, work: Work) -> Target:
        assert isinstance(request, ImageRequest)
        options = {"pull_policy": request.pull_policy.value}
        if request.runtime_handler:
            options["runtime_handler"] = request.runtime_handler
        if request.repull_hours is not None:
            options["repull_hours"] = f"{request.repull_hours:g}"
        return Target(source=request.ref, identity=request.ref, pretty=request.ref, options=options)

    def ready(self, item: CacheItem) -> bool:
        # Fully warm only: a Nydus image with its bootstrap alone fetches its data at start.
        if item.state is not ItemState.READY:
            return False
        warmth = item.image_warmth
        return warmth is not None and warmth.warmth is Warmth.FULL

    def describe(self, item: CacheItem) -> str:
        return item.source  # a reference has no query or user info: shown whole

    def claim(self, request: SourceRequest) -> Claim:
        assert isinstance(request, ImageRequest)
        return Claim(request.ref)

    def unready(self, item: CacheItem, work: Work, verify_digest: bool = False) -> str | None:
        puller = work.puller
        if puller is None:
            return _NO_PULLER
        try:
            present = puller.present(item.source)
        except AgentError as exc:
            return f"cannot check the runtime: {exc}"
        return None if present else f"image {item.source} is no longer in the runtime"

    def recheck(self, item: CacheItem, work: Work) -> str | None:
        puller = work.puller
        if puller is None:
            return self.unready(item, work)
        try:
            present = puller.present(item.source)
        except AgentError as exc:  # unknown is not absent: left as it is
            log.warning("audit cannot check image %s: %s", item.name, exc)
            return None
        return None if present else f"image {item.source} is no longer in the runtime"

    def due(self, item: CacheItem, now: float) -> bool:
        return _repull_due(item.options, item.finished_at, now)

    def repull(self, item: CacheItem, options: Mapping[str, str], now: float) -> bool:
        if options.get("pull_policy") == PullPolicy.ALWAYS.value:
            return True
        return _repull_due(options, item.finished_at, now)

    def discard(self, item: CacheItem, work: Work) -> None:
        return None  # nothing of it in the cache

    def sharing(self, item: CacheItem, work: Work) -> list[CacheItem]:
        """The other ready items naming the same image (its other names)."""
        ready = work.index.items([ItemState.READY])
        return [
            i for i in ready if i.kind == item.kind and i.source == item.source and i.id != item.id
        ]

    def remove(self, item: CacheItem, others: list[CacheItem], work: Work) -> CacheItem:
        """Remove the image from the runtime, and so every name of it."""
        if work.puller is not None:
            work.puller.remove(item.source)
        for other in others:
            work.index.update(other.id, state=ItemState.EVICTED)
        return work.index.update(item.id, state=ItemState.EVICTED)

    def pin(self, item: CacheItem, pinned: bool, work: Work) -> None:
        # The runtime's pin is the image's: it stays while another name of it is pinned.
        shared = not pinned and any(i.pinned for i in self.sharing(item, work))
        if not shared and item.state is ItemState.READY and work.puller:
            work.puller.set_pinned(item.source, pinned)
        if "pin_error" in item.options:  # taken now, or no longer asked for
            options = {k: v for k, v in item.options.items() if k != "pin_error"}
            work.index.update(item.id, options=options)

    def pin_after_hit(self, item: CacheItem, work: Work) -> None:
        """Pin the image in the runtime; a refusal is kept as ``pin_error``, as after a pull,
        so the item does not read as pinned where the kubelet's image GC looks."""
        if work.puller is None:
            return
        options = {k: v for k, v in item.options.items() if k != "pin_error"}
        try:
            work.puller.set_pinned(item.source, True)
        except AgentError as exc:
            log.warning("cannot pin image %s in the runtime: %s", item.name, exc)
            options["pin_error"] = str(exc)
        if options != item.options:
            work.index.update(item.id, options=options)

    def run(self, item: CacheItem, event: threading.Event, work: Work) -> Outcome:
        puller = work.puller
        if puller is None:
            return Failed(_NO_PULLER)
        handler = item.options.get("runtime_handler")
        try:
            # Checked again as it goes to the CRI: the registry's DNS may have moved since.
            work.policy.check_registry(registry_host(item.source))
            result = puller.pull(item.source, handler)
        except Cancelled:
            return Stopped()
        except FetchFailed as exc:  # the runtime or the registry may come back: retried
            return Failed(str(exc), exc.transient)
        except AgentError as exc:
            return Failed(str(exc))
        work.index.record_pull(ImagePull(item.source, result.cold, result.seconds, work.now()))
        options = {k: v for k, v in item.options.items() if k in _REQUEST_OPTIONS}
        options["image_ref"] = result.image_ref
        warmer = work.warmer
        if warmer is not None:
            progress, cancelled = work.watchers(item, event)
            try:
                warm = warmer.warm(item.source, handler, progress, cancelled)
            except Cancelled:
                return Stopped()  # dfdaemon keeps what it has
            except ImageWarmFailed as exc:
                return Failed(str(exc), options={**options, **exc.warmth.to_options()})
            except AgentError as exc:
                # Pulled, but its layers could not be read: say so rather than guess.
                log.warning("cannot tell how warm %s is: %s", item.name, exc)
                unknown = ImageWarmth(Warmth.UNKNOWN)
                options.update(unknown.to_options(), warmth_error=str(exc))
            else:
                options.update(warm.notes)
                options.update(warm.warmth.to_options())
        if item.pinned:
            try:
                puller.set_pinned(item.source, True)
            except AgentError as exc:
                log.warning("cannot pin image %s in the runtime: %s", item.name, exc)
                options["pin_error"] = str(exc)
        warmth = ImageWarmth.from_options(options)
        log.info(
            "prewarmed image %s (%s)", item.name, warmth.warmth if warmth else "warmth not known"
        )
        return Ready(result.size, options)


def _repull_due(options: Mapping[str, str], pulled_at: float | None, now: float) -> bool:
    """Whether an image's ``repull_hours`` have passed since its last pull."""
    hours = options.get("repull_hours")
    if not hours or pulled_at is None:
        return False
    return now - pulled_at >= float(hours) * 3600


SOURCE = ImageSource()
