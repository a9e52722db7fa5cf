"""Debian's tinyproxy as a stand-in for dfdaemon's HTTP proxy (:4001) and for a kubeconfig's
proxy-url in tests."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.ports import launch_listening, stop


@contextmanager
def tinyproxy(
    workdir: Path, upstream: str | None = None, basic_auth: tuple[str, str] | None = None
) -> Iterator[tuple[str, Path]]:
    """Yield (proxy URL, log file) of a tinyproxy running in the foreground; with ``upstream``
    (host:port of another HTTP proxy) it relays every request through that proxy; with
    ``basic_auth`` (user, password: letters, digits, ``-._`` as its config takes them) it
    answers 407 to a request or CONNECT without them."""
    binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
    log = workdir / "tinyproxy.log"
    conf = workdir / "tinyproxy.conf"
    log.touch()
    log.chmod(0o666)

    def launch(port: int) -> list[subprocess.Popen[bytes]]:
        conf.write_text(
            f'Port {port}\nListen 127.0.0.1\nTimeout 60\nLogFile "{log}"\nLogLevel Info\n'
            "MaxClients 20\nAllow 127.0.0.1\nDisableViaHeader No\n"
            + (f"Upstream http {upstream}\n" if upstream else "")
            + ("BasicAuth {} {}\n".format(*basic_auth) if basic_auth else "")
        )
        return [
            subprocess.Popen(
                [binary, "-d", "-c", str(conf)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        ]

    port, procs = launch_listening(launch)
    try:
        yield f"http://127.0.0.1:{port}", log
    finally:
        stop(procs, 10)
