"""How a config setting is documented and checked: its rules, kept as data in the dataclass
field's metadata (agent/config/loader.py walks them), and the checks settings of several
sections use."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

#: The metadata key a field's `Rules` live under.
RULES_KEY = "gpu_agent.rules"


@dataclass(frozen=True)
class Rules:
    """How one setting is documented and checked; lives in the dataclass field's metadata."""

    doc: str
    choices: tuple[str, ...] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    check: Callable[[Any], bool] | None = None
    allowed: str | None = None  # what `check` accepts, said in errors and docs
    byte_size: bool = False  # the int also takes suffixes: 200Gi, 500M
    requires: str | None = None  # a sibling setting that must be set whenever this one is
    env_aliases: tuple[str, ...] = ()  # further env names, weaker than the GPU_AGENT_ one
    default_doc: str | None = None  # says what a default computed at run time is
    # An optional setting given as empty text (an env var or flag set to "") is unset; False:
    # refused, for a setting whose unset value acts on something else (--simulate "": real GPUs).
    empty_unsets: bool = True


def rules(**given: Any) -> dict[str, Rules]:
    """Field metadata holding a setting's rules (see `Rules`); a typo in a name fails at import."""
    return {RULES_KEY: Rules(**given)}


_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]\s]+)):(?P<port>[0-9]{1,5})")


def listen_host(value: str) -> str | None:
    """The host of ``host:port`` / ``[v6]:port`` with a valid port, else None."""
    match = _LISTEN.fullmatch(value)
    if match is None or int(match["port"]) > 65535:
        return None
    if match["v6"] is not None:
        try:
            ipaddress.IPv6Address(match["v6"])
        except ValueError:
            return None
        return str(match["v6"])
    return str(match["host"])


def is_listen(value: str) -> bool:
    return listen_host(value) is not None


def is_loopback_listen(value: str) -> bool:
    host = listen_host(value)
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def are_egress_entries(values: tuple[str, ...]) -> bool:
    from agent.prewarm.policy import is_host_pattern  # prewarm's stack, only when checked

    return all(is_host_pattern(value) for value in values)


def are_header_dirs(values: tuple[str, ...]) -> bool:
    from agent.prewarm.headers import parse_header_dir  # prewarm's stack, only when checked

    try:
        for value in values:
            parse_header_dir(value)
    except ValueError:
        return False
    return True
