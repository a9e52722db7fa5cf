"""The nydus-snapshotter prefetch hint, against a real HTTP server on a Unix socket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.errors import AgentError
from agent.prewarm.errors import FetchFailed
from agent.prewarm.snapshotter import SnapshotterClient
from tests.integration.prewarm_fixtures.snapshotter import FakeSnapshotter


def test_prefetch_hint_is_a_put_of_a_json_array(tmp_path: Path) -> None:
    with FakeSnapshotter(tmp_path / "system.sock") as fake:
        SnapshotterClient(fake.socket_path).prefetch(
            [("docker.io/library/app:1", "/etc/nydus/prefetch-all"), ("app:1", "/x")]
        )
    [got] = fake.received
    assert (got.method, got.path, got.content_type) == (
        "PUT",
        "/api/v1/prefetch",
        "application/json",
    )
    assert json.loads(got.body) == [
        {"image": "docker.io/library/app:1", "prefetch": "/etc/nydus/prefetch-all"},
        {"image": "app:1", "prefetch": "/x"},
    ]


def test_a_refusal_or_a_missing_socket_is_an_error(tmp_path: Path) -> None:
    with (
        FakeSnapshotter(tmp_path / "system.sock", status=500) as fake,
        pytest.raises(FetchFailed, match="refused the prefetch hint: 500"),
    ):
        SnapshotterClient(fake.socket_path).prefetch([("a:1", "/p")])
    with pytest.raises(AgentError, match="not reachable"):
        SnapshotterClient(tmp_path / "absent.sock").prefetch([("a:1", "/p")])
