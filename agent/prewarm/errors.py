"""Prewarm's own errors, each a kind of AgentError so the CLI and API map them as usual."""

from __future__ import annotations

from agent.errors import AgentError, Conflict
from agent.prewarm.model import ImageWarmth


class FetchFailed(AgentError):
    """The origin (or Dragonfly) could not deliver the bytes, after retries where they help.

    ``transient``: the failure may pass (origin, proxy or network down, 5xx); the agent then
    keeps the partial and retries the item later. An answer such as 404 is not transient.
    """

    exit_code = 10

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
