"""Contract test of the dfdaemon gRPC path: a DfdaemonDownload server built from the PyPI
``dragonfly-api`` package's own service definitions, on a Unix socket, streams pieces (out of
order, as P2P does). Not a real dfdaemon: it checks we speak its published API correctly."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

dragonfly_api = pytest.importorskip("dragonfly_api")
from dragonfly_api import common_pb2, dfdaemon_pb2, dfdaemon_pb2_grpc  # noqa: E402

from agent.prewarm.errors import DigestMismatch  # noqa: E402
from agent.prewarm.fetch_dragonfly import DragonflyFetcher  # noqa: E402
from agent.prewarm.fetch_http import FetchSpec  # noqa: E402
from agent.prewarm.model import FileRequest, ItemState  # noqa: E402
from agent.prewarm.policy import UrlPolicy  # noqa: E402
from agent.prewarm.sink import DigestSink  # noqa: E402
from tests.integration.prewarm_fixtures.agent import make_service  # noqa: E402

pytestmark = pytest.mark.integration
PIECE = 4 * 1024 * 1024
DATA = hashlib.sha256(b"df").digest() * (10 * 1024 * 1024 // 32)


class FakeDfdaemon(dfdaemon_pb2_grpc.DfdaemonDownloadServicer):
    def __init__(self) -> None:
        self.requests: list[dfdaemon_pb2.DownloadTaskRequest] = []

    def DownloadTask(self, request, context):  # type: ignore[no-untyped-def]
        self.requests.append(request)
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
            piece = common_pb2.Piece(
                number=number, offset=offset, length=len(content), content=content
            )
            yield dfdaemon_pb2.DownloadTaskResponse(
                **base,
                download_piece_finished_response=dfdaemon_pb2.DownloadPieceFinishedResponse(
                    piece=piece
                ),
            )


@pytest.fixture
def dfdaemon(tmp_path: Path) -> Iterator[tuple[Path, FakeDfdaemon]]:
    sock = tmp_path / "dfdaemon.sock"
    servicer = FakeDfdaemon()
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
    info = DragonflyFetcher(policy, sock).fetch(spec, sink, lambda d, t: None, lambda: False)
    assert sink.verify() == len(DATA)
    assert info.dragonfly_task_id == "task-1"
    [sent] = servicer.requests
    assert sent.download.url == url
    assert sent.download.digest == f"sha256:{digest}"
    assert sent.download.request_header["Authorization"] == "Bearer t0k"
    assert not sent.download.tag and not sent.download.application  # task id = nydusd's
    wrong = DigestSink("0" * 64, len(DATA))
    DragonflyFetcher(policy, sock).fetch(spec, wrong, lambda d, t: None, lambda: False)
    with pytest.raises(DigestMismatch):
        wrong.verify()
