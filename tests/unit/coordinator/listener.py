"""An agent address that never answers and records whether anything connected: for the
fleet commands that must refuse their arguments before any node is contacted."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["connected", "listener"]


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[socket.socket]:
    """A Unix socket that is listening but never answers: an agent address that records
    whether anything connected."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "agent.sock"))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return False
    return True
