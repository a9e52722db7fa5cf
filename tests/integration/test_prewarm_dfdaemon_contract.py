"""Contract test of the dfdaemon gRPC path: a DfdaemonDownload server built from the PyPI
``dragonfly-api`` package's own service definitions, on a Unix socket, streams pieces (out of
order, as P2P does) or hard-links its task file into the cache (``output_path``,
``force_hard_link``) as dfdaemon v2 does. Not a real dfdaemon (none can run here): it checks we
speak its published API correctly and honour its documented behaviour."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

dragonfly_api = pytest.importorskip("dragonfly_api")
from dragonfly_api import common_pb2, dfdaemon_pb2, dfdaemon_pb2_grpc  # noqa: E402

from agent.config import PrewarmSettings  # noqa: E402
from agent.prewarm.errors import DigestMismatch  # noqa: E402
from agent.prewarm.factory import fetcher_from, policy_from  # noqa: E402
from agent.prewarm.fetch_dragonfly import DragonflyFetcher  # noqa: E402
from agent.prewarm.fetch_http import FetchSpec  # noqa: E402
from agent.prewarm.model import FileRequest, ItemState  # noqa: E402
from agent.prewarm.policy import UrlPolicy  # noqa: E402
from agent.prewarm.service import PrewarmService  # noqa: E402
from agent.prewarm.sink import DigestSink  # noqa: E402
from tests.integration.prewarm_fixtures.agent import LOOPBACK, make_service  # noqa: E402
from tests.integration.prewarm_fixtures.origin import Origin  # noqa: E402

pytestmark = pytest.mark.integration
PIECE = 4 * 1024 * 1024
DATA = hashlib.sha256(b"df").digest() * (10 * 1024 * 1024 // 32)


class FakeDfdaemon(dfdaemon_pb2_grpc.DfdaemonDownloadServicer):
    """Serves DATA as task-1, as dfdaemon v2 does (dragonflyoss/client ff17c0b,
    ``resource/task.rs`` ``download_started``, ``grpc/dfdaemon_download.rs`` ``download_task``):

    - its task file lives in its own storage directory, created at the content length when the
      download starts; pieces are written into it (in reverse order here, as P2P may);
    - with ``output_path`` it hard-links the task file there at that start; a failed link is an
      io error, answered as INTERNAL before any message when ``force_hard_link``, else the file
      is copied to ``output_path`` once the download finished;
    - with ``digest`` and ``output_path`` it checks the file at ``output_path`` at the end;
    - piece content goes in the stream only with ``need_piece_content``.

    ``link_errno`` makes every link fail with that errno (EXDEV: its storage on another
    filesystem); ``corrupt_after_check`` flips a byte of the task file after its digest check
    (what the agent's own check must catch); ``ignore_output_path`` is a dfdaemon that knows no
    output path (it serves the task and writes nothing there); ``backend_failure`` is an
    origin failure it reports as dfdaemon does: INTERNAL with the backend's JSON
    {message, header, status_code} in ``grpc-status-details-bin``.
    """

    def __init__(self, storage: Path) -> None:
        self.requests: list[dfdaemon_pb2.DownloadTaskRequest] = []
        self.storage = storage
        self.task_file = storage / "task-1"
        self.link_errno: int | None = None
        self.corrupt_after_check = False
        self.ignore_output_path = False
        self.backend_failure: dict[str, object] | None = None
        self.fails_with: str | None = None

    def DownloadTask(self, request, context):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        if self.backend_failure is not None:
            details = json.dumps(self.backend_failure).encode()
            context.set_trailing_metadata([("grpc-status-details-bin", details)])
            context.abort(grpc.StatusCode.INTERNAL, "backend error")
        if self.fails_with is not None:
            context.abort(grpc.StatusCode.INTERNAL, self.fails_with)
        download = request.download
        self.storage.mkdir(exist_ok=True)
        self.task_file.unlink(missing_ok=True)
        with self.task_file.open("wb") as f:
            f.truncate(len(DATA))  # dfdaemon fallocates the task file at the start
        output = Path(download.output_path) if download.HasField("output_path") else None
        if self.ignore_output_path:
            output = None
        if output is not None:
            try:
                if self.link_errno is not None:
                    raise OSError(self.link_errno, os.strerror(self.link_errno))
                os.link(self.task_file, output)
            except OSError as exc:
                if download.force_hard_link:
                    context.abort(
                        grpc.StatusCode.INTERNAL, f"{os.strerror(exc.errno)} (os error {exc.errno})"
                    )
        base = dict(host_id="h", task_id="task-1", peer_id="p")
        yield dfdaemon_pb2.DownloadTaskResponse(
            **base,
            download_task_started_response=dfdaemon_pb2.DownloadTaskStartedResponse(
                content_length=len(DATA)
            ),
        )
        offsets = list(range(0, len(DATA), PIECE))
        for number, offset in reversed(list(enumerate(offsets))):
            content = DATA[offset : offset + PIECE]
            with self.task_file.open("r+b") as f:
                f.seek(offset)
                f.write(content)
            piece = common_pb2.Piece(number=number, offset=offset, length=len(content))
            if download.need_piece_content:
                piece.content = content
            yield dfdaemon_pb2.DownloadTaskResponse(
                **base,
                download_piece_finished_response=dfdaemon_pb2.DownloadPieceFinishedResponse(
                    piece=piece
                ),
            )
        if output is not None:
            if not download.force_hard_link and not output.exists():
                shutil.copyfile(self.task_file, output)
            if download.HasField("digest"):
                got = "sha256:" + hashlib.sha256(output.read_bytes()).hexdigest()
                if got != download.digest:
                    context.abort(grpc.StatusCode.INTERNAL, f"digest mismatch {got}")
        if self.corrupt_after_check:
            with self.task_file.open("r+b") as f:
                f.write(b"\xff")


@pytest.fixture
def dfdaemon(tmp_path: Path) -> Iterator[tuple[Path, FakeDfdaemon]]:
    sock = tmp_path / "dfdaemon.sock"
    servicer = FakeDfdaemon(tmp_path / "dfdaemon-storage")
    server = grpc.server(
        futures.ThreadPoolExecutor(2), options=[("grpc.max_send_message_length", 64 << 20)]
    )
    dfdaemon_pb2_grpc.add_DfdaemonDownloadServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    yield sock, servicer
    server.stop(None)


def test_download_task_pieces_land_verified(
    tmp_path: Path, dfdaemon: tuple[Path, FakeDfdaemon]
) -> None:
    sock, servicer = dfdaemon
    policy = UrlPolicy(resolver=lambda h, p: ["203.0.113.5"])
    svc = make_service(tmp_path, fetcher=DragonflyFetcher(policy, sock), policy=policy)
    digest = hashlib.sha256(DATA).hexdigest()
    req = FileRequest("https://models.example.com/m.bin", sha256=digest)
    item = svc.run(svc.submit(req).id)
    assert item.state is ItemState.READY, item.error
    assert item.options["dragonfly_task_id"] == "task-1"
    [sent] = servicer.requests
    assert sent.download.url == "https://models.example.com/m.bin"
    assert sent.download.digest == f"sha256:{digest}"
    assert sent.download.need_piece_content
    assert hashlib.sha256(svc.store.blob_path(digest).read_bytes()).hexdigest() == digest


def test_a_nydus_blob_warms_through_download_task_into_a_hash_only_sink(
    dfdaemon: tuple[Path, FakeDfdaemon],
) -> None:
    """The gRPC path for Nydus data blobs: pieces (in reverse order) are hashed, not kept."""
    sock, servicer = dfdaemon
    policy = UrlPolicy(resolver=lambda h, p: ["203.0.113.5"])
    digest = hashlib.sha256(DATA).hexdigest()
    url = f"https://registry.example.com/v2/llm/server/blobs/sha256:{digest}"
    sink = DigestSink(digest, len(DATA))
    spec = FetchSpec(url, {"Authorization": "Bearer t0k"}, digest)
    info = DragonflyFetcher(policy, sock).fetch(spec, sink, lambda *_, **__: None, lambda: False)
    assert sink.verify() == len(DATA)
    assert info.dragonfly_task_id == "task-1"
    [sent] = servicer.requests
    assert sent.download.url == url
    assert sent.download.digest == f"sha256:{digest}"
    assert sent.download.request_header["Authorization"] == "Bearer t0k"
    assert not sent.download.tag and not sent.download.application  # task id = nydusd's
    wrong = DigestSink("0" * 64, len(DATA))
    DragonflyFetcher(policy, sock).fetch(spec, wrong, lambda *_, **__: None, lambda: False)
    with pytest.raises(DigestMismatch):
        wrong.verify()


def test_an_origin_failure_dfdaemon_reports_reaches_the_caller_as_its_status_only(
    tmp_path: Path, dfdaemon: tuple[Path, FakeDfdaemon]
) -> None:
    """dfdaemon passes on what the origin said (its message, its headers): the caller reads
    the HTTP status, never those bytes."""
    sock, servicer = dfdaemon
    servicer.backend_failure = {
        "message": "-ERR internal-secret=hunter2",
        "header": {"Set-Cookie": "session=hunter2"},
        "status_code": 503,
    }
    policy = UrlPolicy(resolver=lambda h, p: ["203.0.113.5"])
    svc = make_service(tmp_path, fetcher=DragonflyFetcher(policy, sock), policy=policy)
    item = svc.run(svc.submit(FileRequest("https://models.example.com/m.bin")).id)
    assert item.state is ItemState.FAILED
    assert "origin answered HTTP 503" in (item.error or "")
    assert "hunter2" not in (item.error or "") and "internal-secret" not in (item.error or "")


def test_dfdaemons_own_error_is_said_short_and_without_the_urls_signature(
    tmp_path: Path, dfdaemon: tuple[Path, FakeDfdaemon]
) -> None:
    """dfdaemon's message names the task's URL, query and all: the caller reads it with the
    URL redacted and cut to 300 characters (gRPC lets its trailers carry 16 KiB)."""
    sock, servicer = dfdaemon
    signed = "https://models.example.com/m.bin?X-Amz-Signature=hunter2"
    servicer.fails_with = f"download {signed} failed: " + "piece 7 timed out; " * 400
    policy = UrlPolicy(resolver=lambda h, p: ["203.0.113.5"])
    svc = make_service(tmp_path, fetcher=DragonflyFetcher(policy, sock), policy=policy)
    item = svc.run(svc.submit(FileRequest(signed)).id)
    assert item.state is ItemState.FAILED
    error = item.error or ""
    assert "download https://models.example.com/m.bin" in error and "hunter2" not in error
    assert "piece 7 timed out" in error and len(error) < 600


def _link_service(tmp_path: Path, sock: Path) -> PrewarmService:
    policy = UrlPolicy(resolver=lambda h, p: ["203.0.113.5"])
    fetcher = DragonflyFetcher(policy, sock, output="hard-link")
    return make_service(tmp_path, fetcher=fetcher, policy=policy)


def test_hard_link_mode_makes_dfdaemons_file_the_verified_blob_without_piece_content(
    tmp_path: Path, dfdaemon: tuple[Path, FakeDfdaemon]
) -> None:
    """dragonfly_output: hard-link asks for no piece content, with output_path in the cache's
    partial directory and force_hard_link; the linked file is verified (size, sha256) and
    becomes the blob: the same inode as dfdaemon's task file, no second copy."""
    sock, servicer = dfdaemon
    svc = _link_service(tmp_path, sock)
    digest = hashlib.sha256(DATA).hexdigest()
    item = svc.run(svc.submit(FileRequest("https://models.example.com/m.bin", sha256=digest)).id)
    assert item.state is ItemState.READY, item.error
    assert (item.size, item.sha256) == (len(DATA), digest)
    assert item.options["dragonfly_output"] == "hard-link"
    [sent] = servicer.requests
    assert not sent.download.need_piece_content
    assert sent.download.force_hard_link
    link = Path(sent.download.output_path)
    assert link.parent == svc.store.partial_dir and link.name == f"{item.id}.dfpart"
    blob = svc.store.blob_path(digest)
    assert blob.stat().st_ino == servicer.task_file.stat().st_ino
    assert hashlib.sha256(svc.store.name_path(item.name).read_bytes()).hexdigest() == digest
    assert list(svc.store.partial_dir.iterdir()) == []


def test_a_linked_file_that_fails_the_agents_check_is_never_ready(
    tmp_path: Path, dfdaemon: tuple[Path, FakeDfdaemon]
) -> None:
    """dfdaemon's word is not enough: a task file changed after its own digest check fails
    the item on the agent's sha256, and nothing appears at a final path."""
    sock, servicer = dfdaemon
    servicer.corrupt_after_check = True
    svc = _link_service(tmp_path, sock)
    digest = hashlib.sha256(DATA).hexdigest()
    item = svc.run(svc.submit(FileRequest("https://models.example.com/m.bin", sha256=digest)).id)
    assert item.state is ItemState.FAILED and "sha256 mismatch" in (item.error or "")
    assert not svc.store.blob_path(digest).exists()
    assert not svc.store.name_path(item.name).exists()


def test_a_refused_hard_link_falls_back_to_streaming_and_says_why(
    tmp_path: Path, dfdaemon: tuple[Path, FakeDfdaemon], caplog: pytest.LogCaptureFixture
) -> None:
    """dfdaemon refusing the link (its storage on another filesystem: EXDEV) sends the fetch
    down the stream path: the item is ready and verified, the reason is logged once, and later
    fetches stream without asking for a link again."""
    sock, servicer = dfdaemon
    servicer.link_errno = errno.EXDEV
    svc = _link_service(tmp_path, sock)
    digest = hashlib.sha256(DATA).hexdigest()
    with caplog.at_level(logging.WARNING, logger="agent.prewarm.fetch_dragonfly"):
        first = svc.run(svc.submit(FileRequest("https://models.example.com/a.bin")).id)
        second = svc.run(svc.submit(FileRequest("https://models.example.com/b.bin")).id)
    for item in (first, second):
        assert item.state is ItemState.READY, item.error
        assert (item.sha256, item.options["dragonfly_output"]) == (digest, "stream")
    linked, streamed, again = servicer.requests
    assert linked.download.force_hard_link and not linked.download.need_piece_content
    for sent in (streamed, again):
        assert sent.download.need_piece_content and not sent.download.HasField("output_path")
    # Only the fetcher's records: another test's agent in this worker may still be logging.
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "agent.prewarm.fetch_dragonfly"
    ]
    assert len(warnings) == 1 and "Invalid cross-device link (os error 18)" in warnings[0]
    assert str(svc.store.partial_dir) in warnings[0]


def test_the_dragonfly_output_setting_picks_hard_link_for_the_agents_fetcher(
    tmp_path: Path, dfdaemon: tuple[Path, FakeDfdaemon]
) -> None:
    """prewarm.dragonfly_output: hard-link reaches the fetcher the agent builds (redirects
    resolved first against a real origin, then dfdaemon links its file)."""
    sock, servicer = dfdaemon
    root = tmp_path / "origin"
    root.mkdir()
    with Origin(root) as origin:
        origin.add("m.bin", DATA)
        settings = PrewarmSettings(
            dragonfly_socket=sock,
            dragonfly_output="hard-link",
            allow_http=True,
            egress_allow=LOOPBACK,
        )
        policy = policy_from(settings)
        svc = make_service(tmp_path, fetcher=fetcher_from(settings, policy), policy=policy)
        item = svc.run(svc.submit(FileRequest(origin.url("m.bin"))).id)
    assert item.state is ItemState.READY, item.error
    assert item.options["dragonfly_output"] == "hard-link"
    assert [r.download.url for r in servicer.requests] == [origin.url("m.bin")]


def test_a_dfdaemon_that_makes_no_link_is_streamed_from_instead(
    tmp_path: Path, dfdaemon: tuple[Path, FakeDfdaemon], caplog: pytest.LogCaptureFixture
) -> None:
    """A download that ends with nothing at output_path is not ready on faith: the same task
    is streamed (from dfdaemon's local pieces) and verified, and the reason logged."""
    sock, servicer = dfdaemon
    servicer.ignore_output_path = True
    svc = _link_service(tmp_path, sock)
    digest = hashlib.sha256(DATA).hexdigest()
    with caplog.at_level(logging.WARNING, logger="agent.prewarm.fetch_dragonfly"):
        item = svc.run(svc.submit(FileRequest("https://models.example.com/m.bin")).id)
    assert item.state is ItemState.READY, item.error
    assert (item.sha256, item.options["dragonfly_output"]) == (digest, "stream")
    assert [r.download.need_piece_content for r in servicer.requests] == [False, True]
    assert any("made no file" in r.getMessage() for r in caplog.records)
