"""Tab-separated tables shipped inside a package (XID catalogs): one reader, one format.

A line is a row of tab-separated cells; blank lines and lines starting with ``#`` are comments.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["packaged_rows"]


def packaged_rows(package: str, name: str, *, cells: int) -> list[list[str]]:
    """The rows of ``package``'s file ``name``, each split into at most ``cells`` cells (the
    last keeps any further tabs)."""
    text = resources.files(package).joinpath(name).read_text(encoding="utf-8")
    return [
        line.split("\t", cells - 1)
        for line in text.splitlines()
        if line and not line.startswith("#")
    ]
