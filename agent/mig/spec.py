"""mig-parted v1 config files: parse, validate, select GPUs (reference/mig.md §3.1).

Files written for NVIDIA mig-parted or the GPU Operator's ``default-mig-parted-config`` load
unchanged. The rules and messages follow mig-parted's ``api/spec/v1``; we are stricter where it
silently ignores a bad value (an unparsable ``device-filter`` never matched there; here it is an
error) and we also accept GPU UUIDs in ``devices``. Counts (0-7) and GPU indices (0-255) are
bounded where they are read; mig-parted fails on them only when it applies (docs/mig.md).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent import safeyaml
from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.profiles import parse_profile
from agent.gpu.types import GpuInfo
from agent.mig import MAX_GPU_INDEX
from agent.safeyaml import brief, capped

VERSION = "v1"
ALL: Literal["all"] = "all"

#: A GPU holds at most 7 MIG devices (reference/mig.md §2); a larger count fits no GPU.
MAX_COUNT = 7
_MAX_UUID = 96
#: A config, label or profile name a caller gives (echoed in answers and logs): a DNS name's bound
MAX_NAME = 253


def name_problem(value: str, field: str) -> FieldViolation | None:
    """Why ``value`` cannot name a config, a label or a profile (None when it can)."""
    if len(value) > MAX_NAME or not value.isprintable():
        return FieldViolation(field, f"at most {MAX_NAME} printable characters")
    return None


#: How many config names an error lists, and how much of an unknown name it repeats.
MAX_NAMES_LISTED = 8
MAX_NAME_SHOWN = 100
_ENTRY_KEYS = ("device-filter", "devices", "mig-enabled", "mig-devices")


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """``0xDDDDVVVV[:0xSSSSVVVV]``: PCI device+vendor, optionally subsystem device+vendor."""

    device_id: int
    subsystem_id: int | None = None

    def matches(self, gpu: GpuInfo) -> bool:
        # mig-parted: without a subsystem part only device and vendor must match.
        if gpu.pci_device_id != self.device_id:
            return False
        return self.subsystem_id is None or gpu.pci_subsystem_id == self.subsystem_id

    def __str__(self) -> str:
        primary = f"0x{self.device_id:08X}"
        return primary if self.subsystem_id is None else f"{primary}:0x{self.subsystem_id:08X}"

    @classmethod
    def of(cls, gpu: GpuInfo) -> DeviceFilter:
        """The filter mig-parted's export writes for a GPU (device and vendor only)."""
        return cls(gpu.pci_device_id)


@dataclass(frozen=True, slots=True)
class MigConfigEntry:
    """One entry of a named config: which GPUs, and what they should look like."""

    path: str  # e.g. "mig-configs.all-balanced[0]", for messages
    devices: Literal["all"] | tuple[int | str, ...]  # indices, or GPU UUIDs (our extension)
    mig_enabled: bool
    #: normalised profile name -> count > 0, in file order (``3c.3g.20gb`` becomes ``3g.20gb``).
    mig_devices: tuple[tuple[str, int], ...]
    device_filter: tuple[DeviceFilter, ...] = ()

    def selects(self, gpu: GpuInfo) -> bool:
        if self.device_filter and not any(f.matches(gpu) for f in self.device_filter):
            return False
        return self.devices == ALL or gpu.index in self.devices or gpu.uuid in self.devices

    def may_select(self, gpu: GpuInfo) -> bool:
        """Whether this entry selects a lost GPU, or might: one lost before the agent started
        is only an index, so a UUID or a device filter cannot be matched against it."""
        if gpu.uuid:
            return self.selects(gpu)
        if self.devices == ALL:
            return True
        return bool(self.device_filter) or any(
            isinstance(d, str) or d == gpu.index for d in self.devices
        )


@dataclass(frozen=True, slots=True)
class MigSpec:
    """A parsed config file: config name -> entries, in file order."""

    configs: tuple[tuple[str, tuple[MigConfigEntry, ...]], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.configs)

    def select(
        self, name: str | None, flag: str = "selected-config"
    ) -> tuple[str, tuple[MigConfigEntry, ...]]:
        """The named config; with one config in the file the name may be omitted (mig-parted).
        ``flag``: the caller's option for the name, which a refusal names."""
        if not self.configs:  # an empty file, or one of its version alone, loads as mig-parted's
            shown = capped(name or "(none given)", MAX_NAME_SHOWN)
            raise InvalidSpec(
                f"selected mig-config not present: {shown} (the file has no mig-configs)",
                [FieldViolation(flag, "the config file has no mig-configs to select from")],
            )
        if name is None or name == "":
            if len(self.configs) != 1:
                raise InvalidSpec(
                    f"missing required flag '{flag}' when more than one config available "
                    f"(configs: {self._listed()})",
                    [FieldViolation(flag, f"one of: {self._listed()}")],
                )
            return self.configs[0]
        for config_name, entries in self.configs:
            if config_name == name:
                return config_name, entries
        near = difflib.get_close_matches(name[:MAX_NAME_SHOWN], self.names, n=3)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        raise InvalidSpec(
            f"selected mig-config not present: {capped(name, MAX_NAME_SHOWN)} "
            f"(configs: {self._listed()}){hint}",
            [FieldViolation(flag, f"one of: {self._listed()}")],
        )

    def _listed(self) -> str:
        """The config names for a message: the first few and how many more (a generated file
        holds over a hundred, which buried the error)."""
        return safeyaml.some(self.names, MAX_NAMES_LISTED)


@dataclass(frozen=True, slots=True)
class GpuSelection:
    """The entry that decides one GPU's layout."""

    gpu: GpuInfo
    entry: MigConfigEntry


def select_gpus(
    entries: Sequence[MigConfigEntry], gpus: Iterable[GpuInfo]
) -> tuple[GpuSelection, ...]:
    """Which entry applies to which GPU. Entries apply in order, so the last match wins.

    mig-parted applies every matching entry in turn, which leaves the last one in place; planning
    straight for it gives the same end state without the intermediate reconfigurations.
    """
    out: list[GpuSelection] = []
    for gpu in gpus:
        matching = [e for e in entries if e.selects(gpu)]
        if matching:
            out.append(GpuSelection(gpu, matching[-1]))
    return tuple(out)


# -- loading ---------------------------------------------------------------------------------------


def load_spec(source: str | Path, text: str | None = None) -> MigSpec:
    """Read and parse a config file; ``text`` overrides reading (``-`` = stdin is the CLI's job)."""
    if text is None:
        text = safeyaml.read_text(Path(source), "config-file", what="MIG config")
    return parse_spec(text, str(source))


def parse_spec(text: str, source: str = "<config>") -> MigSpec:
    """Parse YAML (or JSON) text as a mig-parted v1 config; InvalidSpec lists every problem."""
    doc = safeyaml.load(text, source)
    violations: list[FieldViolation] = []
    spec = _spec(doc, violations)
    if violations:
        raise InvalidSpec.of(source, violations)
    assert spec is not None
    return spec


def _spec(doc: Any, bad: list[FieldViolation]) -> MigSpec | None:
    if doc is None:  # an empty file: mig-parted reads it as no configs, refused only at selection
        return MigSpec(())
    if not isinstance(doc, dict):
        bad.append(FieldViolation("", "expected a mapping with 'version' and 'mig-configs'"))
        return None
    if "version" not in doc:
        bad.append(FieldViolation("version", "unable to parse with missing 'version' field"))
    elif doc["version"] != VERSION:
        bad.append(
            FieldViolation(
                "version",
                f"unknown version: {capped(str(doc['version']), 60)} (allowed: {VERSION})",
            )
        )
    for key in doc:
        if key not in ("version", "mig-configs"):
            bad.append(
                FieldViolation(str(key), f"unexpected field: {key} (allowed: version, mig-configs)")
            )
    if "mig-configs" not in doc:  # mig-parted: a file of its version alone has no configs
        return MigSpec(())
    configs = doc["mig-configs"]
    if not isinstance(configs, dict) or not configs:
        bad.append(FieldViolation("mig-configs", "at least one entry in 'mig-configs' is required"))
        return None
    parsed: list[tuple[str, tuple[MigConfigEntry, ...]]] = []
    for name, entries in configs.items():
        path = f"mig-configs.{name}"
        if not isinstance(name, str):
            bad.append(
                FieldViolation(path, "config names must be strings (quote names like on, off, no)")
            )
            continue
        if not isinstance(entries, list) or not entries:
            bad.append(FieldViolation(path, f"at least one entry in '{name}' is required"))
            continue
        out = [_entry(e, f"{path}[{i}]", bad) for i, e in enumerate(entries)]
        parsed.append((name, tuple(e for e in out if e is not None)))
    return MigSpec(tuple(parsed))


def _entry(raw: Any, path: str, bad: list[FieldViolation]) -> MigConfigEntry | None:
    if not isinstance(raw, dict):
        bad.append(FieldViolation(path, "expected a mapping with 'devices' and 'mig-enabled'"))
        return None
    start = len(bad)
    for key in raw:
        if key not in _ENTRY_KEYS:
            bad.append(
                FieldViolation(
                    f"{path}.{key}", f"unexpected field: {key} (allowed: {', '.join(_ENTRY_KEYS)})"
                )
            )
    for key in ("devices", "mig-enabled"):
        if key not in raw:
            bad.append(FieldViolation(f"{path}.{key}", f"missing required field: {key}"))
    devices = _devices(raw["devices"], f"{path}.devices", bad) if "devices" in raw else ALL
    enabled = raw.get("mig-enabled", False)
    if not isinstance(enabled, bool):
        bad.append(
            FieldViolation(f"{path}.mig-enabled", f"must be true or false, not {brief(enabled)}")
        )
    mig_devices = _mig_devices(raw.get("mig-devices"), f"{path}.mig-devices", bad)
    # mig-parted reads a null mig-devices as none at all.
    if enabled is True and raw.get("mig-devices") is None:
        bad.append(
            FieldViolation(
                f"{path}.mig-devices",
                "missing required field 'mig-devices' when 'mig-enabled' is true",
            )
        )
    if enabled is False and mig_devices:
        bad.append(
            FieldViolation(
                f"{path}.mig-devices", "MIG devices included when 'mig-enabled' is false"
            )
        )
    filters = _filters(raw.get("device-filter"), f"{path}.device-filter", bad)
    if len(bad) > start:
        return None
    return MigConfigEntry(path, devices, bool(enabled), mig_devices, filters)


def _devices(
    raw: Any, path: str, bad: list[FieldViolation]
) -> Literal["all"] | tuple[int | str, ...]:
    if isinstance(raw, str):
        if raw != ALL:
            bad.append(
                FieldViolation(
                    path,
                    f"invalid string input for 'devices': {capped(raw, 60)} "
                    "(allowed: all, or a list)",
                )
            )
        return ALL
    if not isinstance(raw, list):
        bad.append(FieldViolation(path, "must be 'all' or a list of GPU indices or GPU UUIDs"))
        return ALL
    out: list[int | str] = []
    for i, d in enumerate(raw):
        if (isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_GPU_INDEX) or (
            isinstance(d, str) and d.startswith("GPU-") and len(d) <= _MAX_UUID
        ):
            out.append(d)
        else:
            bad.append(
                FieldViolation(
                    f"{path}[{i}]",
                    f"{brief(d)} is not a GPU index (0-{MAX_GPU_INDEX}) or a GPU UUID (GPU-…)",
                )
            )
    return tuple(out)


def _mig_devices(raw: Any, path: str, bad: list[FieldViolation]) -> tuple[tuple[str, int], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        bad.append(FieldViolation(path, "must be a mapping of MIG profile to count"))
        return ()
    counts: dict[str, int] = {}
    errors = len(bad)
    for key, count in raw.items():
        field = f"{path}.{key}"
        try:
            # Well-formed is enough, as for mig-parted: a profile no GPU has fails the config
            # that uses it when it is planned, and the file's other configs stay usable.
            name = str(parse_profile(str(key), any_size=True))
        except InvalidSpec as exc:
            bad.append(
                FieldViolation(field, f"error validating values in 'mig-devices' field: {exc}")
            )
            continue
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
            bad.append(
                FieldViolation(
                    field,
                    f"invalid count for '{key}': {brief(count)} (must be an integer 0-{MAX_COUNT}: "
                    "a GPU holds at most 7 MIG devices)",
                )
            )
            continue
        if count:
            counts[name] = counts.get(name, 0) + count
    if raw and not counts and len(bad) == errors:
        bad.append(FieldViolation(path, "all counts for all MigProfiles are 0"))
    return tuple(counts.items())


def _filters(raw: Any, path: str, bad: list[FieldViolation]) -> tuple[DeviceFilter, ...]:
    if raw is None or raw == "":
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        bad.append(
            FieldViolation(
                path, "must be a string or a list of strings like 0x20B010DE[:0x134F10DE]"
            )
        )
        return ()
    out: list[DeviceFilter] = []
    for i, text in enumerate(items):
        where = path if isinstance(raw, str) else f"{path}[{i}]"
        try:
            out.append(parse_filter(text))
        except ValueError as exc:
            bad.append(FieldViolation(where, str(exc)))
    return tuple(out)


def parse_filter(text: str) -> DeviceFilter:
    """``0xDDDDVVVV[:0xSSSSVVVV]`` as mig-parted's ``types.NewDeviceIDFromString`` reads it:
    each part an unsigned 32-bit number in Go's notation (``strconv.ParseUint(s, 0, 32)``).
    ValueError, naming the part and the format, when mig-parted could not read it (it would
    then silently match no GPU)."""
    parts = text.split(":")
    if len(parts) > 2:
        raise ValueError(
            f"invalid DeviceID format {brief(text)}: expected '0xDDDDVVVV' or "
            "'0xDDDDVVVV:0xSSSSVVVV'"
        )
    values = []
    for name, part in zip(("device id", "subsystem id"), parts, strict=False):
        try:
            values.append(parse_go_uint(part, 32))
        except ValueError as exc:
            raise ValueError(
                f"invalid DeviceID format {brief(text)}: the {name} {brief(part)} is {exc}; "
                "expected '0xDDDDVVVV' or '0xDDDDVVVV:0xSSSSVVVV' (PCI device and vendor)"
            ) from None
    return DeviceFilter(values[0], values[1] if len(values) == 2 else None)


def parse_go_uint(text: str, bits: int) -> int:
    """``strconv.ParseUint(text, 0, bits)``: decimal, ``0x`` hex, ``0o`` or leading-``0`` octal,
    ``0b`` binary, ``_`` between digits; no sign, no spaces; below ``2**bits``."""
    s, base = text, 10
    if s[:1] == "0" and len(s) >= 3 and s[1] in "bBoOxX":
        base, s = {"b": 2, "o": 8, "x": 16}[s[1].lower()], s[2:]
    elif s[:1] == "0":
        base, s = 8, s[1:]
    if not text:
        raise ValueError("empty")
    value, underscores = 0, False
    for c in s:
        if c == "_":
            underscores = True
            continue
        digit = int(c, 36) if c.isascii() and c.isalnum() else base
        if digit >= base:
            raise ValueError("not a number")
        value = value * base + digit
    if underscores and not _underscores_ok(text):
        raise ValueError("not a number")
    if value >= 1 << bits:
        raise ValueError(f"out of range: more than {bits} bits")
    return value


def _underscores_ok(text: str) -> bool:
    # Go's strconv underscoreOK: '_' only between digits, or after a base prefix.
    saw, i, hexa = "^", 0, False
    if len(text) >= 2 and text[0] == "0" and text[1] in "bBoOxX":
        saw, i, hexa = "0", 2, text[1] in "xX"
    for c in text[i:]:
        if "0" <= c <= "9" or (hexa and c.lower() in "abcdef"):
            saw = "0"
        elif c == "_":
            if saw != "0":
                return False
            saw = "_"
        else:
            if saw == "_":
                return False
            saw = "!"
    return saw != "_"


# -- export ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExportedGpu:
    """One GPU as ``export`` sees it: identity, mode and counts per profile name."""

    index: int
    device_filter: str
    mig_enabled: bool
    counts: Mapping[str, int]


def export_document(gpus: Sequence[ExportedGpu], label: str) -> dict[str, Any]:
    """The current state as a v1 config, merged the way mig-parted's ``export`` merges it.

    GPUs with equal mode and counts share an entry; a filter covering every GPU of its type becomes
    ``devices: all``, and the filter is dropped when the node has one GPU type or one entry.
    """
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[ExportedGpu]] = {}
    for g in gpus:
        groups.setdefault((g.mig_enabled, tuple(sorted(g.counts.items()))), []).append(g)
    by_filter: dict[str, set[int]] = {}
    for g in gpus:
        by_filter.setdefault(g.device_filter, set()).add(g.index)
    entries: list[dict[str, Any]] = []
    for (enabled, counts), members in groups.items():
        filters = sorted({g.device_filter for g in members})
        indices = sorted(g.index for g in members)
        entry: dict[str, Any] = {}
        if len(by_filter) > 1 and len(groups) > 1:
            entry["device-filter"] = filters[0] if len(filters) == 1 else filters
        covered = sorted(set().union(*(by_filter[f] for f in filters)))
        entry["devices"] = ALL if covered == indices else indices
        entry["mig-enabled"] = enabled
        entry["mig-devices"] = dict(counts)
        entries.append(entry)
    return {"version": VERSION, "mig-configs": {label: entries}}
