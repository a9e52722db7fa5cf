"""The one redaction of URLs: what of a URL may leave the agent (replies, events, logs, labels).

A signed object-store URL carries its credential in the query (S3 ``X-Amz-Signature``,
``X-Amz-Credential``, ``X-Amz-Security-Token``; GCS ``X-Goog-Signature``; CloudFront and GCS
``Signature`` with ``Expires``; Azure SAS ``sig`` with ``se``/``sp``/``sv``; ``token``,
``access_token``), and any URL may carry a user and password before its host. A list of
parameter names would miss the next provider's, so none of the query is kept: it becomes ``?…``.
The user info goes, and so does a fragment (``#…``): OAuth's implicit flow puts tokens there.
Scheme, host, port and path stay, which is what a reader needs to tell items apart.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

__all__ = ["redact_text", "redact_url"]

# A URL inside free text (an error message): a scheme, "://", then up to the next space or quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


def redact_url(url: str) -> str:
    """``url`` without user info, query values or fragment, fit for any reader."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # not a URL we can take apart: nothing of it is shown
        return "<unparsable URL>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    query = "?…" if parts.query else ""
    fragment = "#…" if parts.fragment else ""
    return f"{parts.scheme}://{netloc}{parts.path}{query}{fragment}"


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (`redact_url`); other words are left as they are."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
