"""Request headers read from files (mounted Kubernetes secrets), bound to their origins.

The operator names each header directory with the one origin (``scheme://host:port``) its files
were written for (``prewarm.header_dirs``: ``ORIGIN=DIRECTORY``). A request may use a header file
only when it lies in a directory bound to the origin the request goes to, so a caller cannot
send a node file, or another origin's token, to a host of its choosing. Values are checked
and never logged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from agent.errors import FieldViolation, InvalidSpec, PermissionDenied
from agent.prewarm.policy import origin_of

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A header value as http.client sends it: visible ASCII, spaces and tabs.
_VALUE = re.compile(r"[\t\x20-\x7e]*")


@dataclass(frozen=True, slots=True)
class HeaderDir:
    """A directory of header files and the origin (``scheme://host:port``) they may go to."""

    origin: str
    path: Path


def parse_header_dir(text: str) -> HeaderDir:
    """``ORIGIN=DIRECTORY`` as `prewarm.header_dirs` lists it; ValueError when malformed."""
    origin, sep, directory = text.partition("=")
    parts = urlsplit(origin)
    if (
        not sep
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or not Path(directory).is_absolute()
    ):
        raise ValueError(text)
    _ = parts.port  # raises ValueError for a bad port
    return HeaderDir(origin_of(origin), Path(directory))


#: Header files a request may name, and the length of their names: a few tokens are sent, and
#: an origin refuses a header line past a few KiB anyway.
MAX_HEADER_FILES = 16
MAX_HEADER_NAME = 128


def check_header_files(files: Mapping[str, object]) -> None:
    """At most `MAX_HEADER_FILES`, each named by a short HTTP token (`check_header_name`)."""
    if len(files) > MAX_HEADER_FILES:
        raise InvalidSpec(
            f"{len(files)} header files; at most {MAX_HEADER_FILES} are taken",
            [FieldViolation("header_files", f"at most {MAX_HEADER_FILES} header files")],
        )
    for name in files:
        check_header_name(name)


def check_header_name(name: str) -> str:
    if len(name) > MAX_HEADER_NAME:
        raise InvalidSpec(
            f"a header name of {len(name)} characters; at most {MAX_HEADER_NAME} are taken",
            [FieldViolation("header_files", f"names of at most {MAX_HEADER_NAME} characters")],
        )
    if not _TOKEN.fullmatch(name):
        raise InvalidSpec(
            f"header name {name!r} is not an HTTP token",
            [FieldViolation("header_files", "names are letters, digits and !#$%&'*+.^_`|~-")],
        )
    return name


def read_header_files(
    files: Mapping[str, Path], dirs: Sequence[HeaderDir], url: str
) -> dict[str, str]:
    """Header name → value read from its file, for a request to ``url``; read at each fetch so
    rotated secrets apply.

    Only files under a directory of ``dirs`` (after resolving links) bound to ``url``'s origin
    are read. Errors name the header and the file, never the value.
    """
    headers = {}
    origin = origin_of(url)
    for name, path in files.items():
        check_header_name(name)
        real = path.resolve()
        holding = [d for d in dirs if real.is_relative_to(d.path.resolve())]
        if not holding:
            allowed = ", ".join(sorted({str(d.path) for d in dirs})) or "none configured"
            raise InvalidSpec(
                f"header {name}: {path} is outside the header directories ({allowed})",
                [FieldViolation("header_files", f"a file under: {allowed}")],
            )
        if not any(d.origin == origin for d in holding):
            bound = ", ".join(sorted({d.origin for d in holding}))
            raise PermissionDenied(
                f"header {name}: {path} may be sent to {bound} only, not to {origin} "
                "(header_files; the operator binds header directories to origins in "
                "prewarm.header_dirs)"
            )
        try:
            value = path.read_text().strip("\r\n")
        except OSError as exc:
            raise InvalidSpec(
                f"cannot read header {name} from {path}: {exc.strerror or exc}",
                [FieldViolation("header_files", "a readable file holding the header value")],
            ) from None
        if not _VALUE.fullmatch(value):
            raise InvalidSpec(
                f"header {name} from {path} spans lines or holds characters other than "
                "printable ASCII",
                [FieldViolation("header_files", "one line of printable ASCII")],
            )
        headers[name] = value
    return headers


#: An item's option that names a header file: ``header:<name>`` -> the file's path.
HEADER_OPTION = "header:"


def header_options(header_files: Mapping[str, Path]) -> dict[str, str]:
    """A request's header files as the item's options (where each header's value is read)."""
    return {f"{HEADER_OPTION}{k}": str(v) for k, v in header_files.items()}


def header_files_of(options: Mapping[str, str]) -> dict[str, Path]:
    """The header files an item's options name."""
    return {
        k[len(HEADER_OPTION) :]: Path(v) for k, v in options.items() if k.startswith(HEADER_OPTION)
    }
