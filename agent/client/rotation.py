"""The coordinator's client certificate, re-read when cert-manager rotates it in place.

`coordinator serve` keeps one fleet for weeks while its certificate lives 90 days and is renewed
30 days before it expires. `ReloadingClientTls.current` is asked before every call: three
``stat`` calls (`agent.filestamp`) while nothing changed, the same credentials object back, and
the files read only when a stamp moved. A client (agent/client/aio.py) that sees another object
moves to a new channel. A set that does not load (a key that is not the certificate's, a file
half written) is not used: the working one stays, said once in the log, until the files are
whole; a refused set is not read again until its files change. Key material is never logged.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from pathlib import Path

import grpc

from agent.client.base import ClientTls
from agent.errors import InvalidSpec
from agent.filestamp import Stamp, stamp_files

__all__ = ["ReloadingClientTls"]

log = logging.getLogger(__name__)


class ReloadingClientTls:
    """``tls``'s files as channel credentials, the same object until the files change."""

    def __init__(self, tls: ClientTls) -> None:
        self._tls = tls
        self._files = (tls.cert, tls.key, tls.ca)
        self._stamp: Stamp | None = None
        self._credentials: grpc.ChannelCredentials | None = None
        # The set last refused: logged once, and not read again until it changes.
        self._refused: Stamp | None = None

    def current(self) -> grpc.ChannelCredentials:
        """The credentials a new channel should use. The first call raises InvalidSpec when the
        files do not load (a configuration error); later ones keep the working set instead."""
        if self._credentials is None:
            self._stamp = _stamp_of(self._files)
            self._credentials = self._load()
            return self._credentials
        stamp = _stamp_of(self._files)
        if stamp in (self._stamp, self._refused):  # unchanged, or refused as they are now
            return self._credentials
        try:
            made = self._load()
        except InvalidSpec as exc:
            self._refused = stamp
            log.warning("keeping the current client certificate for the agents: %s", exc)
            return self._credentials
        if _stamp_of(self._files) != stamp:
            return self._credentials  # written while read: the next call reads it whole
        self._stamp, self._credentials, self._refused = stamp, made, None
        log.info("client TLS files changed; calls to the agents move to the new certificate")
        return made

    def _load(self) -> grpc.ChannelCredentials:
        ca, key, cert = self._tls.read()
        check = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            # grpc takes no encrypted key; asked for a password, answer none, never prompt
            check.load_cert_chain(self._tls.cert, self._tls.key, password=lambda: b"")
            check.load_verify_locations(cadata=ca.decode("ascii"))
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise InvalidSpec(
                f"the client TLS files {self._tls.cert}, {self._tls.key} and {self._tls.ca} do "
                f"not load as a certificate, its key and a CA: {_reason(exc)}"
            ) from exc
        return grpc.ssl_channel_credentials(ca, key, cert)


def _stamp_of(files: Sequence[Path]) -> Stamp:
    """The files' stamp; empty while one is missing (mid-rotation), which `_load` then names."""
    try:
        return stamp_files(files)
    except OSError:
        return ()


def _reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return f"{exc.reason.lower().replace('_', ' ')}"
    if isinstance(exc, UnicodeDecodeError):
        return "the CA file is not PEM text"
    return str(exc)
