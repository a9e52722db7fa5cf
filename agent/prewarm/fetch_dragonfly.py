"""Files through dfdaemon's gRPC API: ``DfdaemonDownload/DownloadTask`` on its Unix socket.

Pieces are streamed back (``need_piece_content``) and written at their offsets into our Sink
(a Partial for files, a hash-only DigestSink for Nydus blobs), so the cache's verify-and-rename
path is the same as for HTTP and dfdaemon need not see our cache directory. dfdaemon keeps
finished pieces itself, so after a restart the task is asked for again from zero and served
from its local store (prewarm.md §1.7).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc
from dragonfly_api import common_pb2, dfdaemon_pb2, dfdaemon_pb2_grpc

from agent.errors import PermissionDenied
from agent.prewarm.errors import Cancelled, FetchFailed
from agent.prewarm.fetch_http import CancelledFn, FetchInfo, FetchSpec, ProgressFn
from agent.prewarm.policy import UrlPolicy, redact_url
from agent.prewarm.sink import Sink

# Pieces are >= 4 MiB; gRPC's default 4 MiB receive cap would reject them.
_MAX_MESSAGE = 512 * 1024 * 1024


class DragonflyFetcher:
    def __init__(self, policy: UrlPolicy, socket: Path, timeout_s: float = 7200.0) -> None:
        self._policy = policy
        self._socket = socket
        self._target = f"unix://{socket}"
        self._timeout = timeout_s
        self._live: set[grpc.Future] = set()
        self._live_lock = threading.Lock()

    @property
    def mode(self) -> str:
        return "dragonfly-grpc"

    def fetch(
        self, spec: FetchSpec, partial: Sink, progress: ProgressFn, cancelled: CancelledFn
    ) -> FetchInfo:
        self._policy.check(spec.url)  # dfdaemon fetches for us; the rules still apply
        download = common_pb2.Download(
            url=spec.url,
            type=common_pb2.TaskType.STANDARD,
            priority=common_pb2.Priority.LEVEL6,
            request_header=dict(spec.headers),
            need_piece_content=True,
        )
        if spec.expected_sha256:
            download.digest = f"sha256:{spec.expected_sha256}"
        partial.restart()
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE)]
        task_id = None
        done = 0
        with grpc.insecure_channel(self._target, options=options) as channel:
            stub = dfdaemon_pb2_grpc.DfdaemonDownloadStub(channel)
            request = dfdaemon_pb2.DownloadTaskRequest(download=download)
            stream = stub.DownloadTask(request, timeout=self._timeout)
            with self._live_lock:
                self._live.add(stream)
            try:
                for response in stream:
                    task_id = response.task_id or task_id
                    kind = response.WhichOneof("response")
                    if kind == "download_task_started_response":
                        total = response.download_task_started_response.content_length
                        partial.admit(total)
                        progress(0, total)
                    elif kind == "download_piece_finished_response":
                        piece = response.download_piece_finished_response.piece
                        partial.write_at(piece.offset, piece.content)
                        done += len(piece.content)
                        progress(done, partial.limit)
                    if cancelled():
                        stream.cancel()
                        raise Cancelled("cancelled")
            except grpc.RpcError as exc:
                if cancelled():
                    raise Cancelled("cancelled") from None
                raise _error(exc, spec.url, self._socket) from None
            finally:
                with self._live_lock:
                    self._live.discard(stream)
        if partial.limit is not None and done != partial.limit:
            raise FetchFailed(f"dfdaemon ended {redact_url(spec.url)} at {done} of {partial.limit}")
        return FetchInfo(dragonfly_task_id=task_id)

    def interrupt(self) -> None:
        """Cancel every stream in flight (the agent is stopping); dfdaemon keeps its pieces."""
        with self._live_lock:
            live = list(self._live)
        for stream in live:
            stream.cancel()


def _error(exc: grpc.RpcError, url: str, socket: Path) -> Exception:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    if code is grpc.StatusCode.UNAVAILABLE:
        return FetchFailed(f"dfdaemon unreachable at {socket}: {details}", transient=True)
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"dfdaemon refused {redact_url(url)}: {details}")
    if code is grpc.StatusCode.INTERNAL:
        # Backend failures carry JSON {message, header, status_code}; headers may hold secrets.
        for key, value in exc.trailing_metadata() or ():
            if key == "grpc-status-details-bin" and isinstance(value, bytes):
                try:
                    backend = json.loads(value)
                    details = f"origin {backend.get('status_code')}: {backend.get('message')}"
                except ValueError:
                    pass
    return FetchFailed(
        f"dfdaemon could not fetch {redact_url(url)}: {code} {details}",
        transient=code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED),
    )
