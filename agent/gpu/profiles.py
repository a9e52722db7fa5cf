"""MIG profile names: computed from NVML's numbers, and parsed from config strings.

Pure functions (reference/mig.md §1.7). Names are derived per device because the same profile is
called differently on boards with slightly different memory (7g.79gb vs 7g.80gb).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.errors import InvalidSpec

_MIB = 1024 * 1024
_GIB = 1024 * _MIB


def memory_gb(memory_mb: int, total_memory_bytes: int) -> int:
    """The ``<GB>`` part of a profile name for a profile of ``memory_mb`` MiB on this device.

    Fraction of total memory rounded up to 1/8, times total GiB rounded up, rounded half up
    (Go's math.Round, as the driver does). Integer arithmetic, so .5 really goes up: Python's
    round() would send it to even, and floats would wobble at the boundaries.
    """
    eighths = -(-memory_mb * _MIB * 8 // total_memory_bytes)  # ceil(fraction * 8)
    total_gib = -(-total_memory_bytes // _GIB)
    return (eighths * total_gib + 4) // 8  # floor(eighths * total_gib / 8 + 1/2)


def profile_name(
    gi_slices: int,
    memory_mb: int,
    total_memory_bytes: int,
    attrs: str = "",
    ci_slices: int | None = None,
) -> str:
    """``<G>g.<GB>gb``, or ``<C>c.<G>g.<GB>gb`` for a CI narrower than its GI, plus attributes.

    >>> profile_name(3, 71168, 143771 * 1024 * 1024)
    '3g.71gb'
    """
    base = f"{gi_slices}g.{memory_gb(memory_mb, total_memory_bytes)}gb{attrs}"
    if ci_slices is not None and ci_slices < gi_slices:
        return f"{ci_slices}c.{base}"
    return base


#: go-nvlib reads each size with strconv.Atoi (64 bits); 18 digits keep int() cheap and in range
_PROFILE_RE = re.compile(
    r"^(?:(?P<c>\d{1,18})c\.)?(?P<g>\d{1,18})g\.(?P<gb>\d{1,18})gb(?P<attrs>.*)\Z",
    re.ASCII,  # \d is any script's digit without it, and int() reads them all
)
_ATTR_RE = re.compile(r"^[A-Za-z][A-Za-z0-9.]*(?<!\.)\Z")


@dataclass(frozen=True, slots=True, order=True)
class ProfileName:
    """A parsed MIG profile string such as ``1c.3g.20gb`` or ``1g.10gb+me``."""

    gi_slices: int
    memory_gb: int
    ci_slices: int | None
    attrs: tuple[str, ...]
    negative: bool

    @property
    def gi_name(self) -> str:
        """The GPU-instance profile this names (without the ``<C>c.`` prefix)."""
        return f"{self.gi_slices}g.{self.memory_gb}gb{self.attr_suffix}"

    @property
    def attr_suffix(self) -> str:
        if not self.attrs:
            return ""
        return ("-" if self.negative else "+") + ",".join(self.attrs)

    def __str__(self) -> str:
        prefix = f"{self.ci_slices}c." if self.ci_slices not in (None, self.gi_slices) else ""
        return prefix + self.gi_name


def parse_profile(text: str, *, any_size: bool = False) -> ProfileName:
    """Parse a profile string with mig-parted's rules (reference/mig.md §1.7).

    ``any_size``: every name go-nvlib's parser takes, as mig-parted's config files may hold
    them: sizes of 0, leading zeros, more compute than GPU slices (``0g.0gb``, ``2c.1g.5gb``).
    No GPU has such a profile; planning a config that uses one refuses it, naming it. Without
    it, only names a GPU can have: sizes from 1, written without leading zeros, C at most G.
    """
    m = _PROFILE_RE.match(text)
    sizes = [m[part] for part in ("c", "g", "gb") if m[part]] if m else []
    if not m or (not any_size and any(size.startswith("0") for size in sizes)):
        raise InvalidSpec(f"invalid MIG profile {text!r}: expected [<C>c.]<G>g.<GB>gb[+attr|-attr]")
    g = int(m["g"])
    c = int(m["c"]) if m["c"] else None
    if c is not None and c > g and not any_size:
        raise InvalidSpec(f"invalid MIG profile {text!r}: compute slices {c} exceed GPU slices {g}")
    attrs_text = m["attrs"]
    negative = False
    attrs: tuple[str, ...] = ()
    if attrs_text:
        sign, body = attrs_text[0], attrs_text[1:]
        if sign not in "+-" or not body:
            raise InvalidSpec(f"invalid MIG profile {text!r}: attributes start with '+' or '-'")
        if "+" in body or "-" in body:
            raise InvalidSpec(
                f"invalid MIG profile {text!r}: '+' and '-' attributes may not be mixed"
            )
        parts = tuple(body.split(","))
        for part in parts:
            if not _ATTR_RE.match(part):
                raise InvalidSpec(
                    f"invalid MIG profile {text!r}: attribute {part!r} must be alphanumeric "
                    "or '.', "
                    "not start with a digit, and not begin or end with '.'"
                )
        if len(set(parts)) != len(parts):
            raise InvalidSpec(f"invalid MIG profile {text!r}: repeated attribute")
        negative = sign == "-"
        attrs = parts
    return ProfileName(g, int(m["gb"]), c, attrs, negative)
