"""The model kind (stored as ``group``): a model repo snapshot (Hugging Face style) warmed
and labelled as one item: listed, admitted by its total size, its files fetched in parallel
(each resumable on its own), then laid out as the model directory under by-name/<name>/."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from agent.errors import AgentError, Conflict, FieldViolation, InvalidSpec, StateUnavailable
from agent.owner import Actor
from agent.prewarm.errors import Cancelled, FetchFailed
from agent.prewarm.fetch_http import CancelledFn, FetchSpec, ProgressFn
from agent.prewarm.group import Member, check_include, check_repo, list_group, listing_url
from agent.prewarm.headers import (
    check_header_files,
    header_files_of,
    header_options,
    read_header_files,
)
from agent.prewarm.model import CacheItem, GroupRequest, ItemKind, Layout
from agent.prewarm.partial import MemberPartial
from agent.prewarm.policy import check_length, redact_url
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


class ModelSource(Source):
    kind = ItemKind.GROUP
    request_type = GroupRequest
    layout = Layout.TREE
    schema = TargetSchema(
        "model",
        GroupRequest,
        """Warm a model repo snapshot as one item: by-name/NAME/ is the directory vLLM loads.

        \b
        Example:
          gpu-agent prewarm model meta-llama/Llama-3.1-8B-Instruct \\
            --include '*.json' --include '*.safetensors' --header Authorization=/secrets/hf/header
        """,
    )

    def check(self, request: SourceRequest) -> None:
        assert isinstance(request, GroupRequest)
        check_repo(request.repo, request.revision)
        check_include(request.include)
        check_length(request.endpoint, "endpoint")
        # Paths are appended to it: after a query or fragment they would land there instead.
        if not request.endpoint.startswith(("https://", "http://")) or any(
            c in request.endpoint for c in "?#"
        ):
            raise InvalidSpec(
                f"endpoint {request.endpoint!r} is not an HTTP(S) base URL",
                [FieldViolation("endpoint", "an https:// (or http://) base URL, without ? or #")],
            )
        check_header_files(request.header_files)

    def validate(self, request: SourceRequest, work: Work) -> None:
        assert isinstance(request, GroupRequest)
        listing = listing_url(request.endpoint, request.repo, request.revision)
        work.policy.check(listing, "endpoint")  # refusals name the field the user gave
        read_header_files(request.header_files, work.header_dirs, listing)

    def target(self, request: SourceRequest, work: Work) -> Target:
        assert isinstance(request, GroupRequest)
        # The file selection is part of what the item is: other globs are another source.
        source = listing_url(request.endpoint, request.repo, request.revision)
        if request.include:
            source += "#include=" + ",".join(request.include)
        pretty = (
            request.repo if request.revision == "main" else f"{request.repo}:{request.revision}"
        )
        options = header_options(request.header_files)
        options.update(
            repo=request.repo,
            revision=request.revision,
            endpoint=request.endpoint,
            include=json.dumps(list(request.include)),
        )
        return Target(source=source, identity=source, pretty=pretty, options=options)

    def claim(self, request: SourceRequest) -> Claim:
        assert isinstance(request, GroupRequest)
        return Claim(redact_url(listing_url(request.endpoint, request.repo, request.revision)))

    def evict(self, item: CacheItem, by: Actor | None, work: Work) -> CacheItem:
        if item.pinned:
            raise Conflict(f"{item.name} is pinned; unpin first")
        work.store.evict_group(item)
        return work.index.get(item.id)

    def run(self, item: CacheItem, event: threading.Event, work: Work) -> Outcome:
        """List the snapshot, admit its total size, fetch and commit the missing files in
        parallel (each resumable on its own), then lay out the model directory."""
        progress, cancelled = work.watchers(item, event)
        opts = item.options
        # Files of this snapshot already committed by an earlier, failed run: url -> sha256.
        fetched: dict[str, str] = json.loads(opts.get("fetched", "{}"))
        restarts: dict[str, str] = {}  # path -> why its partial was dropped (object changed)
        try:
            headers = read_header_files(
                header_files_of(opts),
                work.header_dirs,
                listing_url(opts["endpoint"], opts["repo"], opts["revision"]),
            )
            listing = list_group(
                work.lister,
                opts["endpoint"],
                opts["repo"],
                opts["revision"],
                json.loads(opts.get("include", "[]")),
                headers,
                cancelled,
            )
            have: dict[str, str] = {}
            for m in listing.members:
                sha = m.sha256 or fetched.get(m.url)
                if sha and work.store.blob_size(sha) == m.size:
                    have[m.path] = sha
            todo = [m for m in listing.members if m.path not in have]
            on_disk = sum(work.store.partial_size(_member_key(item.id, m.path)) for m in todo)
            work.store.admit(item.id, listing.total, on_disk=on_disk)
            _fetch_members(
                work,
                item,
                todo,
                (have, fetched, restarts),
                headers,
                listing.total,
                progress,
                cancelled,
            )
            files = [(m.path, have[m.path], m.size) for m in listing.members]
            work.store.link_tree(item.name, item.id, [(p, sha) for p, sha, _ in files])
        except Cancelled:
            return Stopped(options={**opts, "fetched": json.dumps(fetched)})
        except StateUnavailable:
            raise
        except Exception as exc:
            transient = isinstance(exc, FetchFailed) and exc.transient
            if not isinstance(exc, AgentError):
                log.exception("prewarm of model %s failed unexpectedly", item.name)
            error = str(exc) if isinstance(exc, AgentError) else f"internal error: {exc!r}"
            kept = {k: v for k, v in opts.items() if k != "fetched"} | _noted(restarts)
            if transient:
                kept["fetched"] = json.dumps(fetched)
            return Failed(error, transient, work.store.partial_size(item.id), kept)
        options = {k: v for k, v in without_retry(opts).items() if k != "fetched"}
        options.update(commit=listing.commit, members=json.dumps(files), via=work.fetcher.mode)
        options.update(_noted(restarts))
        log.info("prewarmed model %s (%d files, %d bytes)", item.name, len(files), listing.total)
        return Ready(listing.total, options, fetched_bytes=listing.total)


def _fetch_members(
    work: Work,
    item: CacheItem,
    todo: Sequence[Member],
    found: tuple[dict[str, str], dict[str, str], dict[str, str]],
    headers: Mapping[str, str],
    total: int,
    progress: ProgressFn,
    cancelled: CancelledFn,
) -> None:
    """Fetch and commit the files of a group, at most ``group_parallel`` at once (so at
    most that many partials are open); raise the first failure once all ended. Files that
    made it are recorded in ``have`` (path -> sha256) and ``fetched`` (url -> sha256) of
    ``found``, so a retry does not fetch them again; files whose partial was dropped because
    the object changed at the origin, with why, in its third map (path -> why)."""
    have, fetched, restarts = found
    lock = threading.Lock()
    offsets = {m.path: 0 for m in todo}
    done_before = total - sum(m.size for m in todo)
    fetcher = work.fetcher

    def one(m: Member) -> None:
        part = MemberPartial(work.store, _member_key(item.id, m.path), m.size)
        try:

            def report(done: int, _: int | None, /, *, retrying: str = "") -> None:
                with lock:
                    offsets[m.path] = done
                    note = retrying and f"{m.path}: {retrying}"
                    progress(done_before + sum(offsets.values()), total, retrying=note)

            spec = FetchSpec(m.url, headers, m.sha256, resume_key=work.identity(m.url))
            fetcher.fetch(spec, part, report, cancelled)
            part.check_complete(m.path)
            sha = work.store.commit_blob(part, m.sha256, m.path)
        finally:
            part.close()
            if part.restarted is not None:
                with lock:
                    restarts[m.path] = part.restarted
        with lock:
            have[m.path] = sha
            fetched[m.url] = sha

    if not todo:
        return
    with ThreadPoolExecutor(min(work.group_parallel, len(todo))) as pool:
        errors = [f.exception() for f in [pool.submit(one, m) for m in todo]]
    failures = [e for e in errors if e is not None]
    if failures:
        # A shutdown first, then a failure worth a retry, then the rest.
        failures.sort(
            key=lambda e: (
                not isinstance(e, Cancelled),
                not (isinstance(e, FetchFailed) and e.transient),
            )
        )
        raise failures[0]


def _noted(restarts: Mapping[str, str], shown: int = 3) -> dict[str, str]:
    """The ``restarted`` option of a model: which files restarted from 0 and why (a few)."""
    if not restarts:
        return {}
    notes = [f"{path}: {why}" for path, why in sorted(restarts.items())[:shown]]
    if len(restarts) > shown:
        notes.append(f"and {len(restarts) - shown} more files")
    return {"restarted": "; ".join(notes)}


def _member_key(item_id: str, path: str) -> str:
    """A group file's partial: named by its path, so a retry resumes the same file."""
    return f"{item_id}.{hashlib.sha256(path.encode()).hexdigest()[:16]}"


SOURCE = ModelSource()
