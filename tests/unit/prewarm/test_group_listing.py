"""A hub listing's include globs pick the files fnmatch's rules pick, all globs matched as one
pattern (a path is matched once, not once per glob)."""

from __future__ import annotations

from fnmatch import fnmatchcase

from agent.prewarm.group import parse_listing

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
