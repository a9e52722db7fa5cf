"""Prewarm's own errors, each a kind of AgentError so the CLI and API map them as usual."""

from __future__ import annotations

import http.client

from agent.errors import AgentError, Conflict
from agent.prewarm.model import ImageWarmth


class FetchFailed(AgentError):
    """The origin (or Dragonfly) could not deliver the bytes, after retries where they help.

    ``transient``: the failure may pass (origin, proxy or network down, 5xx); the agent then
    keeps the partial and retries the item later. An answer such as 404 is not transient.
    """

    exit_code = 13  # its own: a script tells a download that failed from a full state dir

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class DigestMismatch(FetchFailed):
    """The fetched bytes do not hash to the digest the request named."""


class DiskFull(Conflict):
    """The cache volume ran out of space while writing."""


class Cancelled(AgentError):
    """Someone cancelled the item while it was being fetched."""

    exit_code = 130


class ImageWarmFailed(FetchFailed):
    """An image's data could not be warmed; ``warmth`` says how far it got."""

    def __init__(self, message: str, warmth: ImageWarmth) -> None:
        super().__init__(message)
        self.warmth = warmth


def transport_error(exc: BaseException) -> str:
    """What went wrong talking to an origin, in the agent's words: never the origin's bytes.

    http.client puts what the origin sent into its exceptions (a bad status line, a header line
    too long); those reach callers and logs, so only the kind of failure is said.
    """
    if isinstance(exc, http.client.IncompleteRead):
        return f"connection closed mid-body ({len(exc.partial)} bytes in the last read)"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "origin closed the connection without an answer"
    if isinstance(exc, http.client.BadStatusLine):
        return "origin answered a malformed status line"
    if isinstance(exc, http.client.LineTooLong):
        return "origin answered a status or header line too long"
    if isinstance(exc, http.client.HTTPException):
        return f"malformed HTTP answer ({type(exc).__name__})"
    if isinstance(exc, OSError):
        # The local system's words (errno text, TLS verification), not the origin's.
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return type(exc).__name__
