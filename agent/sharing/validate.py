"""The sharing rules: everything the device plugin would refuse or silently ignore. Pure.

Each rule names the field and says why (reference/mig.md §5.1, §7 item 12). Every violation is
collected, so one refusal lists all that must change.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.types import GpuLayout
from agent.safeyaml import brief
from agent.sharing import flagtypes
from agent.sharing.advertise import (
    GPU_RESOURCE,
    base_resources,
    mig_enabled,
    single_strategy_problem,
)
from agent.sharing.schema import RESOURCE_PREFIX, PluginConfig, ReplicatedResources, qualify

MAX_RESOURCE_NAME = 63
MIN_REPLICAS = 2
#: The kubelet's capacity and our API's counts are uint32: devices x replicas must fit.
MAX_ADVERTISED = 2**32 - 1
#: Clients one MPS server takes (k8s-device-plugin cmd/mps-control-daemon/mps/device.go,
#: maxClients): 48 from compute capability 7.5 on, 16 before.
MPS_MAX_CLIENTS = 48
MPS_MAX_CLIENTS_OLD = 16
_MPS_NEW_FROM = (7, 5)
#: Keys of a sharing section that have no meaning under ``flags``: the plugin's Flags type has no
#: such field and its YAML reader drops unknown keys, so there they are ignored without a word.
_SECTION_ONLY = ("renameByDefault", "failRequestsGreaterThanOne", "resources", "replicas")
_IMEX_KEYS = ("channelIDs", "required")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")


def validate(config: PluginConfig, layouts: Sequence[GpuLayout]) -> None:
    """Raise InvalidSpec with every violation of ``config`` on a node with ``layouts``."""
    found = violations(config, layouts)
    if found:
        plural = "s" if len(found) > 1 else ""
        raise InvalidSpec(f"the sharing config is refused ({len(found)} problem{plural})", found)


def violations(config: PluginConfig, layouts: Sequence[GpuLayout]) -> list[FieldViolation]:
    """Every rule ``config`` breaks on a node with ``layouts``; empty when it is fine."""
    found = _flags(config) + _imex(config) + _resources(config)
    sharing = config.sharing
    if sharing.time_slicing is not None and sharing.mps is not None:
        found.append(
            FieldViolation(
                "sharing",
                "timeSlicing and mps are mutually exclusive (the plugin applies MPS and ignores "
                "timeSlicing); keep one",
            )
        )
    if sharing.time_slicing is not None:
        found += _section(config, "timeSlicing", sharing.time_slicing, layouts)
    if sharing.mps is not None:
        found += _mps(config, layouts)
        found += _section(config, "mps", sharing.mps, layouts)
    return found


def _flags(config: PluginConfig) -> list[FieldViolation]:
    found = []
    other = config.flags.other
    for key in (*_SECTION_ONLY, "timeSlicing", "mps", "sharing"):
        if key in other:
            found.append(
                FieldViolation(
                    f"flags.{key}",
                    "misplaced: the device plugin ignores it under flags; it belongs under "
                    "sharing.timeSlicing or sharing.mps"
                    if key in _SECTION_ONLY
                    else "misplaced: the device plugin ignores it under flags; it belongs under "
                    "sharing",
                )
            )
    return found + flagtypes.violations(other)


def _resources(config: PluginConfig) -> list[FieldViolation]:
    """The top-level ``resources`` (renaming): the plugin ignores it once read, with a warning,
    but it must still read (api/config/v1/resources.go), or the plugin does not start."""
    section = config.other.get("resources")
    if section is None:
        return []
    stop = " (the plugin cannot parse the file and does not start)"
    if not isinstance(section, dict):
        return [FieldViolation("resources", f"must be a mapping, got {brief(section)}{stop}")]
    found = []
    for key, value in section.items():
        if str(key).casefold() not in ("gpus", "mig") or value is None:
            continue  # a key the plugin's struct lacks is dropped there
        if not isinstance(value, list):
            found.append(FieldViolation(f"resources.{key}", f"must be a list{stop}"))
            continue
        for i, item in enumerate(value):
            at = f"resources.{key}[{i}]"
            if not isinstance(item, dict):
                found.append(FieldViolation(at, f"must be a mapping of pattern and name{stop}"))
                continue
            for field in ("pattern", "name"):
                if field not in item:
                    found.append(FieldViolation(f"{at}.{field}", f"required{stop}"))
            pattern = item.get("pattern")
            if pattern is not None and not isinstance(pattern, str):
                found.append(
                    FieldViolation(f"{at}.pattern", f"must be a string, got {brief(pattern)}{stop}")
                )
            if "name" in item:
                name = item["name"]
                problem = (
                    _name_syntax(qualify(name))
                    if isinstance(name, str)
                    else f"must be a string, got {brief(name)}"
                )
                if problem is not None:
                    found.append(FieldViolation(f"{at}.name", problem + stop))
    return found


def _imex(config: PluginConfig) -> list[FieldViolation]:
    imex = config.other.get("imex")
    if imex is None:
        return []
    if not isinstance(imex, dict):
        return [FieldViolation("imex", f"must be a mapping, got {brief(imex)}")]
    found = [
        FieldViolation(
            f"imex.{key}", f"unknown key (ignored by the plugin); allowed: {', '.join(_IMEX_KEYS)}"
        )
        for key in imex
        if key not in _IMEX_KEYS
    ]
    ids = imex.get("channelIDs")
    if ids is not None and not _channel_ids_valid(ids):
        # api/config/v1/imex.go AssertChannelIDsValid
        found.append(
            FieldViolation(
                "imex.channelIDs",
                f"must be [] or [0], got {brief(ids)} (the plugin refuses to start: "
                '"channelIDs must be [] or [0]")',
            )
        )
    required = imex.get("required")
    if required is not None and not isinstance(required, bool):
        found.append(
            FieldViolation("imex.required", f"must be true or false, got {brief(required)}")
        )
    return found


def _channel_ids_valid(ids: object) -> bool:
    if not isinstance(ids, list):
        return False
    return ids == [] or (len(ids) == 1 and type(ids[0]) is int and ids[0] == 0)


def _mps_clients(layouts: Sequence[GpuLayout]) -> int:
    """The plugin's MPS client limit for this node: 16 when a GPU is known to be older than
    compute capability 7.5; a GPU whose capability is unknown gets the limit of any newer one."""
    old = any(
        layout.gpu.compute_capability is not None and layout.gpu.compute_capability < _MPS_NEW_FROM
        for layout in layouts
    )
    return MPS_MAX_CLIENTS_OLD if old else MPS_MAX_CLIENTS


def _mps(config: PluginConfig, layouts: Sequence[GpuLayout]) -> list[FieldViolation]:
    found = []
    assert config.sharing.mps is not None
    limit = _mps_clients(layouts)
    for i, res in enumerate(config.sharing.mps.resources):
        if res.replicas > limit:
            found.append(
                FieldViolation(
                    f"sharing.mps.resources[{i}].replicas",
                    f"at most {limit} (one MPS server takes {limit} clients on these GPUs; the "
                    f'plugin refuses more: "maximum allowed replicas exceeded"), '
                    f"got {res.replicas}",
                )
            )
    if config.mig_strategy == "mixed":
        found.append(
            FieldViolation(
                "flags.migStrategy",
                "MPS cannot be combined with the mixed MIG strategy (the plugin refuses to "
                "start); use none or drop sharing.mps",
            )
        )
    with_mig = [str(layout.gpu.index) for layout in layouts if mig_enabled(layout)]
    if with_mig:
        found.append(
            FieldViolation(
                "sharing.mps",
                f"MPS is not supported on GPUs with MIG enabled (GPU {', '.join(with_mig)}); "
                "disable MIG or use timeSlicing",
            )
        )
    return found


def _section(
    config: PluginConfig, key: str, section: ReplicatedResources, layouts: Sequence[GpuLayout]
) -> list[FieldViolation]:
    path = f"sharing.{key}"
    if not section.resources:
        return [
            FieldViolation(
                f"{path}.resources",
                "at least one resource is required (the plugin refuses the file: "
                '"no resources specified")',
            )
        ]
    found = []
    first_index: dict[str, int] = {}
    devices = base_resources(config.mig_strategy, layouts)
    for i, res in enumerate(section.resources):
        at = f"{path}.resources[{i}]"
        name_problem = _name_syntax(res.name)
        if name_problem is None and res.name in first_index:
            name_problem = f"{res.name} is listed twice (also resources[{first_index[res.name]}])"
        if name_problem is None:
            name_problem = _name_on_node(config, key, res.name, layouts)
        first_index.setdefault(res.name, i)
        if name_problem is not None:
            found.append(FieldViolation(f"{at}.name", name_problem))
        if res.replicas < MIN_REPLICAS:
            found.append(
                FieldViolation(
                    f"{at}.replicas",
                    f"must be >= {MIN_REPLICAS}, got {res.replicas} (the plugin refuses the "
                    'file: "number of replicas must be >= 2"); use share clear to stop sharing',
                )
            )
        elif res.replicas * max(devices.get(res.name, 0), 1) > MAX_ADVERTISED:
            n = devices.get(res.name, 0)
            found.append(
                FieldViolation(
                    f"{at}.replicas",
                    f"{res.replicas} replicas of {max(n, 1)} device(s) pass {MAX_ADVERTISED}, "
                    "the most a node can advertise (uint32)",
                )
            )
        if res.rename is not None:
            found.append(
                FieldViolation(
                    f"{at}.rename",
                    "ignored by the device plugin (reset to the name or <name>.shared); set "
                    f"{path}.renameByDefault: true to advertise {res.name}.shared",
                )
            )
        if res.devices is not None and res.devices != "all":
            found.append(
                FieldViolation(
                    f"{at}.devices",
                    "ignored by the device plugin (forced to 'all'): sharing applies to every "
                    "GPU of the node, per-GPU replica counts are not possible; remove it",
                )
            )
    return found


def _name_syntax(name: str) -> str | None:
    if len(name) > MAX_RESOURCE_NAME:
        return (
            f"fully-qualified resource name must be {MAX_RESOURCE_NAME} characters or less, "
            f"{brief(name)} has {len(name)}"
        )
    part = name.removeprefix(RESOURCE_PREFIX)
    if not _DNS_SUBDOMAIN.fullmatch(part):
        return (
            f"{brief(part)} after {RESOURCE_PREFIX} must be a DNS subdomain: lowercase letters, "
            "digits, '-' and '.', starting and ending with a letter or digit"
        )
    return None


def _name_on_node(
    config: PluginConfig, key: str, name: str, layouts: Sequence[GpuLayout]
) -> str | None:
    """Why the plugin would not advertise ``name`` here (so it would skip the entry), or None."""
    strategy = config.mig_strategy
    if key == "mps" and name != GPU_RESOURCE:
        return f"MPS shares only {GPU_RESOURCE} on full GPUs, not {name}"
    advertised = {n for n, count in base_resources(strategy, layouts).items() if count > 0}
    if name in advertised:
        return None
    if name.startswith(f"{RESOURCE_PREFIX}mig-") and strategy != "mixed":
        return (
            f"MIG resources like {name} exist only under flags.migStrategy: mixed "
            f"(this config: {strategy})"
        )
    problem = single_strategy_problem(layouts) if strategy == "single" else None
    if name == GPU_RESOURCE and problem is not None:
        return f"the single MIG strategy cannot expose this node: {problem}"
    if name == GPU_RESOURCE and strategy == "mixed" and layouts:
        return (
            f"every GPU has MIG enabled, so under the mixed strategy the plugin advertises no "
            f"{GPU_RESOURCE}"
        )
    valid = ", ".join(sorted(advertised)) or "none"
    return (
        f"the plugin does not advertise {name} on this node (migStrategy {strategy}), so it "
        f"would ignore these replicas; valid here: {valid}"
    )
