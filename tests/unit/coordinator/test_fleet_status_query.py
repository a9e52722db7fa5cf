"""`fleet status --coordinator URL` reads a coordinator's GET /fleet/status: what a coordinator
(or what answers in its place) sends is bounded. A body past its size, JSON nested deeper than
the parser takes, an error body of megabytes or of the wrong shape: each is one AgentError (or
InvalidSpec for a 400) naming the URL, never a crash, never the whole body, never a password
given in the URL."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.coordinator.fleet import query
from agent.coordinator.fleet.query import StatusQuery, fetch_status
from agent.errors import AgentError, InvalidSpec

#: path -> (status, body) the stand-in coordinator answers
Answers = dict[str, tuple[int, bytes]]


@pytest.fixture
def coordinator() -> Iterator[tuple[str, Answers]]:
    answers: Answers = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the tests read what the client makes of the answers, not this log."""

        def do_GET(self) -> None:
            code, body = answers["status"]
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the client stopped reading: what a bound does
                self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answers
    finally:
        server.shutdown()
        server.server_close()


def _refused(url: str, error: type[AgentError] = AgentError) -> str:
    with pytest.raises(error) as caught:
        fetch_status(url, StatusQuery(), timeout_s=10)
    said = str(caught.value)
    assert len(said) < 600, len(said)
    return said


def test_an_answer_past_its_bound_is_refused_naming_the_url(
    coordinator: tuple[str, Answers], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, answers = coordinator
    monkeypatch.setattr(query, "MAX_STATUS_BYTES", 1 << 20)
    answers["status"] = (200, b'{"nodes": "' + b"x" * (8 << 20) + b'"}')
    said = _refused(url)
    assert url in said and "larger than" in said


@pytest.mark.parametrize("body", [b"[" * 5000, b"<html>a proxy</html>", b"[1, 2]"])
def test_an_answer_that_is_not_a_json_object_is_refused_naming_the_url(
    coordinator: tuple[str, Answers], body: bytes
) -> None:
    """``[`` x 5000 raised RecursionError out of the CLI; a list was returned as the status."""
    url, answers = coordinator
    answers["status"] = (200, body)
    said = _refused(url)
    assert url in said and "[[[" not in said and "proxy" not in said


@pytest.mark.parametrize(
    "body",
    [
        b'{"error": "' + b"x" * (4 << 20) + b'"}',  # megabytes, echoed whole into the error
        b"[" * 5000,  # RecursionError
        b'["a list"]',  # AttributeError: no .get
        b"\xff\xfe not text",
    ],
)
@pytest.mark.parametrize("code", [400, 503])
def test_an_error_answer_is_read_bounded_and_said_in_one_short_line(
    coordinator: tuple[str, Answers], body: bytes, code: int
) -> None:
    url, answers = coordinator
    answers["status"] = (code, body)
    said = _refused(url, InvalidSpec if code == 400 else AgentError)
    assert "xxxxxxxxxx" * 40 not in said
    if code != 400:
        assert url in said and str(code) in said


def test_an_error_reason_of_the_right_shape_is_still_said(coordinator: tuple[str, Answers]) -> None:
    url, answers = coordinator
    answers["status"] = (400, b'{"error": "selector: bad key"}')
    assert "selector: bad key" in _refused(url, InvalidSpec)


def test_a_password_in_the_coordinator_url_is_never_shown() -> None:
    said = _refused("http://alice:s3cret@127.0.0.1:1")
    assert "s3cret" not in said and "alice" not in said and "127.0.0.1:1" in said
