"""Request headers read from files (mounted Kubernetes secrets), checked and never logged."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.errors import FieldViolation, InvalidSpec

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def check_header_name(name: str) -> str:
    if not _TOKEN.fullmatch(name):
        raise InvalidSpec(
            f"header name {name!r} is not an HTTP token",
            [FieldViolation("header_files", "names are letters, digits and !#$%&'*+.^_`|~-")],
        )
    return name


def read_header_files(files: Mapping[str, Path], allowed_dirs: Sequence[Path]) -> dict[str, str]:
    """Header name → value read from its file; read at each fetch so rotated secrets apply.

    Only files under ``allowed_dirs`` (after resolving links) are read: otherwise any caller of
    the API could ship any file of the node to an origin as a header. Errors name the header and
    the file, never the value.
    """
    headers = {}
    roots = [d.resolve() for d in allowed_dirs]
    for name, path in files.items():
        check_header_name(name)
        if not any(path.resolve().is_relative_to(root) for root in roots):
            allowed = ", ".join(str(d) for d in allowed_dirs) or "none configured"
            raise InvalidSpec(
                f"header {name}: {path} is outside the header directories ({allowed})",
                [FieldViolation("header_files", f"a file under: {allowed}")],
            )
        try:
            value = path.read_text().strip("\r\n")
        except OSError as exc:
            raise InvalidSpec(
                f"cannot read header {name} from {path}: {exc.strerror or exc}",
                [FieldViolation("header_files", "a readable file holding the header value")],
            ) from None
        if "\n" in value or "\r" in value or "\0" in value:
            raise InvalidSpec(
                f"header {name} from {path} spans lines",
                [FieldViolation("header_files", "one line, no NUL")],
            )
        headers[name] = value
    return headers
