"""Files through dfdaemon's gRPC API: ``DfdaemonDownload/DownloadTask`` on its Unix socket.

Two output modes (``prewarm.dragonfly_output``):

- ``stream``: pieces are streamed back (``need_piece_content``) and written at their offsets
  into our Sink (a Partial for files, a hash-only DigestSink for Nydus blobs); dfdaemon need not
  see our cache directory, but every byte is on disk twice (its task file and our blob).
- ``hard-link``: dfdaemon is asked for no piece content, with ``output_path`` in the cache's
  partial directory and ``force_hard_link``. dfdaemon v2 hard-links its task file there when the
  download starts (``Task::download_started``) and fails the call at once when it cannot (other
  filesystem, path not visible to it); with force_hard_link it never copies. Once the stream
  ends, the linked file becomes the partial (`LinkSink.adopt_link`) and goes through the same
  verify-and-rename path: size against the announced length, sha256 hashed again. A refusal
  (an error before any answer, without an origin's details) sends this fetch down the stream
  path; when that works, the link was the problem: dfdaemon's reason is logged and every later
  fetch of this process streams.

dfdaemon keeps finished pieces itself, so after a restart the task is asked for again from zero
and served from its local store (prewarm.md §1.7).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
from dragonfly_api import common_pb2, dfdaemon_pb2, dfdaemon_pb2_grpc

from agent.errors import PermissionDenied
from agent.prewarm.cancel import hold, release
from agent.prewarm.errors import Cancelled, FetchFailed
from agent.prewarm.fetch_http import CancelledFn, FetchInfo, FetchSpec, ProgressFn
from agent.prewarm.policy import UrlPolicy, redact_url
from agent.prewarm.sink import LinkSink, Sink
from agent.redact import redact_text
from agent.safeyaml import capped

log = logging.getLogger(__name__)

STREAM = "stream"
HARD_LINK = "hard-link"
OUTPUTS = (STREAM, HARD_LINK)

# Pieces are >= 4 MiB; gRPC's default 4 MiB receive cap would reject them.
_MAX_MESSAGE = 512 * 1024 * 1024
# How dfdaemon answers a link it cannot make: the io error as INTERNAL (or, from versions that
# check the request first, a refusal of the argument), before any message of the stream.
_REFUSALS = (
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNIMPLEMENTED,
)
_DETAILS_KEY = "grpc-status-details-bin"
#: characters of dfdaemon's error message kept in ours
_DETAILS_CHARS = 300


class _LinkRefused(Exception):
    """dfdaemon did not hard-link its task into the partial directory; the text says why."""


class DragonflyFetcher:
    def __init__(
        self, policy: UrlPolicy, socket: Path, timeout_s: float = 7200.0, output: str = STREAM
    ) -> None:
        if output not in OUTPUTS:
            raise ValueError(f"dragonfly output {output!r} is not one of {', '.join(OUTPUTS)}")
        self._policy = policy
        self._socket = socket
        self._target = f"unix://{socket}"
        self._timeout = timeout_s
        self._output = output
        self._link_refused: str | None = None  # why dfdaemon would not link: stream from then on
        self._lock = threading.Lock()

    @property
    def mode(self) -> str:
        return "dragonfly-grpc"

    def fetch(
        self, spec: FetchSpec, partial: Sink, progress: ProgressFn, cancelled: CancelledFn
    ) -> FetchInfo:
        self._policy.check(spec.url, cancelled=cancelled)  # dfdaemon fetches; the rules hold
        # Only a Partial can take a link: a DigestSink keeps no bytes, so it is always streamed.
        if (
            self._output == HARD_LINK
            and self._link_refused is None
            and isinstance(partial, LinkSink)
        ):
            try:
                return self._linked(spec, partial, progress, cancelled)
            except _LinkRefused as exc:
                log.info("dfdaemon did not link %s (%s): streaming it", redact_url(spec.url), exc)
                info = self._streamed(spec, partial, progress, cancelled)
                # Streamed where the link was refused: the link is what fails, not the task.
                self._refused(str(exc), partial.link_path.parent)
                return info
        return self._streamed(spec, partial, progress, cancelled)

    def _streamed(
        self, spec: FetchSpec, partial: Sink, progress: ProgressFn, cancelled: CancelledFn
    ) -> FetchInfo:
        download = _download(spec)
        download.need_piece_content = True
        partial.restart()
        done = 0

        def piece(p: common_pb2.Piece) -> None:
            nonlocal done
            partial.write_at(p.offset, p.content)
            done += len(p.content)
            progress(done, partial.limit)

        task_id = self._call(download, spec, partial, progress, cancelled, piece, linking=False)
        if partial.limit is not None and done != partial.limit:
            raise FetchFailed(f"dfdaemon ended {redact_url(spec.url)} at {done} of {partial.limit}")
        return FetchInfo(dragonfly_task_id=task_id, dragonfly_output=STREAM)

    def _linked(
        self, spec: FetchSpec, partial: LinkSink, progress: ProgressFn, cancelled: CancelledFn
    ) -> FetchInfo:
        link = partial.link_path
        partial.restart()
        # A link an interrupted run left may be a task file dfdaemon has since replaced; with
        # force_hard_link dfdaemon refuses to link over a different inode.
        link.unlink(missing_ok=True)
        download = _download(spec)
        download.output_path = str(link)
        download.force_hard_link = True  # a copy would be the second copy this mode avoids
        done = 0

        def piece(p: common_pb2.Piece) -> None:
            nonlocal done
            done += p.length
            progress(done, partial.limit)

        task_id = self._call(download, spec, partial, progress, cancelled, piece, linking=True)
        if partial.limit is not None and done != partial.limit:
            raise FetchFailed(f"dfdaemon ended {redact_url(spec.url)} at {done} of {partial.limit}")
        try:
            partial.adopt_link()
        except FileNotFoundError:
            # A dfdaemon that ignores output_path: its pieces are local now, streaming is cheap.
            raise _LinkRefused(f"dfdaemon finished but made no file at {link}") from None
        if partial.limit is not None and partial.offset != partial.limit:
            raise FetchFailed(
                f"dfdaemon's file for {redact_url(spec.url)} holds {partial.offset} bytes, "
                f"it announced {partial.limit}"
            )
        return FetchInfo(dragonfly_task_id=task_id, dragonfly_output=HARD_LINK)

    def _call(
        self,
        download: common_pb2.Download,
        spec: FetchSpec,
        partial: Sink,
        progress: ProgressFn,
        cancelled: CancelledFn,
        piece: Callable[[common_pb2.Piece], None],
        *,
        linking: bool,
    ) -> str | None:
        """Run one DownloadTask stream to its end; returns dfdaemon's task id."""
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE)]
        task_id = None
        answered = False
        with grpc.insecure_channel(self._target, options=options) as channel:
            stub = dfdaemon_pb2_grpc.DfdaemonDownloadStub(channel)
            request = dfdaemon_pb2.DownloadTaskRequest(download=download)
            stream = stub.DownloadTask(request, timeout=self._timeout)
            hold(cancelled, stream.cancel)  # the item's stop cancels it; dfdaemon keeps its pieces
            try:
                if cancelled():  # stopped before the stream was held
                    stream.cancel()
                    raise Cancelled("cancelled")
                for response in stream:
                    answered = True
                    task_id = response.task_id or task_id
                    kind = response.WhichOneof("response")
                    if kind == "download_task_started_response":
                        total = response.download_task_started_response.content_length
                        partial.admit(total)
                        progress(0, total)
                    elif kind == "download_piece_finished_response":
                        piece(response.download_piece_finished_response.piece)
                    if cancelled():
                        stream.cancel()
                        raise Cancelled("cancelled")
            except grpc.RpcError as exc:
                if cancelled():
                    raise Cancelled("cancelled") from None
                if linking and not answered and _is_refusal(exc):
                    raise _LinkRefused(_describe(exc)) from None
                raise _error(exc, spec.url, self._socket) from None
            finally:
                release(cancelled, stream.cancel)
        return task_id

    def _refused(self, why: str, partial_dir: Path) -> None:
        with self._lock:
            first = self._link_refused is None
            self._link_refused = why
        if first:
            log.warning(
                "dfdaemon at %s would not hard-link into %s (%s): streaming pieces instead "
                "until the agent restarts (prewarm.dragonfly_output: dfdaemon must see the "
                "cache directory at the same path, on the filesystem of its storage)",
                self._socket,
                partial_dir,
                why,
            )


def _download(spec: FetchSpec) -> common_pb2.Download:
    download = common_pb2.Download(
        url=spec.url,
        type=common_pb2.TaskType.STANDARD,
        priority=common_pb2.Priority.LEVEL6,
        request_header=dict(spec.headers),
    )
    if spec.expected_sha256:
        download.digest = f"sha256:{spec.expected_sha256}"
    return download


def _backend(exc: grpc.RpcError) -> dict[str, object] | None:
    """An origin failure's details: dfdaemon sends them as JSON {message, header, status_code}."""
    if not isinstance(exc, grpc.Call):
        return None
    for key, value in exc.trailing_metadata() or ():
        if key == _DETAILS_KEY and isinstance(value, bytes):
            try:
                backend = json.loads(value)
            except ValueError:
                return None
            return backend if isinstance(backend, dict) else None
    return None


def _is_refusal(exc: grpc.RpcError) -> bool:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    return code in _REFUSALS and _backend(exc) is None


def _describe(exc: grpc.RpcError) -> str:
    if not isinstance(exc, grpc.Call):
        return str(exc)
    return f"{exc.code().name}: {_said(exc.details())}"


def _error(exc: grpc.RpcError, url: str, socket: Path) -> Exception:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = _said(exc.details() if isinstance(exc, grpc.Call) else str(exc))
    if code is grpc.StatusCode.UNAVAILABLE:
        return FetchFailed(f"dfdaemon unreachable at {socket}: {details}", transient=True)
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"dfdaemon refused {redact_url(url)}: {details}")
    if code is grpc.StatusCode.INTERNAL:
        # Backend failures carry JSON {message, header, status_code}: the origin's words and
        # headers (which may hold secrets) stay out; only its status is said.
        backend = _backend(exc)
        if backend is not None:
            status = backend.get("status_code")
            details = (
                f"origin answered HTTP {status}"
                if isinstance(status, int) and not isinstance(status, bool)
                else "origin failed"
            )
    return FetchFailed(
        f"dfdaemon could not fetch {redact_url(url)}: {code} {details}",
        transient=code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED),
    )


def _said(details: str | None) -> str:
    """dfdaemon's own words, short, with any URL in them redacted: it names the task's URL,
    whose query may be a signature."""
    return capped(redact_text(details or ""), _DETAILS_CHARS)
