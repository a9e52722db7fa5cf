"""nydus-snapshotter's system controller (HTTP on a Unix socket): the prefetch hint.

``PUT /api/v1/prefetch`` with ``[{"image": <ref>, "prefetch": <path>}]`` stores, per image
reference, a value the snapshotter passes to nydusd's ``--prefetch-files`` (a newline list of
paths, read by nydusd from the host's filesystem) the next time that image's nydusd starts. It is
consumed once, only in the non-shared daemon modes, and the endpoint answers 200 even when it
could not parse the body (prewarm.md §2.2, §2.3): a sent hint is a hint, never proof of warmth.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Sequence
from pathlib import Path

from agent.errors import AgentError
from agent.prewarm.errors import FetchFailed

PREFETCH_PATH = "/api/v1/prefetch"
DEFAULT_SOCKET = Path("/run/containerd-nydus/system.sock")


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class SnapshotterClient:
    def __init__(self, socket_path: Path, timeout_s: float = 10.0) -> None:
        self.socket_path = socket_path
        self._timeout = timeout_s

    def prefetch(self, entries: Sequence[tuple[str, str]]) -> None:
        """Send ``(image ref, prefetch list path)`` hints; raises when the call did not land."""
        body = json.dumps([{"image": image, "prefetch": path} for image, path in entries])
        conn = _UnixHTTPConnection(self.socket_path, self._timeout)
        try:
            conn.request(
                "PUT", PREFETCH_PATH, body=body, headers={"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            detail = resp.read(4096).decode(errors="replace").strip()
        except OSError as exc:
            raise AgentError(
                f"nydus-snapshotter system socket {self.socket_path} not reachable: {exc}"
            ) from None
        except http.client.HTTPException as exc:
            raise FetchFailed(
                f"nydus-snapshotter at {self.socket_path} answered badly: {type(exc).__name__}"
            ) from None
        finally:
            conn.close()
        if resp.status // 100 != 2:
            raise FetchFailed(
                f"nydus-snapshotter refused the prefetch hint: {resp.status} {resp.reason}"
                + (f": {detail}" if detail else "")
            )
