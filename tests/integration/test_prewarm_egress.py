"""What the agent fetches and whom it tells: real origins on loopback, the service as node.py
builds it. Loopback stands for every non-public address here: the agent refuses it until the
operator opens it (prewarm.egress_allow)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import InvalidSpec, PermissionDenied
from agent.prewarm.errors import FetchFailed
from agent.prewarm.fetch_http import FetchSpec, HttpFetcher
from agent.prewarm.headers import MAX_HEADER_FILES
from agent.prewarm.model import FileRequest, GroupRequest, ImageRequest, ItemState
from agent.prewarm.policy import MAX_URL_CHARS, UrlPolicy
from agent.prewarm.sink import DigestSink
from tests.integration.prewarm_fixtures.agent import LOOPBACK, RecordingPuller, make_service
from tests.integration.prewarm_fixtures.origin import Origin

DATA = b"weights" * 1000


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    root = tmp_path / "origin"
    root.mkdir()
    with Origin(root) as o:
        o.add("m.bin", DATA)
        yield o


def test_a_loopback_origin_is_refused_by_default_and_fetched_once_allowed(
    tmp_path: Path, origin: Origin
) -> None:
    closed = make_service(tmp_path / "closed", policy=UrlPolicy(allow_http=True))
    with pytest.raises(PermissionDenied, match="loopback"):
        closed.submit(FileRequest(origin.url("m.bin")))
    assert closed.items() == [] and origin.requests == []
    opened = make_service(
        tmp_path / "open", policy=UrlPolicy(allow_http=True, egress_allow=LOOPBACK)
    )
    item = opened.run(opened.submit(FileRequest(origin.url("m.bin"))).id)
    assert item.state is ItemState.READY, item.error


@pytest.mark.parametrize(
    "target", ["http://127.0.0.1:{port}/m.bin", "http://169.254.169.254/latest/meta-data/"]
)
def test_a_redirect_from_an_allowed_origin_to_a_denied_address_is_not_followed(
    tmp_path: Path, origin: Origin, target: str
) -> None:
    """The operator opened one name (origin.test, on loopback); its redirect to loopback by
    address, or to the metadata service, is refused without a connection."""
    policy = UrlPolicy(
        allow_http=True, egress_allow=("origin.test",), resolver=lambda h, p: ["127.0.0.1"]
    )
    origin.faults.redirects["/r"] = target.format(port=origin.port)
    svc = make_service(tmp_path, policy=policy)
    item = svc.run(svc.submit(FileRequest(f"http://origin.test:{origin.port}/r", name="r")).id)
    assert item.state is ItemState.FAILED
    assert "denied" in (item.error or "")
    assert [r.path for r in origin.requests] == ["/r"]


def test_a_name_that_rebinds_to_loopback_after_the_check_is_not_connected_to(
    tmp_path: Path, origin: Origin
) -> None:
    """Submit sees a public address; by fetch time the name points at loopback: the fetch
    checks the address it connects to, so the origin is never asked."""
    answers = iter([["203.0.113.9"], ["127.0.0.1"]])
    policy = UrlPolicy(allow_http=True, resolver=lambda h, p: next(answers))
    svc = make_service(tmp_path, policy=policy)
    item = svc.submit(FileRequest(f"http://cdn.example.com:{origin.port}/m.bin", name="m"))
    done = svc.run(item.id)
    assert done.state is ItemState.FAILED
    assert "loopback" in (done.error or "")
    assert origin.requests == []


@pytest.mark.parametrize(
    "ref",
    [
        "127.0.0.1:5000/team/app:1",
        "[::ffff:169.254.169.254]:80/latest/app:1",
        "registry.corp.example/team/app:1",  # resolves to 10.0.0.7 below
    ],
)
def test_an_image_on_a_denied_registry_is_refused_before_the_cri(tmp_path: Path, ref: str) -> None:
    puller = RecordingPuller()
    policy = UrlPolicy(resolver=lambda h, p: ["10.0.0.7"])
    svc = make_service(tmp_path, policy=policy, puller=puller)
    with pytest.raises(PermissionDenied, match="denied"):
        svc.submit(ImageRequest(ref, name="img"))
    assert svc.items() == [] and puller.pulled == []


@pytest.mark.parametrize(
    "ref",
    [
        "busybox@sha256:zz",  # not a digest
        "registry.example.com/UPPER/app:1",  # repositories are lower case
        "registry.example.com/team/app:-bad",  # a tag starts with a word character
        "registry.example.com/",
    ],
)
def test_a_malformed_image_reference_is_refused_at_submit_naming_the_image(
    tmp_path: Path, ref: str
) -> None:
    """Such a reference used to be queued and left to fail at pull time, as a failed item."""
    puller = RecordingPuller()
    svc = make_service(tmp_path, puller=puller)
    with pytest.raises(InvalidSpec) as bad:
        svc.submit(ImageRequest(ref))
    assert [v.field for v in bad.value.violations] == ["image"]
    assert svc.items() == [] and puller.pulled == []


def test_a_registry_that_moved_to_a_denied_address_is_refused_at_pull_time(
    tmp_path: Path,
) -> None:
    answers = iter([["203.0.113.9"], ["169.254.169.254"]])
    puller = RecordingPuller()
    policy = UrlPolicy(resolver=lambda h, p: next(answers))
    svc = make_service(tmp_path, policy=policy, puller=puller)
    item = svc.run(svc.submit(ImageRequest("registry.example.com/team/app:1", name="img")).id)
    assert item.state is ItemState.FAILED
    assert "metadata" in (item.error or "")
    assert puller.pulled == []


@pytest.mark.parametrize("handler", ["bad handler!", "Nydus", "a" * 64, "-nydus"])
def test_a_runtime_handler_that_is_no_runtimeclass_handler_is_refused_at_submit(
    tmp_path: Path, handler: str
) -> None:
    """It goes to the CRI as is, and the kubelet only ever asks for a RuntimeClass handler (a
    DNS label): anything else was queued and left to fail at pull, or pulled for no pod."""
    puller = RecordingPuller()
    svc = make_service(tmp_path, puller=puller)
    with pytest.raises(InvalidSpec) as bad:
        svc.submit(ImageRequest("registry.example.com/team/app:1", runtime_handler=handler))
    assert [v.field for v in bad.value.violations] == ["runtime_handler"]
    assert svc.items() == [] and puller.pulled == []


class RawOrigin:
    """A TCP server that answers every connection with the same bytes, then closes it."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self._answer)

    def close(self) -> None:
        self._sock.close()


SECRET = b"internal-secret=hunter2"


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"-ERR " + SECRET + b"\r\n", "malformed status line"),
        (b"HTTP/1.1 503 " + SECRET + b"\r\nContent-Length: 0\r\n\r\n", "HTTP 503"),
        (b"HTTP/1.1 403 " + SECRET + b"\r\nContent-Length: 0\r\n\r\n", "HTTP 403"),
        (b"HTTP/1.1 200 OK\r\nX-" + SECRET + b"x" * 70000 + b"\r\n\r\n", "too long"),
    ],
)
def test_an_origins_bytes_never_reach_the_caller(
    tmp_path: Path, answer: bytes, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    raw = RawOrigin(answer)
    try:
        svc = make_service(tmp_path, retries=1)
        item = svc.run(svc.submit(FileRequest(f"http://127.0.0.1:{raw.port}/m", name="m")).id)
    finally:
        raw.close()
    assert item.state is ItemState.FAILED
    assert said in (item.error or "")
    for text in (item.error or "", caplog.text):
        assert "internal-secret" not in text and "hunter2" not in text


@pytest.mark.parametrize(
    "length",
    [b"Content-Length: 3\r\nContent-Length: 5", b"Content-Length: -5", b"Content-Length: 3, 5"],
)
def test_a_malformed_content_length_fails_the_item_not_taken_as_unknown(
    tmp_path: Path, length: bytes
) -> None:
    """Two lengths, or one that is not a number, used to make a ready item of whatever
    http.client framed by (the first value, or up to the close), admitted as of unknown size."""
    raw = RawOrigin(b"HTTP/1.1 200 OK\r\n" + length + b"\r\n\r\nabcde")
    try:
        svc = make_service(tmp_path, retries=1)
        item = svc.run(svc.submit(FileRequest(f"http://127.0.0.1:{raw.port}/m", name="m")).id)
    finally:
        raw.close()
    assert item.state is ItemState.FAILED and item.retry_at is None
    assert "malformed Content-Length" in (item.error or "")
    assert list(svc.store.blob_dir.iterdir()) == []


def test_an_origins_dragonfly_task_id_header_is_not_shown_as_the_items(tmp_path: Path) -> None:
    """Fetched directly, with no Dragonfly on the path, the origin's own `X-Dragonfly-Task-ID`
    header went into the item's options, shown by `prewarm list -o json` and the API."""
    header = b"X-Dragonfly-Task-ID: " + SECRET + b" " + b"A" * 300
    raw = RawOrigin(b"HTTP/1.1 200 OK\r\n" + header + b"\r\nContent-Length: 3\r\n\r\nabc")
    try:
        svc = make_service(tmp_path)
        item = svc.run(svc.submit(FileRequest(f"http://127.0.0.1:{raw.port}/m", name="m")).id)
    finally:
        raw.close()
    assert item.state is ItemState.READY, item.error
    assert "dragonfly_task_id" not in item.options
    assert all("hunter2" not in v for v in item.options.values())


def test_header_secrets_go_only_to_the_origin_their_directory_is_bound_to(
    tmp_path: Path, origin: Origin
) -> None:
    secret = tmp_path / "token"
    secret.write_text("Bearer s3cr3t\n")
    with Origin(tmp_path / "origin") as other:
        svc = make_service(tmp_path, header_origins=[origin.url("")])
        # Another origin (same host, another port) is refused at submit: nothing is sent.
        with pytest.raises(PermissionDenied, match="may be sent to"):
            svc.submit(FileRequest(other.url("m.bin"), header_files={"Authorization": secret}))
        assert other.requests == []
        # Its own origin gets it; a redirect from there to the other origin does not carry it.
        origin.faults.redirects["/start"] = other.url("m.bin")
        req = FileRequest(origin.url("start"), name="m", header_files={"Authorization": secret})
        item = svc.run(svc.submit(req).id)
    assert item.state is ItemState.READY, item.error
    assert origin.requests[0].headers["Authorization"] == "Bearer s3cr3t"
    assert [r.headers.get("Authorization") for r in other.requests] == [None]


def test_a_models_header_secrets_are_bound_to_its_endpoint(tmp_path: Path, origin: Origin) -> None:
    secret = tmp_path / "token"
    secret.write_text("Bearer s3cr3t\n")
    svc = make_service(tmp_path, header_origins=["https://huggingface.co"])
    req = GroupRequest("org/m", endpoint=origin.url(""), header_files={"Authorization": secret})
    with pytest.raises(PermissionDenied, match=r"may be sent to https://huggingface\.co:443 only"):
        svc.submit(req)
    assert svc.items() == [] and origin.requests == []


@pytest.mark.parametrize("value", ["Bearer t\u00f6k\u00e9n", "Bearer \u6a21\u578b", "a\x00b"])
def test_a_header_value_http_cannot_carry_is_refused_at_submit(
    tmp_path: Path, origin: Origin, value: str
) -> None:
    secret = tmp_path / "token"
    secret.write_text(value)
    svc = make_service(tmp_path, header_origins=[origin.url("")])
    with pytest.raises(InvalidSpec, match="printable ASCII"):
        svc.submit(FileRequest(origin.url("m.bin"), header_files={"Authorization": secret}))
    assert svc.items() == [] and origin.requests == []


@pytest.mark.parametrize("endpoint", ["user", "creds", "http"])
def test_a_model_endpoint_the_policy_refuses_is_named_endpoint(
    tmp_path: Path, origin: Origin, endpoint: str
) -> None:
    """`prewarm model --endpoint http://...` on a node without allow_http was refused as
    'url: scheme ... is not allowed', naming a field the model has not: the policy checked
    the listing URL made from the endpoint under the file's field name."""
    url = {
        "user": "https://user@hub.example",
        "creds": "https://user:pw@hub.example",
        "http": origin.url(""),
    }[endpoint]
    svc = make_service(tmp_path, policy=UrlPolicy(allow_http=False, egress_allow=LOOPBACK))
    with pytest.raises(InvalidSpec) as bad:
        svc.submit(GroupRequest("org/m", endpoint=url))
    assert [v.field for v in bad.value.violations] == ["endpoint"], bad.value
    assert str(bad.value).startswith("endpoint:"), bad.value
    assert svc.items() == [] and origin.requests == []


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_fetches_of_a_non_ascii_path_leak_no_socket(origin: Origin) -> None:
    fetcher = HttpFetcher(UrlPolicy(allow_http=True, egress_allow=LOOPBACK), retries=0)
    url = origin.url("mödel.bin")

    def fetch() -> None:
        with pytest.raises(FetchFailed, match="HTTP 404"):
            fetcher.fetch(FetchSpec(url), DigestSink("0" * 64), _ignore, _never)

    fetch()
    before = _open_fds()
    for _ in range(100):
        fetch()
    # The origin serves from a thread of this process: its end of the last connection may
    # still be open for a moment. A leak would keep ~100 sockets open however long one waits.
    deadline = time.monotonic() + 2
    while _open_fds() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _open_fds() <= before
    assert origin.requests[-1].path == "/m%C3%B6del.bin"  # sent percent-encoded, as browsers do


def _ignore(done: int, total: int | None, /, *, retrying: str = "") -> None:
    """Progress, unread: these tests look at where the fetch went."""


def _never() -> bool:
    return False


@pytest.mark.parametrize("where", ["path", "query"])
def test_a_url_longer_than_the_limit_is_refused_at_submit_naming_it(
    tmp_path: Path, origin: Origin, where: str
) -> None:
    """A 100 KB URL was queued, stored and echoed whole in every listing, error, event and log
    line of its item (the origin then answered 414). URLs are now bounded at submit, the file's
    `url` as a model's `endpoint`, with a refusal that names the field and not the URL."""
    long = "a" * (MAX_URL_CHARS + 1)
    url = origin.url(long) if where == "path" else origin.url("m.bin") + "?v=" + long
    svc = make_service(tmp_path)
    with pytest.raises(InvalidSpec) as bad:
        svc.submit(FileRequest(url, name="long"))
    assert [v.field for v in bad.value.violations] == ["url"]
    assert long not in str(bad.value) and str(MAX_URL_CHARS) in str(bad.value)
    with pytest.raises(InvalidSpec) as bad:
        svc.submit(GroupRequest("org/m", endpoint=origin.url(long)))
    assert [v.field for v in bad.value.violations] == ["endpoint"]
    assert svc.items() == [] and origin.requests == []
    at_limit = origin.url("m.bin") + "?v=" + "a" * (MAX_URL_CHARS - len(origin.url("m.bin?v=")))
    assert svc.run(svc.submit(FileRequest(at_limit, name="fits")).id).state is ItemState.READY


@pytest.mark.parametrize("length", [256, 100_000])
def test_an_image_name_longer_than_a_registry_takes_is_refused_without_echoing_it(
    tmp_path: Path, length: int
) -> None:
    """An image name has at most 255 characters (the distribution reference grammar's
    NameTotalLengthMax, which containerd applies). A longer one was queued and failed at pull
    time, its reference stored and echoed in every listing and error; it is refused at submit
    naming `image`, and the refusal does not repeat it."""
    name = "registry.example.com/" + "a" * (length - len("registry.example.com/"))
    puller = RecordingPuller()
    svc = make_service(tmp_path, puller=puller)
    with pytest.raises(InvalidSpec) as bad:
        svc.submit(ImageRequest(name + ":1"))
    assert [v.field for v in bad.value.violations] == ["image"]
    assert "a" * 100 not in str(bad.value) and "255" in str(bad.value), bad.value
    assert svc.items() == [] and puller.pulled == []


def test_header_files_are_bounded_in_number_and_name_length(tmp_path: Path) -> None:
    """A request could name any number of header files, under names of any length (a valid
    HTTP token of 100,000 characters was queued, kept in the item's row and sent, for the
    origin to refuse a header line that long), and a refused name was repeated whole. At most
    16 header files with names of at most 128 characters; the refusal names `header_files`."""
    svc = make_service(tmp_path)
    url = "https://models.example.com/m.bin"
    many = {f"X-H{i}": tmp_path / "h" for i in range(MAX_HEADER_FILES + 1)}
    for headers in ({"X-" + "a" * 100_000: tmp_path / "h"}, many):
        for request in (
            FileRequest(url, header_files=headers),
            GroupRequest("org/m", endpoint="https://hub.example", header_files=headers),
        ):
            with pytest.raises(InvalidSpec) as bad:
                svc.submit(request)
            assert [v.field for v in bad.value.violations] == ["header_files"], bad.value
            assert "a" * 200 not in str(bad.value)
    assert svc.items() == []
