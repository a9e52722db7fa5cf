"""A resolver that never answers, for the agent process a test starts with this directory on
PYTHONPATH.

Why a stand-in: the agent resolves with the C library's getaddrinfo, and nothing a test can
start on loopback makes that hang without changing the machine's resolver configuration. Names
under ``hang.test`` (a reserved TLD) block forever, as a lookup does when its DNS server drops
the queries; every other name resolves as usual. Each such lookup is appended to the file
``HUNG_DNS_MARKS`` names, so the test waits for the lookup itself, not for a guessed time.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

_real = socket.getaddrinfo
_never = threading.Event()


def _getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    name = host.decode() if isinstance(host, bytes) else str(host or "")
    if name.rstrip(".").endswith(".hang.test"):
        marks = os.environ.get("HUNG_DNS_MARKS")
        if marks:
            with open(marks, "a") as f:
                f.write(name + "\n")
        _never.wait()
    return _real(host, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo
