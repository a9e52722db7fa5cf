"""Debian's tinyproxy as a stand-in for dfdaemon's HTTP proxy (:4001) in tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def tinyproxy(workdir: Path, upstream: str | None = None) -> Iterator[tuple[str, Path]]:
    """Yield (proxy URL, log file) of a tinyproxy running in the foreground; with ``upstream``
    (host:port of another HTTP proxy) it relays every request through that proxy."""
    binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
    port = _free_port()
    log = workdir / "tinyproxy.log"
    conf = workdir / "tinyproxy.conf"
    conf.write_text(
        f'Port {port}\nListen 127.0.0.1\nTimeout 60\nLogFile "{log}"\nLogLevel Info\n'
        "MaxClients 20\nAllow 127.0.0.1\nDisableViaHeader No\n"
        + (f"Upstream http {upstream}\n" if upstream else "")
    )
    log.touch()
    log.chmod(0o666)
    proc = subprocess.Popen(
        [binary, "-d", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(10)
