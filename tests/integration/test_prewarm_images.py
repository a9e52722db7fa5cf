"""Image prewarm through our CRI client against a real containerd (CRI plugin) pulling from a
real local docker-registry; the image is built with umoci and pushed with skopeo."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.cli.prewarm import _items_table
from agent.errors import AgentError
from agent.prewarm.errors import FetchFailed
from agent.prewarm.images import CriPuller, auth_for, registry_host
from agent.prewarm.model import ImageRequest, ImageWarmth, ItemState, Warmth
from agent.prewarm.ports import PullResult, WarmResult
from tests.integration.prewarm_fixtures import cri
from tests.integration.prewarm_fixtures.agent import RecordingPuller, make_service

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(cri.missing_tools()), reason=f"needs Debian {cri.TOOLS}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="containerd needs root"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cri.Cluster]:
    work = tmp_path_factory.mktemp("cri")
    with cri.registry_and_containerd(work) as c:
        yield c


def test_pull_through_cri_is_cold_then_warm(tmp_path: Path, cluster: cri.Cluster) -> None:
    ref = cri.push_image(tmp_path, cluster.registry, "serving/model", "v1", os.urandom(1 << 20))
    svc = make_service(tmp_path)
    svc._puller = CriPuller(cluster.socket)
    item = svc.run(svc.submit(ImageRequest(ref, name="model-image")).id)
    assert item.state is ItemState.READY, item.error
    assert item.options["image_ref"].startswith("sha256:")
    assert CriPuller(cluster.socket).status(ref).id == item.options["image_ref"]
    again = CriPuller(cluster.socket).pull(ref, None)
    pulls = svc.pulls()
    assert [p.cold for p in pulls] == [True]
    assert again.cold is False


def test_pull_of_a_missing_image_fails_the_item(tmp_path: Path, cluster: cri.Cluster) -> None:
    svc = make_service(tmp_path)
    svc._puller = CriPuller(cluster.socket)
    item = svc.run(svc.submit(ImageRequest(f"{cluster.registry}/nope/none:1", name="none")).id)
    assert item.state is ItemState.FAILED
    assert item.error and "retrying" not in item.error
    assert item.retry_at is None  # not there: a retry would find it missing again


def test_an_unreachable_registry_or_runtime_is_retried_as_a_file_is(
    tmp_path: Path, cluster: cri.Cluster
) -> None:
    """A registry that refuses connections, or containerd not answering (it restarts on node
    upgrades), may come back: the item keeps a retry time, as a file whose origin is down
    does. Every image failure was final; such items stayed failed until submitted again."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # held, never listening: connections are refused
    port = closed.getsockname()[1]
    svc = make_service(tmp_path)
    svc._puller = CriPuller(cluster.socket)
    down = svc.run(svc.submit(ImageRequest(f"127.0.0.1:{port}/serving/model:1", name="r")).id)
    closed.close()
    assert down.state is ItemState.FAILED and "connection refused" in (down.error or "")
    assert down.retry_at is not None and "retry due at" in (down.error or ""), down.error
    svc._puller = CriPuller(tmp_path / "containerd-restarting.sock")
    ref = f"{cluster.registry}/serving/other:1"
    gone = svc.run(svc.submit(ImageRequest(ref, name="c")).id)
    assert gone.state is ItemState.FAILED and "CRI runtime not reachable" in (gone.error or "")
    assert "no socket there (containerd not running" in (gone.error or "")
    # Asked outside a pull (a pin, an eviction), the same answer is no download's failure.
    with pytest.raises(AgentError) as asked:
        CriPuller(tmp_path / "containerd-restarting.sock").present(ref)
    assert not isinstance(asked.value, FetchFailed) and "not reachable" in str(asked.value)
    assert gone.retry_at is not None, gone.error
    assert "bytes kept" not in (gone.error or "")  # the runtime keeps an image's, not the cache


def test_docker_config_auth_is_found_for_the_registry(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    auths = {
        "https://index.docker.io/v1/": {"auth": "dTpw"},
        "r.io": {"username": "a", "password": "b"},
    }
    cfg.write_text(json.dumps({"auths": auths}))
    hub = auth_for("library/nginx:1", cfg)
    assert hub is not None and (hub.username, hub.password) == ("u", "p")
    other = auth_for("r.io/x/y:1", cfg)
    assert other is not None and other.username == "a"
    assert auth_for("elsewhere.io/x:1", cfg) is None
    assert registry_host("localhost:5000/x") == "localhost:5000"


class _CriError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """What containerd answers a failed PullImage with: a code and its error text."""

    def __init__(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> None: ...
    def trailing_metadata(self) -> None: ...
    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None: ...
    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


def test_a_signed_blob_url_in_containerds_pull_error_is_redacted_in_the_item_and_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A registry such as ECR answers a blob GET with a redirect to a presigned object-store
    URL; when that answers 403 (expired), containerd's error names the URL it requested last,
    signature and session token included. The agent put containerd's text as it was into the
    item's error row and its log line ("prewarm of x failed: ..."); the API reply alone was
    redacted. The URL's query is now dropped where the error is made."""
    signed = (
        "https://bucket.s3.amazonaws.com/blobs/sha256/ab?X-Amz-Security-Token=SESSIONTOKEN"
        "&X-Amz-Signature=SIGNATURE"
    )
    details = (
        'failed to pull and unpack image "r.example/app:1": failed to copy: httpReadSeeker: '
        f"failed open: unexpected status code {signed}: 403 Forbidden"
    )

    class FailingPuller(RecordingPuller):
        def pull(self, ref: str, runtime_handler: str | None) -> PullResult:
            raise CriPuller(tmp_path / "cri.sock")._error(_CriError(details), ref, pulling=True)

    svc = make_service(tmp_path, puller=FailingPuller())
    with caplog.at_level(logging.WARNING, logger="agent"):
        item = svc.run(svc.submit(ImageRequest("r.example/app:1", name="app")).id)
    assert item.state is ItemState.FAILED and "403 Forbidden" in (item.error or "")
    assert "https://bucket.s3.amazonaws.com/blobs/sha256/ab?…" in (item.error or "")
    for text in (item.error or "", caplog.text):
        assert "SESSIONTOKEN" not in text and "SIGNATURE" not in text, text
    assert "prewarm of app" in caplog.text


def test_a_pin_on_a_hit_that_the_runtime_refuses_is_recorded_not_shown_as_done(
    tmp_path: Path,
) -> None:
    """`prewarm image REF --pin` for a ready image pins it in containerd after the hit. When
    containerd refused, the refusal was only logged: the item read `pinned: yes` with nothing
    saying the runtime's pin (the one the kubelet's image GC honours) was not set. It is now
    recorded as `pin_error`, as after a pull, shown in the PINNED column, and cleared once a
    later pin succeeds."""

    class RefusingPins(RecordingPuller):
        refuse = True

        def set_pinned(self, ref: str, pinned: bool) -> None:
            if self.refuse:
                raise AgentError("containerd images service unavailable")

    class PlainImages:
        def warm(self, ref: str, handler: str | None, progress: object, cancelled: object) -> Any:
            return WarmResult(ImageWarmth(Warmth.FULL))

    puller = RefusingPins()
    svc = make_service(tmp_path, puller=puller, warmer=PlainImages())
    svc.run(svc.submit(ImageRequest("r.example/app:1", name="app")).id)
    svc.submit(ImageRequest("r.example/app:1", name="app", pin=True))
    item = svc.get("app")
    assert item.pinned and "unavailable" in item.options.get("pin_error", ""), item.options
    assert "yes (not in runtime)" in _items_table([item])
    puller.refuse = False
    svc.submit(ImageRequest("r.example/app:1", name="app", pin=True))
    assert "pin_error" not in svc.get("app").options
    # `cache pin` that containerd takes clears an earlier refusal too.
    puller.refuse = True
    svc.submit(ImageRequest("r.example/app:1", name="app", pin=True))
    assert "pin_error" in svc.get("app").options
    puller.refuse = False
    assert "pin_error" not in svc.pin("app", True).options
