"""The file kind: one URL's bytes from an HTTP(S) origin (directly, or through Dragonfly:
the service's fetcher says which) into the content-addressed cache, resumable, verified."""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import replace

from agent.errors import AgentError, FieldViolation, InvalidSpec, StateUnavailable
from agent.prewarm.errors import Cancelled, FetchFailed
from agent.prewarm.fetch_http import FetchSpec
from agent.prewarm.headers import (
    check_header_files,
    header_files_of,
    header_options,
    read_header_files,
)
from agent.prewarm.model import CacheItem, FileRequest, ItemKind, ItemState
from agent.prewarm.policy import check_length, redact_url
from agent.prewarm.sink import Sink
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
    without_retry,
)
from agent.prewarm.target import TargetSchema

log = logging.getLogger("agent.prewarm.service")

_SHA256 = re.compile(r"[0-9a-f]{64}")


class FileSource(Source):
    kind = ItemKind.FILE
    request_type = FileRequest
    schema = TargetSchema(
        "file",
        FileRequest,
        """Fetch URL into the content-addressed cache (https; http only when allowed).

        \b
        Example:
          gpu-agent prewarm file https://models.example.com/llama/model.safetensors \\
            --name llama-8b --sha256 3f2a... --header Authorization=/secrets/hf/header
        """,
    )

    def check(self, request: SourceRequest) -> None:
        assert isinstance(request, FileRequest)
        check_length(request.url)
        if request.sha256 is not None and not _SHA256.fullmatch(request.sha256):
            raise InvalidSpec(
                "sha256 must be 64 lowercase hex digits",
                [FieldViolation("sha256", "64 characters 0-9 a-f")],
            )
        check_header_files(request.header_files)

    def validate(self, request: SourceRequest, work: Work) -> None:
        assert isinstance(request, FileRequest)
        work.policy.check(request.url)
        read_header_files(
            request.header_files, work.header_dirs, request.url
        )  # fail now, not minutes later

    def target(self, request: SourceRequest, work: Work) -> Target:
        assert isinstance(request, FileRequest)
        return Target(
            source=request.url,
            identity=work.identity(request.url),
            pretty=request.url,
            options=header_options(request.header_files),
            sha256=request.sha256,
        )

    def identity(self, item: CacheItem, work: Work) -> str:
        return work.identity(item.source)

    def claim(self, request: SourceRequest) -> Claim:
        assert isinstance(request, FileRequest)
        return Claim(redact_url(request.url), request.sha256)

    def shortcut(self, item: CacheItem, work: Work) -> CacheItem | None:
        size = work.store.blob_size(item.expected_sha256) if item.expected_sha256 else None
        if size is None:
            return None
        # Same content under another name: link it, no fetch, once the bytes still hash right.
        ready = replace(
            item,
            state=ItemState.READY,
            sha256=item.expected_sha256,
            size=size,
            finished_at=item.created_at,
            last_used=item.created_at,
            warm_seconds=0.0,
        )
        return ready if work.store.missing(ready, verify_digest=True) is None else None

    def after_ready(self, item: CacheItem, work: Work) -> None:
        if item.sha256:
            work.store.link_name(item.name, item.sha256)

    def run(self, item: CacheItem, event: threading.Event, work: Work) -> Outcome:
        partial = work.store.partial(item.id)
        if partial.offset:
            log.info("resuming %s from %d bytes on disk", item.name, partial.offset)
        progress, cancelled = work.watchers(item, event)
        fetcher = work.fetcher
        try:
            headers = read_header_files(
                header_files_of(item.options), work.header_dirs, item.source
            )
            spec = FetchSpec(
                item.source, headers, item.expected_sha256, resume_key=work.identity(item.source)
            )
            info = fetcher.fetch(spec, partial, progress, cancelled)
            size = partial.offset
            digest = work.store.commit(item, partial)
        except Cancelled:
            partial.close()
            return Stopped(fetched_bytes=partial.offset)
        except StateUnavailable:
            partial.close()
            raise
        except Exception as exc:
            partial.close()
            options = noted(item, partial).options
            if isinstance(exc, FetchFailed):
                return Failed(str(exc), exc.transient, partial.offset, options)
            if not isinstance(exc, AgentError):
                log.exception("prewarm of %s failed unexpectedly", item.name)
                return Failed(f"internal error: {type(exc).__name__}: {exc}", options=options)
            return Failed(str(exc), options=options)
        options = without_retry(noted(item, partial).options)
        if info.dragonfly_task_id:
            options["dragonfly_task_id"] = info.dragonfly_task_id
        options.pop("dragonfly_output", None)  # this run's, not one before a config change
        if info.dragonfly_output:
            options["dragonfly_output"] = info.dragonfly_output
        options["via"] = fetcher.mode
        log.info("prewarmed %s (%d bytes, sha256 %s) via %s", item.name, size, digest, fetcher.mode)
        return Ready(size, options, sha256=digest, fetched_bytes=size)


def noted(item: CacheItem, partial: Sink) -> CacheItem:
    """``item`` with why this run dropped its partial's bytes (``restarted``: the object changed
    at the origin) among its options, for `prewarm list` and the API to show."""
    if partial.restarted is None:
        return item
    return replace(item, options={**item.options, "restarted": partial.restarted})


SOURCE = FileSource()
