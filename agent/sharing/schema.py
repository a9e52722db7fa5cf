"""The NVIDIA k8s-device-plugin config file (``api/config/v1``), as far as sharing needs it.

The file is shared with the plugin and GFD (reference/mig.md §5.1), so parsing is strict only on
what the agent owns (``version``, ``flags.migStrategy``, ``sharing``) and keeps everything else the
plugin understands (other ``flags`` keys, ``imex``, ``resources``) verbatim, to write it back as is.
Parsing checks shape; the sharing rules live in ``validate.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, cast

import yaml

from agent import safeyaml
from agent.errors import FieldViolation, InvalidSpec
from agent.safeyaml import brief

VERSION = "v1"
RESOURCE_PREFIX = "nvidia.com/"
MIG_STRATEGIES = ("none", "single", "mixed")

MigStrategy = Literal["none", "single", "mixed"]
SharingStrategy = Literal["none", "time-slicing", "mps"]
#: ``all`` | a device count | a list of GPU indices, ``"gpu:mig"`` indices or UUIDs.
Devices = str | int | tuple[int | str, ...]

#: Top-level sections of the plugin's schema the agent does not manage; kept verbatim.
_UNMANAGED_SECTIONS = ("imex", "resources")
_TOP_KEYS = ("version", "flags", "sharing", *_UNMANAGED_SECTIONS)
_SHARING_KEYS = {"timeSlicing": "time_slicing", "mps": "mps"}
#: ``sharing.timeSlicing`` is a struct in the plugin, so null still runs its reader, which refuses
#: it ("no resources specified"); ``sharing.mps`` is a pointer, so null leaves it unset.
_NULL_IS_EMPTY = ("timeSlicing",)
_SECTION_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
_RESOURCE_KEYS = ("name", "replicas", "rename", "devices")
_HEADER = "# Written by gpu-agent: change sharing with `gpu-agent share set`, not by hand.\n"


def qualify(name: str) -> str:
    """Add the ``nvidia.com/`` prefix when missing, as the plugin does on load."""
    return name if name.startswith(RESOURCE_PREFIX) else RESOURCE_PREFIX + name


def _frozen(value: Mapping[str, object]) -> Mapping[str, object]:
    # Deep copy so a caller's dict (or a parsed document) cannot change a frozen config later.
    return MappingProxyType(copy.deepcopy(dict(value)))


@dataclass(frozen=True, slots=True)
class ReplicatedResource:
    """One ``resources[]`` entry: a resource name (fully qualified) shared ``replicas`` ways."""

    name: str
    replicas: int
    #: Parsed so they can be refused by name; the plugin ignores both (reference/mig.md §5.1).
    rename: str | None = None
    devices: Devices | None = None


@dataclass(frozen=True, slots=True)
class ReplicatedResources:
    """``sharing.timeSlicing`` or ``sharing.mps``."""

    resources: tuple[ReplicatedResource, ...] = ()
    rename_by_default: bool = False
    #: None when the file leaves it out: the plugin then uses False for time-slicing, True for MPS.
    fail_requests_greater_than_one: bool | None = None


@dataclass(frozen=True, slots=True)
class Sharing:
    time_slicing: ReplicatedResources | None = None
    mps: ReplicatedResources | None = None

    @property
    def strategy(self) -> SharingStrategy:
        """What the plugin will do: MPS wins over time-slicing, and only replicas > 1 count."""
        if self.mps is not None and any(r.replicas > 1 for r in self.mps.resources):
            return "mps"
        if self.time_slicing is not None and any(
            r.replicas > 1 for r in self.time_slicing.resources
        ):
            return "time-slicing"
        return "none"

    @property
    def active(self) -> ReplicatedResources | None:
        """The section the plugin applies, None when nothing is shared."""
        return {"mps": self.mps, "time-slicing": self.time_slicing, "none": None}[self.strategy]

    @property
    def fail_requests_greater_than_one(self) -> bool:
        """The effective value for the active section, with the plugin's per-strategy default."""
        active = self.active
        if active is None or active.fail_requests_greater_than_one is None:
            return self.strategy == "mps"
        return active.fail_requests_greater_than_one


@dataclass(frozen=True, slots=True)
class Flags:
    #: None when the file leaves it out (the plugin then uses ``none``).
    mig_strategy: MigStrategy | None = None
    #: Every other ``flags`` key, verbatim (failOnInitError, plugin, gfd, ...).
    other: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """A whole device-plugin config file."""

    flags: Flags = field(default_factory=Flags)
    sharing: Sharing = field(default_factory=Sharing)
    #: Unmanaged top-level sections (``imex``, ``resources``), verbatim.
    other: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def mig_strategy(self) -> MigStrategy:
        return self.flags.mig_strategy or "none"


class _Reader:
    """Collects every shape violation of one document instead of stopping at the first."""

    def __init__(self) -> None:
        self.violations: list[FieldViolation] = []

    def bad(self, path: str, description: str) -> None:
        self.violations.append(FieldViolation(path, description))

    def mapping(self, value: object, path: str, allowed: tuple[str, ...]) -> Mapping[str, object]:
        # path "" is the document itself: its keys are named bare ("sharing", not ".sharing").
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.bad(path or "config", f"must be a mapping, got {type(value).__name__}")
            return {}
        for key in value:
            if key not in allowed:
                child = f"{path}.{key}" if path else str(key)
                self.bad(child, f"unknown key; allowed keys: {', '.join(allowed)}")
        return value

    def boolean(self, value: object, path: str) -> bool | None:
        if value is None or isinstance(value, bool):
            return value
        self.bad(path, f"must be true or false, got {brief(value)}")
        return None

    def integer(self, value: object, path: str) -> int | None:
        # bool is an int in Python but not in the plugin's Go schema. A whole float (2.0) reaches
        # the plugin as the JSON number 2 (sigs.k8s.io/yaml), which its int takes.
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        self.bad(path, f"must be an integer, got {brief(value)}")
        return None

    def string(self, value: object, path: str) -> str | None:
        if isinstance(value, str) and value:
            return value
        self.bad(path, f"must be a non-empty string, got {brief(value)}")
        return None


def parse(document: str | bytes | Mapping[str, object], field: str = "config") -> PluginConfig:
    """Parse a config from YAML text (within `agent.safeyaml`'s bounds, refusals naming
    ``field``) or an already-loaded mapping.

    Raises InvalidSpec listing every shape problem, each with its field path.
    """
    if isinstance(document, str | bytes):
        document = safeyaml.load(document, field)
    r = _Reader()
    top = r.mapping(document, "", _TOP_KEYS)
    # A null version is unset to the plugin, which then reads v1.
    version = top.get("version") or VERSION
    if version != VERSION:
        r.bad("version", f"must be {VERSION!r}, got {brief(version)}")
    flags = _parse_flags(r, top.get("flags"))
    sharing_raw = r.mapping(top.get("sharing"), "sharing", tuple(_SHARING_KEYS))
    sections = {
        attr: _parse_section(r, sharing_raw[key], f"sharing.{key}")
        for key, attr in _SHARING_KEYS.items()
        if key in sharing_raw and (sharing_raw[key] is not None or key in _NULL_IS_EMPTY)
    }
    other = {key: top[key] for key in _UNMANAGED_SECTIONS if key in top}
    if r.violations:
        raise InvalidSpec("the device-plugin config is malformed", r.violations)
    return PluginConfig(flags=flags, sharing=Sharing(**sections), other=_frozen(other))


def parse_requested(text: str, field: str) -> PluginConfig:
    """A config someone asks for (a file, a pipe, SetSharing's config_yaml): as `parse`, but a
    document with nothing in it (an empty file, a pipe that gave nothing, comments alone) is
    refused naming ``field``: set, it would stop all sharing without a word. A document that
    says so (``version: v1`` with no sharing section) still does; ClearSharing
    (`gpu-agent share clear`) is the way meant for it."""
    document = safeyaml.load(text, field)
    if document is None:
        raise InvalidSpec(
            f"{field}: the device-plugin config is empty (to stop sharing: gpu-agent share clear)",
            [FieldViolation(field, "a device-plugin config: version: v1, sharing: ...")],
        )
    return parse(document, field)


def _parse_flags(r: _Reader, value: object) -> Flags:
    if value is None:
        return Flags()
    if not isinstance(value, Mapping):
        r.bad("flags", f"must be a mapping, got {type(value).__name__}")
        return Flags()
    strategy = value.get("migStrategy")
    if strategy is not None and strategy not in MIG_STRATEGIES:
        allowed = ", ".join(MIG_STRATEGIES)
        r.bad("flags.migStrategy", f"must be one of {allowed}, got {brief(strategy)}")
        strategy = None
    other = {k: v for k, v in value.items() if k != "migStrategy"}
    return Flags(mig_strategy=cast(MigStrategy | None, strategy), other=_frozen(other))


def _parse_section(r: _Reader, value: object, path: str) -> ReplicatedResources:
    raw = r.mapping(value, path, _SECTION_KEYS)
    resources_raw = raw.get("resources")
    resources: list[ReplicatedResource] = []
    if resources_raw is not None and not isinstance(resources_raw, list):
        r.bad(f"{path}.resources", f"must be a list, got {type(resources_raw).__name__}")
    elif resources_raw is not None:
        for i, item in enumerate(resources_raw):
            resource = _parse_resource(r, item, f"{path}.resources[{i}]")
            if resource is not None:
                resources.append(resource)
    return ReplicatedResources(
        resources=tuple(resources),
        rename_by_default=bool(r.boolean(raw.get("renameByDefault"), f"{path}.renameByDefault")),
        fail_requests_greater_than_one=r.boolean(
            raw.get("failRequestsGreaterThanOne"), f"{path}.failRequestsGreaterThanOne"
        ),
    )


def _parse_resource(r: _Reader, value: object, path: str) -> ReplicatedResource | None:
    if not isinstance(value, Mapping):
        r.bad(path, f"must be a mapping with name and replicas, got {brief(value)}")
        return None
    raw = r.mapping(value, path, _RESOURCE_KEYS)
    for key in ("name", "replicas"):
        if key not in raw:
            r.bad(f"{path}.{key}", "required")
    name = r.string(raw["name"], f"{path}.name") if "name" in raw else None
    replicas = r.integer(raw["replicas"], f"{path}.replicas") if "replicas" in raw else None
    rename = r.string(raw["rename"], f"{path}.rename") if "rename" in raw else None
    devices = _parse_devices(r, raw["devices"], f"{path}.devices") if "devices" in raw else None
    if name is None or replicas is None:
        return None
    return ReplicatedResource(qualify(name), replicas, rename, devices)


def _parse_devices(r: _Reader, value: object, path: str) -> Devices | None:
    # The plugin's accepted shapes; validate.py then refuses all but "all" (the plugin ignores it).
    if isinstance(value, str | int) and not isinstance(value, bool):
        return value
    if isinstance(value, list) and all(
        isinstance(d, str | int) and not isinstance(d, bool) for d in value
    ):
        return tuple(value)
    r.bad(path, f"must be 'all', a device count or a list of indices/UUIDs, got {brief(value)}")
    return None


def to_document(config: PluginConfig) -> dict[str, object]:
    """The config as plain data in the plugin's key names and a fixed key order."""
    doc: dict[str, object] = {"version": VERSION}
    flags: dict[str, object] = {}
    if config.flags.mig_strategy is not None:
        flags["migStrategy"] = config.flags.mig_strategy
    flags.update(sorted(copy.deepcopy(dict(config.flags.other)).items()))
    if flags:
        doc["flags"] = flags
    sharing: dict[str, object] = {}
    for key, attr in _SHARING_KEYS.items():
        section = getattr(config.sharing, attr)
        if section is not None:
            sharing[key] = _section_document(section)
    if sharing:
        doc["sharing"] = sharing
    doc.update(sorted(copy.deepcopy(dict(config.other)).items()))
    return doc


def _section_document(section: ReplicatedResources) -> dict[str, object]:
    doc: dict[str, object] = {"renameByDefault": section.rename_by_default}
    if section.fail_requests_greater_than_one is not None:
        doc["failRequestsGreaterThanOne"] = section.fail_requests_greater_than_one
    resources: list[dict[str, object]] = []
    for res in section.resources:
        item: dict[str, object] = {"name": res.name, "replicas": res.replicas}
        if res.rename is not None:
            item["rename"] = res.rename
        if res.devices is not None:
            item["devices"] = list(res.devices) if isinstance(res.devices, tuple) else res.devices
        resources.append(item)
    doc["resources"] = resources
    return doc


def merge(current: PluginConfig, requested: PluginConfig) -> PluginConfig:
    """The file a set of ``requested`` writes over ``current``: its sharing replaces the
    current one; its ``flags`` and other sections are laid over the current file's (which the
    plugin shares), so a request without them keeps e.g. ``failOnInitError`` as it was."""
    flags = Flags(
        mig_strategy=requested.flags.mig_strategy or current.flags.mig_strategy,
        other=MappingProxyType({**current.flags.other, **requested.flags.other}),
    )
    other = MappingProxyType({**current.other, **requested.other})
    return PluginConfig(flags=flags, sharing=requested.sharing, other=other)


def unmanaged_changes(current: PluginConfig, desired: PluginConfig) -> list[str]:
    """The keys that differ between ``current`` and ``desired`` beyond sharing and
    ``flags.migStrategy``: ``flags.<key>`` and the other sections (``resources``, ``imex``),
    added, changed or removed, e.g. ``flags.plugin`` for a new ``deviceListStrategy``."""
    flags, other = current.flags.other, desired.flags.other
    changed = [
        f"flags.{key}" for key in sorted({*flags, *other}) if flags.get(key) != other.get(key)
    ]
    return changed + [
        key
        for key in sorted({*current.other, *desired.other})
        if current.other.get(key) != desired.other.get(key)
    ]


def render(config: PluginConfig) -> str:
    """YAML for the plugin: deterministic (same config, same bytes), with a one-line header."""
    body = yaml.safe_dump(
        to_document(config), sort_keys=False, default_flow_style=False, allow_unicode=True
    )
    return _HEADER + body
