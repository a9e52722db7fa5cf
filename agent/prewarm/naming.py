"""Names users give cache items, and the node-label keys derived from them.

A name becomes a path component under the cache directory and part of a label key, so it is
checked once here: no separators, no dot-dot, the label character set, at most 63 characters.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import unquote, urlsplit

from agent.errors import FieldViolation, InvalidSpec

LABEL_PREFIX = "gpu-agent.io/cache."
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
# Kubernetes: the name part of a label key (after "gpu-agent.io/") is at most 63 characters.
_LABEL_NAME_MAX = 63
_LABEL_SHORT_MAX = _LABEL_NAME_MAX - len("cache.")
_HASH_CHARS = 8


def check_name(name: str, field: str = "name") -> str:
    """Return ``name`` if it is a safe item name, else raise InvalidSpec naming the rule."""
    if ".." in name or "/" in name or "\\" in name or not _NAME.fullmatch(name):
        raise InvalidSpec(
            f"{field} {name!r} is not a valid item name",
            [
                FieldViolation(
                    field,
                    "1-63 characters of A-Z a-z 0-9 . _ -, starting and ending with a letter or "
                    "digit, without '..' or '/'",
                )
            ],
        )
    return name


def default_name(source: str) -> str:
    """A safe name derived from a URL's last path segment or an image reference."""
    parts = urlsplit(source)
    tail = unquote(parts.path.rstrip("/").rsplit("/", 1)[-1]) if parts.scheme else source
    tail = tail.rsplit("/", 1)[-1].replace(":", "-").replace("@", "-")
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip("._-").replace("..", ".")
    if not cleaned:
        cleaned = "item"
    if len(cleaned) > 63:
        digest = hashlib.sha256(source.encode()).hexdigest()[:_HASH_CHARS]
        cleaned = f"{cleaned[: 63 - _HASH_CHARS - 1].rstrip('._-')}-{digest}"
    return check_name(cleaned)


def label_key(name: str) -> str:
    """``gpu-agent.io/cache.<short-name>``; names too long for a label keep a prefix + hash.

    Like Fluid's fallback, a hash keeps distinct long names distinct while the prefix keeps the
    key readable.
    """
    short = name.replace("_", "-")
    if len(short) > _LABEL_SHORT_MAX:
        digest = hashlib.sha256(name.encode()).hexdigest()[:_HASH_CHARS]
        head = short[: _LABEL_SHORT_MAX - _HASH_CHARS - 1].rstrip("._-")
        short = f"{head}-{digest}"
    return LABEL_PREFIX + short
