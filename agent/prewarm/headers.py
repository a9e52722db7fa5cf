"""Request headers read from files (mounted Kubernetes secrets), checked and never logged."""

from __future__ import annotations

import re
from collections.abc import Mapping
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


def read_header_files(files: Mapping[str, Path]) -> dict[str, str]:
    """Header name → value read from its file; read at each fetch so rotated secrets apply.

    Errors name the header and the file, never the value.
    """
    headers = {}
    for name, path in files.items():
        check_header_name(name)
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
