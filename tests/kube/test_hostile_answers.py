"""What an API server, or a proxy in front of it, may answer that no real one does, against the
stand-in (tests/kube/fake_edge.py): JSON nested deeper than Python's parser takes, a
Retry-After that is not ASCII digits, a resourceVersion that is not one, a Status message of
megabytes, a bug of ours. Each is a failed call: said (the cache stale, the Node's write
failed), backed off, and over once the server behaves; the watch and the Node's owner go on,
and nothing of the answer is echoed."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import tracemalloc
from typing import Any

import pytest

from agent.errors import AgentError
from agent.kube import InClusterKubeClient
from agent.kube_node import Claim
from agent.kube_watch import Informer
from tests.kube.fake_edge import EdgeKubeApi
from tests.kube.fixtures import NODE, started_owner
from tests.unit.api.support import wait_for

NODES = "/api/v1/nodes"
NODE_PATH = f"{NODES}/{NODE}"
CACHE = Claim("cache", label_prefixes=("gpu-agent.io/cache.",))
#: Deeper than json's parser takes (RecursionError at about 1,000), in 5 KB.
DEEP = b"[" * 5000 + b"\n"


def _informer(kube: Any, **kw: Any) -> Informer:
    return Informer(kube, NODES, {"fieldSelector": f"metadata.name={NODE}"}, **kw)


def _alive(informer: Informer) -> bool:
    return informer._thread is not None and informer._thread.is_alive()


def _labelled(informer: Informer, value: str) -> bool:
    objects = informer.objects()
    return bool(objects) and objects[0]["metadata"]["labels"].get("after") == value


@pytest.mark.parametrize("watch", [True, False], ids=["watch event", "list answer"])
def test_json_nested_too_deep_is_a_failed_call_said_stale_and_the_watch_goes_on(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient, watch: bool
) -> None:
    """json.loads raised RecursionError, which nothing caught: the informer's thread ended, its
    status still said current, and the cache never changed again."""
    api, _ = edge_api
    informer = _informer(kube, watch_timeout_s=1, backoff=(0.3, 0.6))
    if not watch:
        api.garble_next("GET", NODES, DEEP, watch=False)  # the first list
    informer.start()
    try:
        if watch:
            assert informer.synced.wait(10) and informer.healthy
            api.garble_next("GET", NODES, DEEP, watch=True)
        wait_for(lambda: informer.error, "the answer refused", timeout=10)
        current, detail = informer.status()
        assert not current and "nested" in detail, detail
        assert "[[[" not in detail  # named, not echoed
        api.set_labels(NODE, {"after": "deep"})
        wait_for(lambda: _labelled(informer, "deep"), "the next change by watch", timeout=10)
        assert informer.status()[0] and _alive(informer)
    finally:
        informer.stop()


def test_a_retry_after_that_is_not_ascii_digits_is_the_back_off_for_the_watch(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """``"²".isdigit()`` is True and ``float("²")`` a ValueError: the cache said that, not the
    429 the server answered."""
    api, _ = edge_api
    api.fail_next("GET", NODES, 429, count=1, retry_after="²")
    informer = _informer(kube, backoff=(0.6, 1.2)).start()
    try:
        wait_for(lambda: informer.error, "the 429 said", timeout=10)
        assert "429" in informer.error, informer.error
        assert informer.synced.wait(10) and informer.healthy and _alive(informer)
        assert informer.lists == 1
    finally:
        informer.stop()


def _written(api: EdgeKubeApi, value: str) -> bool:
    return api.nodes[NODE].get("gpu-agent.io/cache.llama") == value


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(lambda api: api.fail_next("PATCH", NODE_PATH, 429, 1, "²"), id="429 ²"),
        pytest.param(lambda api: api.garble_next("PATCH", NODE_PATH, DEEP), id="a deep answer"),
    ],
)
def test_a_node_write_answered_with_what_no_server_sends_is_retried_not_fatal(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient, fault: Any
) -> None:
    """Each of these ended the Node owner's thread (it caught AgentError only): the agent never
    wrote its Node again until restarted, and nothing said so."""
    api, _ = edge_api
    with started_owner(kube, 0.01, backoff=(0.05, 0.1)) as owner:
        fault(api)
        owner.part(CACHE).set(labels={"gpu-agent.io/cache.llama": "ready"})
        wait_for(lambda: _written(api, "ready"), "written", timeout=10)
        owner.part(CACHE).set(labels={"gpu-agent.io/cache.llama": "later"})
        wait_for(lambda: _written(api, "later"), "and later", timeout=10)


class _Flaky:
    """The real client, but its first ``calls`` of ``method`` raise what a bug of ours would."""

    def __init__(self, kube: InClusterKubeClient, method: str, calls: int = 1) -> None:
        self._kube, self._method, self.left = kube, method, calls

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._kube, name)
        if name != self._method:
            return found

        def flaky(*args: Any, **kw: Any) -> Any:
            if self.left > 0:
                self.left -= 1
                raise KeyError("a bug of ours")
            return found(*args, **kw)

        return flaky


def test_a_bug_in_the_watch_loop_is_a_failed_call_logged_once_with_its_traceback(
    kube: InClusterKubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    flaky = _Flaky(kube, "list_all", calls=3)
    informer = _informer(flaky, backoff=(0.2, 0.4))
    with caplog.at_level(logging.WARNING, logger="agent.kube_watch"):
        informer.start()
        try:
            wait_for(lambda: informer.error, "the bug said", timeout=10)
            current, detail = informer.status()
            assert not current and "KeyError" in detail, detail
            assert informer.synced.wait(10) and informer.status()[0] and _alive(informer)
        finally:
            informer.stop()
    traced = [r for r in caplog.records if r.exc_info and r.name == "agent.kube_watch"]
    assert len(traced) == 1 and flaky.left == 0, [r.getMessage() for r in caplog.records]


def test_a_bug_in_the_node_write_is_a_failed_write_said_and_retried(
    edge_api: tuple[EdgeKubeApi, str],
    kube: InClusterKubeClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, _ = edge_api
    flaky = _Flaky(kube, "request", calls=2)
    with (
        caplog.at_level(logging.WARNING, logger="agent.kube_node"),
        started_owner(flaky, 0.01, backoff=(0.3, 0.6)) as owner,
    ):
        owner.part(CACHE).set(labels={"gpu-agent.io/cache.llama": "ready"})
        wait_for(lambda: owner.error, "the failed write said", timeout=10)
        assert "KeyError" in owner.error
        wait_for(lambda: _written(api, "ready"), "written", timeout=10)
        wait_for(lambda: not owner.error, "the error cleared", timeout=10)
    traced = [r for r in caplog.records if r.exc_info and r.name == "agent.kube_node"]
    assert len(traced) == 1, [r.getMessage() for r in caplog.records]


def test_a_status_message_of_megabytes_is_cut_in_the_error(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """The message was kept whole: logged at every retry and held in the cache's status."""
    api, _ = edge_api
    api.fail_next("GET", NODE_PATH, 500, message="x" * (1 << 20))
    with pytest.raises(AgentError) as caught:
        kube.request("GET", NODE_PATH)
    assert "500" in str(caught.value) and len(str(caught.value)) < 500


def _versioned(version: str) -> dict[str, Any]:
    return {"metadata": {"name": NODE, "resourceVersion": version}}


def test_resource_versions_that_are_not_ascii_integers_do_not_break_the_cache() -> None:
    """``int("²")`` and ``int()`` of 5,000 digits raise ValueError: out of a write of ours
    (`assume`), it ended the Node owner's thread."""
    informer = _informer(None)
    informer.assume(_versioned("7"))
    informer.assume(_versioned("²"))  # not comparable: taken, as any opaque version
    assert informer.objects() == [_versioned("²")]
    informer.assume(_versioned("1" * 5000))
    informer.assume(_versioned("9" * 4999))  # older, however long: ignored
    assert informer.objects() == [_versioned("1" * 5000)]
    informer.assume(_versioned("0" * 10 + "2" + "0" * 4999))  # leading zeros are not size
    assert informer.objects() == [_versioned("0" * 10 + "2" + "0" * 4999)]


def test_a_refused_watch_reads_no_more_of_its_error_than_a_status_needs(
    edge_api: tuple[EdgeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """The error body of a refused watch was read up to 64 MiB, for a message cut to 300."""
    api, _ = edge_api
    status = {"kind": "Status", "apiVersion": "v1", "code": 500, "message": "x" * (16 << 20)}
    api.fail_next("GET", NODES, 500, message=json.dumps(status).encode())
    tracemalloc.start()
    try:
        with pytest.raises(AgentError) as caught:
            kube.watch(NODES, {}, "1", 5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "500" in str(caught.value) and len(str(caught.value)) < 500
    assert peak < 4 << 20, peak


def test_a_reason_phrase_of_kilobytes_with_escapes_is_cut_to_one_printable_line() -> None:
    """Only a Status's message was cut: the reason phrase after the status code went into the
    error, GetNode's kubernetes component and every retry's log line whole, terminal escapes
    and all (as a proxy's does in a tunnel's error)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    body = b'{"kind":"Status","message":"refused"}'

    def answer() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn:
                    conn.recv(65536)
                    head = b"HTTP/1.1 422 " + b"R" * 60_000 + b"\x1b]0;pwned\x07\r\n"
                    conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    threading.Thread(target=answer, daemon=True).start()
    port = server.getsockname()[1]
    client = InClusterKubeClient(f"http://127.0.0.1:{port}", token_path=None, token="t", timeout=5)
    try:
        with pytest.raises(AgentError) as caught:
            client.request("PATCH", NODE_PATH, body={})
    finally:
        server.close()
    said = str(caught.value)
    assert "422" in said and "refused" in said and len(said) < 800, len(said)
    assert said.isprintable()
