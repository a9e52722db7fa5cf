"""When a partial's bytes may be resumed, and when the object changed under them (pure rules).

A partial keeps the validators of the answer its bytes came from (`Sink.save_validators`): the
item's source identity (its URL without signature parameters), the ETag, Last-Modified and the
object's total size. A later fetch of the same identity, signed anew or not, asks for the bytes
after the partial's with ``If-Range``; an origin that ignores ``If-Range`` (S3 does) still
answers with the object's ETag and size, so every answer is compared with the validators here,
and a changed object is fetched again from byte 0 instead of being spliced onto the old one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# An ETag shown in a message: RFC 9110's entity-tag, bounded. Anything else the origin sent
# (control characters, megabytes) is not echoed: the message says only that it changed.
_SHOWN_ETAG = re.compile(r'(?:W/)?"[\x21\x23-\x7e]{0,64}"')


def resume_headers(offset: int, validators: Mapping[str, Any], key: str) -> dict[str, str]:
    """``Range`` (and ``If-Range`` with a strong validator) to resume ``offset`` bytes kept for
    the source identity ``key``; {} when there is nothing of this source to resume."""
    if offset <= 0 or validators.get("url") != key:
        return {}
    out = {"Range": f"bytes={offset}-"}
    etag = validators.get("etag")
    if isinstance(etag, str) and etag and not etag.startswith("W/"):
        out["If-Range"] = etag  # a weak ETag may not be used in If-Range (RFC 9110 13.1.5)
    elif isinstance(validators.get("last_modified"), str) and not etag:
        out["If-Range"] = validators["last_modified"]
    return out


def object_change(
    old: Mapping[str, Any], etag: str | None, last_modified: str | None, total: int | None
) -> str | None:
    """Why the object an answer describes is not the one the partial's bytes came from, or None
    when nothing known differs (a validator either side did not give is not compared)."""
    what = []
    old_etag = old.get("etag")
    if isinstance(old_etag, str) and old_etag and etag and _opaque(old_etag) != _opaque(etag):
        what.append(f"ETag {_shown(old_etag)} -> {_shown(etag)}")
    old_total = old.get("total")
    if isinstance(old_total, int) and total is not None and old_total != total:
        what.append(f"size {old_total} -> {total} bytes")
    old_modified = old.get("last_modified")
    # Last-Modified only where no ETag pair was compared (it has a one-second granularity).
    no_etags = not (old_etag and etag)
    if not what and no_etags and old_modified and last_modified and old_modified != last_modified:
        what.append("Last-Modified changed")
    if not what:
        return None
    return f"object changed at origin ({', '.join(what)}); restarting from 0"


def _opaque(etag: str) -> str:
    """The ETag without its weakness mark: a change of the tag itself is a change of content."""
    return etag[2:] if etag.startswith("W/") else etag


def _shown(etag: str) -> str:
    return etag if _SHOWN_ETAG.fullmatch(etag) else "(not shown)"
