"""Names users give cache items, the node-label keys derived from them, and source identity.

A name becomes a path component under the cache directory and part of a label key, so it is
checked once here: no separators, no dot-dot, the label character set, at most 63 characters.

Label keys are ``gpu-agent.io/cache.<name>`` with the name as it is: every item name is already
a valid Kubernetes label name (the same characters, ``_`` included), so distinct names give
distinct keys. Only names longer than the 57 characters left after ``cache.`` are shortened, to
``<head>..<12 hex of sha256(name)>``: ``..`` never occurs in an item name, so a shortened key
cannot equal the key of another, literal name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from fnmatch import fnmatchcase
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from agent.errors import FieldViolation, InvalidSpec
from agent.kube_names import is_label_name

LABEL_PREFIX = "gpu-agent.io/cache."
# Kubernetes: the name part of a label key (after "gpu-agent.io/") is at most 63 characters.
_LABEL_NAME_MAX = 63
_LABEL_SHORT_MAX = _LABEL_NAME_MAX - len("cache.")
_LABEL_HASH_CHARS = 12
_HASH_CHARS = 8

# Query parameters that sign a URL rather than name its content. First Dragonfly's default
# X-Dragonfly-Filtered-Query-Params (prewarm.md §1.4): S3 v4, GCS, OSS, OBS, COS, containerd's ns.
DRAGONFLY_FILTERED_QUERY_PARAMS: tuple[str, ...] = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
    "X-Amz-Security-Token",
    "X-Amz-User-Agent",
    "X-Goog-Algorithm",
    "X-Goog-Credential",
    "X-Goog-Date",
    "X-Goog-Expires",
    "X-Goog-SignedHeaders",
    "X-Goog-Signature",
    "OSSAccessKeyId",
    "Expires",
    "Signature",
    "SecurityToken",
    "AccessKeyId",
    "X-Obs-Date",
    "X-Obs-Security-Token",
    "q-sign-algorithm",
    "q-ak",
    "q-sign-time",
    "q-key-time",
    "q-header-list",
    "q-url-param-list",
    "q-signature",
    "x-cos-security-token",
    "ns",
)
# Then the signatures Dragonfly's list lacks: S3 v2's key id, an Azure SAS (service, account and
# user delegation) and OSS v4. Named one by one, not as x-oss-*: x-oss-process changes the bytes.
EXTRA_SIGNATURE_QUERY_PARAMS: tuple[str, ...] = (
    "AWSAccessKeyId",
    "sv",
    "ss",
    "srt",
    "sp",
    "se",
    "st",
    "spr",
    "sig",
    "sip",
    "si",
    "sr",
    "skoid",
    "sktid",
    "skt",
    "ske",
    "sks",
    "skv",
    "x-oss-signature-version",
    "x-oss-credential",
    "x-oss-date",
    "x-oss-expires",
    "x-oss-signature",
    "x-oss-additional-headers",
    "x-oss-security-token",
)
DEFAULT_IGNORED_QUERY_PARAMS = DRAGONFLY_FILTERED_QUERY_PARAMS + EXTRA_SIGNATURE_QUERY_PARAMS
#: Bounds of prewarm.ignored_query_params: each entry a query key or a glob of one.
MAX_IGNORED_QUERY_PARAMS = 256
MAX_QUERY_PARAM_CHARS = 128
_QUERY_PARAM = re.compile(rf"[A-Za-z0-9!$'()*+:@._~?\[\]-]{{1,{MAX_QUERY_PARAM_CHARS}}}")


def check_ignored_query_params(values: Sequence[str]) -> bool:
    """At most 256 entries of 1-128 characters that can be a query key (or a glob of one):
    no ``&``, ``=``, ``#``, ``%``, space or control character."""
    return len(values) <= MAX_IGNORED_QUERY_PARAMS and all(
        isinstance(v, str) and _QUERY_PARAM.fullmatch(v) for v in values
    )


def check_name(name: str, field: str = "name") -> str:
    """Return ``name`` if it is a safe item name, else raise InvalidSpec naming the rule."""
    if ".." in name or "/" in name or "\\" in name or not is_label_name(name):
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
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip("._-")
    cleaned = re.sub(r"\.{2,}", ".", cleaned)
    if not cleaned:
        cleaned = "item"
    if len(cleaned) > 63:
        digest = hashlib.sha256(source.encode()).hexdigest()[:_HASH_CHARS]
        cleaned = f"{cleaned[: 63 - _HASH_CHARS - 1].rstrip('._-')}-{digest}"
    return check_name(cleaned)


def qualified_name(base: str, identity: str) -> str:
    """``base`` with 8 hex of the source's identity appended: the default name of a second
    source whose plain default name another source already holds (``model.safetensors`` of two
    repos). Deterministic, so asking for that source again finds the same item."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:_HASH_CHARS]
    head = base[: 63 - _HASH_CHARS - 1].rstrip("._-")
    return check_name(f"{head}-{digest}")


def label_key(name: str) -> str:
    """``gpu-agent.io/cache.<name>``; a name too long for a label keeps a prefix + hash."""
    if len(name) <= _LABEL_SHORT_MAX:
        return LABEL_PREFIX + name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_LABEL_HASH_CHARS]
    head = name[: _LABEL_SHORT_MAX - _LABEL_HASH_CHARS - 2].rstrip("._-")
    return f"{LABEL_PREFIX}{head}..{digest}"


def source_identity(url: str, ignored: Sequence[str] = DEFAULT_IGNORED_QUERY_PARAMS) -> str:
    """The URL without the query parameters that only sign it (names or ``*`` globs, matched
    case-sensitively as Dragonfly does), so a re-signed URL is the same item, and without its
    fragment, which never reaches the origin."""
    parts = urlsplit(url)
    if not parts.query:
        return urlunsplit(parts._replace(fragment="")) if parts.fragment else url
    kept = [
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if not any(fnmatchcase(k, pattern) for pattern in ignored)
    ]
    return urlunsplit(parts._replace(query=urlencode(kept), fragment=""))
