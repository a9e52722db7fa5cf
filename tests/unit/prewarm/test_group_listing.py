"""A hub listing's include globs pick the files fnmatch's rules pick, all globs matched as one
pattern (a path is matched once, not once per glob)."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from agent.errors import InvalidSpec
from agent.prewarm.group import check_include, parse_listing

PATHS = [
    "config.json",
    "original/params.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "README.md",
    "Config.JSON",
    "a?b",
    "x[1].bin",
]
GLOBS = ("*.json", "model-0000[1]*", "a?b", "x[[]1].bin", "README.m?")


def test_include_globs_select_what_fnmatch_selects() -> None:
    data = {"sha": "0" * 40, "siblings": [{"rfilename": p, "size": 1} for p in PATHS]}
    listing = parse_listing(data, "http://hub", "o/r", GLOBS)
    expected = sorted(p for p in PATHS if any(fnmatchcase(p, g) for g in GLOBS))
    assert [m.path for m in listing.members] == expected
    assert "Config.JSON" not in expected and "original/params.json" in expected


def test_a_glob_of_many_stars_is_refused_before_any_listing_is_read() -> None:
    """64 globs of 127 '*' each matched a hostile 16 MiB listing for seconds: a glob takes
    at most 8 '*' (a real one has one or two), refused naming the field."""
    check_include(["*/*.safetensors", "a*b*c*d*e*f*g*h"])
    with pytest.raises(InvalidSpec) as refused:
        check_include(["*a" * 9])
    assert [v.field for v in refused.value.violations] == ["include"]
    assert "8 '*' each" in str(refused.value)
