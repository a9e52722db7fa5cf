"""What `fleet status` asks for, as CLI flags or as the query of `coordinator serve`'s
GET /fleet/status. Light on purpose: the CLI imports it to ask a coordinator without loading
the planner or gRPC."""

from __future__ import annotations

import http.client
import math
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from agent import safeyaml
from agent.client.errors import Unreachable
from agent.errors import AgentError, FieldViolation, InvalidSpec
from agent.kube import decode_json
from agent.redact import redact_url

__all__ = ["DURATION_MAX_S", "STATUS_PATH", "StatusQuery", "fetch_status", "parse_duration"]

STATUS_PATH = "/fleet/status"
#: A /fleet/status answer larger than this is refused: every node's record of a fleet of
#: thousands is a few MiB.
MAX_STATUS_BYTES = 64 << 20
#: An error answer is read no further than this: its reason is one line.
MAX_ERROR_BYTES = 64 << 10
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


#: The longest duration a fleet command or the coordinator takes (an idle threshold, a watch, a
#: pass interval, a hold): a week, as --node-timeout; past it is a typo, not a plan.
DURATION_MAX_S = 7 * 24 * 3600


def parse_duration(text: str, field: str = "idle-after") -> float:
    """Seconds from ``90``, ``30m``, ``1h``, ``2d``: finite, 0 to 7d (`DURATION_MAX_S`);
    InvalidSpec naming ``field`` (the option) otherwise."""
    raw = text.strip()
    try:
        seconds = float(raw[:-1]) * _UNITS[raw[-1]] if raw and raw[-1] in _UNITS else float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= DURATION_MAX_S:
        raise InvalidSpec(
            f"{text!r} is not a duration of 0 to 7d",
            [FieldViolation(field, "seconds, or a number with s, m, h or d, 0 to 7d: 30m")],
        )
    return seconds


@dataclass(frozen=True, slots=True)
class StatusQuery:
    selector: str = ""
    idle_after: str = "1h"
    #: a new sweep, not the coordinator's latest one
    fresh: bool = False
    #: every node's record, not only the nodes that need attention
    nodes: bool = False

    def path(self) -> str:
        fields = {"selector": self.selector, "idle_after": self.idle_after}
        if self.fresh:
            fields["fresh"] = "1"
        if self.nodes:
            fields["nodes"] = "1"
        return f"{STATUS_PATH}?{urlencode(fields)}"

    @classmethod
    def from_path(cls, path: str) -> StatusQuery:
        query = parse_qs(urlsplit(path).query)
        return cls(
            query.get("selector", [""])[-1],
            query.get("idle_after", ["1h"])[-1],
            query.get("fresh", ["0"])[-1] in ("1", "true"),
            query.get("nodes", ["0"])[-1] in ("1", "true"),
        )


def fetch_status(url: str, query: StatusQuery, timeout_s: float = 120.0) -> dict[str, Any]:
    """GET /fleet/status from a running `coordinator serve` at ``url`` (http://HOST:PORT).

    A 400 (bad selector or duration) is InvalidSpec with the coordinator's reason; another
    error status says the reason the coordinator gave too (a 503: labels it cannot read). A
    URL that is not http(s)://HOST[:PORT] is InvalidSpec, before anything is sent. The answer
    is read no further than MAX_STATUS_BYTES (an error's, MAX_ERROR_BYTES) and must be a JSON
    object; every refusal names the URL, without any user info in it."""
    shown = _shown(url)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidSpec(
            f"--coordinator {shown!r} is not a URL of a coordinator",
            [FieldViolation("coordinator", "http://HOST:PORT (or https://)")],
        )
    address = url.rstrip("/") + query.path()
    try:
        with urllib.request.urlopen(address, timeout=timeout_s) as response:
            data = response.read(MAX_STATUS_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise _error_answer(exc, shown) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise Unreachable(f"cannot reach the coordinator at {shown}: {reason}") from None
    if len(data) > MAX_STATUS_BYTES:
        raise AgentError(
            f"coordinator at {shown}: the answer is larger than {MAX_STATUS_BYTES} bytes"
        )
    doc = decode_json(data, f"coordinator at {shown}: the answer")
    if not isinstance(doc, dict):
        raise AgentError(f"coordinator at {shown}: the answer is not a JSON object")
    return doc


def _error_answer(exc: urllib.error.HTTPError, shown: str) -> AgentError:
    """The refusal an error status makes, with the coordinator's ``error`` (read bounded, cut
    short) when its body is a JSON object that has one."""
    try:
        body = decode_json(exc.read(MAX_ERROR_BYTES), "the error answer")
    except (AgentError, OSError, http.client.HTTPException):
        body = None
    said = body.get("error") if isinstance(body, dict) else None
    reason = safeyaml.capped(said, 300) if isinstance(said, str) and said else ""
    if exc.code == 400:
        return InvalidSpec(reason or f"coordinator at {shown} answered 400 {exc.reason}")
    why = f": {reason}" if reason else ""
    return AgentError(f"coordinator at {shown} answered {exc.code} {exc.reason}{why}")


def _shown(url: str) -> str:
    """``url`` as a message may show it: without user info (a password), cut short."""
    if "@" in url:  # user info: only what redact_url keeps, when it is a URL at all
        return redact_url(url) if urlsplit(url).netloc else "<a URL with user info>"
    return safeyaml.capped(url, 200)
