"""A stop ends every wait on a peer that never answers (issue 36): a DNS lookup, a registry, a
redirect probe, a Dragonfly proxy fetching an image's blob.

Real peers on loopback that accept and never answer; a real agent process whose resolver never
answers for one name (`tests/integration/hung_dns`); and the prewarm service stopping as the
agent's shutdown stops it. Before, each of these held a prewarm thread, and so the shutdown,
for the 30 s socket timeout (the lookup: for ever).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent._proto.gpuagent.v1 import prewarm_pb2, prewarm_pb2_grpc
from agent.prewarm.fetch_http import HttpFetcher
from agent.prewarm.image_warm import NydusWarmer
from agent.prewarm.model import FileRequest, ImageRequest, ItemState
from agent.prewarm.nydus import BLOB_ANNOTATION
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.redirects import ResolvingFetcher
from agent.prewarm.registry import OCI_MANIFEST, RegistryClient
from agent.prewarm.service import PrewarmService
from tests.integration.prewarm_fixtures.agent import LOOPBACK, RecordingPuller, make_service
from tests.integration.prewarm_fixtures.origin import Origin
from tests.integration.shutdown_fixtures import SilentPeer, assert_quick_clean_exit, silent_peer
from tests.unit.api.support import AgentProcess, agent_config, unix_channel, wait_for

pytestmark = pytest.mark.integration

HUNG_DNS = Path(__file__).parent / "hung_dns"
#: The prewarm service's own stop, in-process: no interpreter to start or end.
STOP_S = 1.0


@pytest.fixture
def peer() -> Iterator[SilentPeer]:
    with silent_peer() as p:
        yield p


def reading() -> bool:
    """A prewarm worker waits in a socket read: its innermost frame is socket.py's readinto."""
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if thread.name.startswith("prewarm") and frame is not None:
            code = frame.f_code
            if code.co_name == "readinto" and code.co_filename.endswith("socket.py"):
                return True
    return False


def stop_once_asked(
    svc: PrewarmService, peer: SilentPeer, item_id: str, *, body: bool = False
) -> None:
    """Wait until the peer holds the fetch's request (``body``: and the first bytes of its
    answer are in the cache), stop the service as the agent's shutdown does, and check it took
    no longer than the promise and left the item to resume."""
    svc.schedule_pending()
    assert peer.asked.wait(30), "the fetch never reached the peer"
    if body:
        partials = svc.store.partial_dir
        wait_for(lambda: any(p.stat().st_size for p in partials.glob("*.part")), "the body", 30)
    wait_for(reading, "a worker waiting on the peer", 30)
    started = time.monotonic()
    svc.stop()
    took = time.monotonic() - started
    assert took < STOP_S, f"the stop took {took:.2f}s"
    assert svc.index.get(item_id).state in (ItemState.QUEUED, ItemState.FETCHING)


def test_stop_ends_a_manifest_read_from_a_registry_that_never_answers(
    tmp_path: Path, peer: SilentPeer
) -> None:
    warmer = NydusWarmer(RegistryClient(UrlPolicy(egress_allow=LOOPBACK)))
    svc = make_service(tmp_path, puller=RecordingPuller(), warmer=warmer)
    svc.start()
    item = svc.submit(ImageRequest(f"127.0.0.1:{peer.port}/team/app:1"))
    stop_once_asked(svc, peer, item.id)
    assert peer.requests[0].startswith(b"GET /v2/team/app/manifests/1 ")


def test_stop_ends_a_body_that_stalls_after_headers_that_close_the_connection(
    tmp_path: Path,
) -> None:
    """``Connection: close`` makes http.client hand the socket to the response and close the
    connection it came from: the stop must still reach the body's read."""
    headers = b"HTTP/1.1 200 OK\r\nContent-Length: 2097152\r\nConnection: close\r\n\r\n"
    with silent_peer(headers + b"x" * (1 << 20)) as peer:  # a read's whole buffer, then nothing
        svc = make_service(tmp_path)
        svc.start()
        item = svc.submit(FileRequest(f"http://127.0.0.1:{peer.port}/w.bin"))
        stop_once_asked(svc, peer, item.id, body=True)


def test_stop_ends_a_redirect_probe_to_an_origin_that_never_answers(
    tmp_path: Path, peer: SilentPeer
) -> None:
    """dfdaemon's fetchers first follow the URL's redirects themselves (agent/prewarm/redirects)."""
    policy = UrlPolicy(allow_http=True, egress_allow=LOOPBACK)
    fetcher = ResolvingFetcher(HttpFetcher(policy), policy)
    svc = make_service(tmp_path, fetcher=fetcher, policy=policy)
    svc.start()
    item = svc.submit(FileRequest(f"http://127.0.0.1:{peer.port}/w.bin"))
    stop_once_asked(svc, peer, item.id)
    assert b"Range: bytes=0-0" in peer.requests[0]


def test_stop_ends_a_nydus_blob_fetch_through_a_dragonfly_proxy_that_never_answers(
    tmp_path: Path, origin: Origin, peer: SilentPeer
) -> None:
    """The blob fetcher is built per image; the agent's stop once reached only its own."""
    blob = {"mediaType": "application/vnd.oci.image.layer.v1.tar", "size": 1 << 20}
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "layers": [{**blob, "digest": "sha256:" + "a" * 64, "annotations": {BLOB_ANNOTATION: "1"}}],
    }
    (origin.root / "v2" / "team" / "app" / "manifests").mkdir(parents=True)
    origin.add("v2/team/app/manifests/1", json.dumps(manifest).encode())
    proxy = f"http://127.0.0.1:{peer.port}"
    warmer = NydusWarmer(
        RegistryClient(UrlPolicy(egress_allow=LOOPBACK)),
        lambda policy: HttpFetcher(policy, proxy=proxy),
    )
    svc = make_service(tmp_path, puller=RecordingPuller(), warmer=warmer)
    svc.start()
    item = svc.submit(ImageRequest(f"127.0.0.1:{origin.port}/team/app:1", runtime_handler="nydus"))
    stop_once_asked(svc, peer, item.id)
    assert f"/v2/team/app/blobs/sha256:{'a' * 64} ".encode() in peer.requests[0]


def test_sigterm_while_a_redirect_target_does_not_resolve_exits_0_at_once(
    tmp_path: Path, origin: Origin
) -> None:
    """The origin redirects to a name whose lookup never returns: the prewarm thread waits on
    it, and the SIGTERM must not."""
    origin.faults.redirects["/w.bin"] = f"http://files.hang.test:{origin.port}/w.bin"
    prewarm = {
        "cache_dir": str(tmp_path / "cache"),
        "allowed_hosts": ["127.0.0.1", "*.hang.test"],
        "egress_allow": ["127.0.0.0/8", "::1"],
        "allow_http": True,
    }
    agent = AgentProcess(tmp_path, agent_config(tmp_path, prewarm=prewarm))
    marks = tmp_path / "lookups"
    path = os.pathsep.join(p for p in (str(HUNG_DNS), os.environ.get("PYTHONPATH")) if p)
    agent.env = {"PYTHONPATH": path, "HUNG_DNS_MARKS": str(marks)}
    try:
        agent.start()
        target = prewarm_pb2.PrewarmTarget(file=prewarm_pb2.FileTarget(url=origin.url("w.bin")))
        with unix_channel(agent.socket) as channel:
            prewarm_pb2_grpc.PrewarmServiceStub(channel).SubmitPrewarm(
                prewarm_pb2.SubmitPrewarmRequest(targets=[target]), timeout=10
            )
        wait_for(marks.exists, "the agent to look files.hang.test up", 30)
        assert_quick_clean_exit(agent)
    finally:
        agent.stop()
    assert "files.hang.test" in marks.read_text()
