"""Profile names: computed per device, parsed with mig-parted's rules (reference/mig.md §1.7)."""

from __future__ import annotations

import pytest

from agent.errors import InvalidSpec
from agent.gpu.profiles import memory_gb, parse_profile, profile_name

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("memory_mb", "total_mib", "expected"),
    [
        (71168, 143771, 71),  # H200 3g: 70.5 rounds half up, Python's round() would say 70
        (4864, 40960, 5),  # A100-40GB 1g
        (80384, 81920, 80),  # A100-80GB 7g
        (80384, 81000, 80),
        (47488, 95830, 47),  # H100 NVL 3g
    ],
)
def test_memory_gb_rounds_like_the_driver(memory_mb: int, total_mib: int, expected: int) -> None:
    assert memory_gb(memory_mb, total_mib * MIB) == expected


def test_board_with_less_memory_names_the_same_profile_differently() -> None:
    """7g.79gb vs 7g.80gb on A100-80GB boards (gpu-operator #351): names are per device."""
    assert profile_name(7, 80384, 81920 * MIB) == "7g.80gb"
    assert profile_name(7, 78000, 80000 * MIB) == "7g.79gb"  # total rounds up to 79 GiB


def test_ci_prefix_only_when_narrower_than_the_gi() -> None:
    assert profile_name(3, 19968, 40960 * MIB, ci_slices=1) == "1c.3g.20gb"
    assert profile_name(3, 19968, 40960 * MIB, ci_slices=3) == "3g.20gb"
    assert profile_name(1, 4864, 40960 * MIB, attrs="+me") == "1g.5gb+me"


@pytest.mark.parametrize(
    ("text", "gi_name", "ci"),
    [
        ("1g.5gb", "1g.5gb", None),
        ("1c.3g.20gb", "3g.20gb", 1),
        ("1g.10gb+me", "1g.10gb+me", None),
        ("1g.24gb+me.all", "1g.24gb+me.all", None),
        ("2g.48gb-me", "2g.48gb-me", None),
        ("1g.24gb+gfx,me", "1g.24gb+gfx,me", None),
    ],
)
def test_parse_valid_profiles(text: str, gi_name: str, ci: int | None) -> None:
    parsed = parse_profile(text)
    assert parsed.gi_name == gi_name
    assert parsed.ci_slices == ci
    assert str(parsed) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1g",
        "g.5gb",
        "0g.5gb",
        "1g.5",
        "4c.3g.20gb",
        "1g.5gb+",
        "1g.5gb+me-gfx",
        "1g.5gb+1me",
        "1g.5gb+.me",
        "1g.5gb+me.",
        "1g.5gb+me,me",
        "1g.5gb me",
    ],
)
def test_parse_rejects_bad_profiles_with_a_reason(text: str) -> None:
    with pytest.raises(InvalidSpec, match="invalid MIG profile"):
        parse_profile(text)
