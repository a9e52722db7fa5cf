"""What `fleet status` asks for, as CLI flags or as the query of `coordinator serve`'s
GET /fleet/status. Light on purpose: the CLI imports it to ask a coordinator without loading
the planner or gRPC."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urlsplit

from agent.errors import FieldViolation, InvalidSpec

__all__ = ["STATUS_PATH", "StatusQuery", "parse_duration"]

STATUS_PATH = "/fleet/status"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``30m``, ``1h``, ``2d``."""
    raw = text.strip()
    try:
        if raw and raw[-1] in _UNITS:
            return float(raw[:-1]) * _UNITS[raw[-1]]
        return float(raw)
    except ValueError:
        raise InvalidSpec(
            f"{text!r} is not a duration",
            [FieldViolation("idle-after", "seconds, or a number with s, m, h or d: 30m")],
        ) from None


@dataclass(frozen=True, slots=True)
class StatusQuery:
    selector: str = ""
    idle_after: str = "1h"

    def path(self) -> str:
        query = urlencode({"selector": self.selector, "idle_after": self.idle_after})
        return f"{STATUS_PATH}?{query}"

    @classmethod
    def from_path(cls, path: str) -> StatusQuery:
        query = parse_qs(urlsplit(path).query)
        return cls(query.get("selector", [""])[-1], query.get("idle_after", ["1h"])[-1])
