"""Prewarm's own errors, each a kind of AgentError so the CLI and API map them as usual."""

from __future__ import annotations

from agent.errors import AgentError, Conflict


class FetchFailed(AgentError):
    """The origin (or Dragonfly) could not deliver the bytes, after retries where they help."""

    exit_code = 10


class DigestMismatch(FetchFailed):
    """The fetched bytes do not hash to the digest the request named."""


class DiskFull(Conflict):
    """The cache volume ran out of space while writing."""


class Cancelled(AgentError):
    """Someone cancelled the item while it was being fetched."""

    exit_code = 130
