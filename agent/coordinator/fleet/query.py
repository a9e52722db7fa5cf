"""What `fleet status` asks for, as CLI flags or as the query of `coordinator serve`'s
GET /fleet/status. Light on purpose: the CLI imports it to ask a coordinator without loading
the planner or gRPC."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from agent.errors import AgentError, FieldViolation, InvalidSpec

__all__ = ["STATUS_PATH", "StatusQuery", "fetch_status", "parse_duration"]

STATUS_PATH = "/fleet/status"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, field: str = "idle-after") -> float:
    """Seconds from ``90``, ``30m``, ``1h``, ``2d``: finite, 0 or more; InvalidSpec naming
    ``field`` (the option) otherwise."""
    raw = text.strip()
    try:
        seconds = float(raw[:-1]) * _UNITS[raw[-1]] if raw and raw[-1] in _UNITS else float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise InvalidSpec(
            f"{text!r} is not a duration",
            [FieldViolation(field, "seconds, or a number with s, m, h or d, 0 or more: 30m")],
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
    URL that is not http(s)://HOST[:PORT] is InvalidSpec, before anything is sent."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidSpec(
            f"--coordinator {url!r} is not a URL of a coordinator",
            [FieldViolation("coordinator", "http://HOST:PORT (or https://)")],
        )
    address = url.rstrip("/") + query.path()
    try:
        with urllib.request.urlopen(address, timeout=timeout_s) as response:
            doc: dict[str, Any] = json.load(response)
            return doc
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
        except ValueError:
            body = {}
        if exc.code == 400:
            raise InvalidSpec(body.get("error", "bad request")) from None
        why = f": {body['error']}" if isinstance(body, dict) and body.get("error") else ""
        raise AgentError(f"coordinator at {url} answered {exc.code} {exc.reason}{why}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AgentError(f"cannot reach the coordinator at {url}: {reason}") from None
