"""What the device plugin advertises to the kubelet for a config on a node. Pure.

Mirrors the plugin's device map (reference/mig.md §4 and §5.1): the MIG strategy decides which
resources exist and how many devices back each; sharing multiplies a resource by its replicas
and, with ``renameByDefault``, advertises it as ``<name>.shared``. A sharing entry for a resource
the plugin does not advertise is skipped by the plugin without a word.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from agent.gpu.types import GpuLayout
from agent.sharing.schema import RESOURCE_PREFIX, MigStrategy, PluginConfig

GPU_RESOURCE = RESOURCE_PREFIX + "gpu"
SHARED_SUFFIX = ".shared"
#: ``<C>c.`` prefix of a CI narrower than its GI (``1c.3g.40gb``).
_SUB_GI = re.compile(r"\d+c\.", re.ASCII)


#: The most a count can say: the API's counts are uint32 (agent/wire/sharing.py).
MAX_COUNT = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Advertised:
    """One resource of the node capacity: ``devices`` GPUs or MIG devices, times replicas."""

    resource: str
    devices: int
    replicas: int

    @property
    def count(self) -> int:
        """devices x replicas, saturated at 2**32-1 as the API sends it (a node's capacity and
        the API's counts are uint32; a hand-written file past that shows with its problem), so a
        client that reads the API shows the number the agent does."""
        return min(self.devices * self.replicas, MAX_COUNT)


def mig_enabled(layout: GpuLayout) -> bool:
    mode = layout.gpu.mig_mode
    return mode is not None and mode.current


def mig_resource_name(profile: str) -> str:
    """``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me`` (resource names write ``+`` as ``.``)."""
    return f"{RESOURCE_PREFIX}mig-{profile.replace('+', '.')}"


def mig_device_profiles(layout: GpuLayout) -> list[str]:
    """The profile of every usable MIG device (GI + CI with a UUID) on one GPU.

    A CI as wide as its GI carries the GI's name (``3g.40gb``); a narrower one is ``<C>c.<GI>``,
    which the plugin never advertises under the mixed strategy.
    """
    profiles = []
    for gi in layout.instances:
        gi_slices = int(gi.profile_name.split("g.", 1)[0])
        for ci in gi.compute_instances:
            if ci.uuid is None:
                continue
            c = ci.placement.size
            profiles.append(gi.profile_name if c == gi_slices else f"{c}c.{gi.profile_name}")
    return profiles


def single_strategy_problem(layouts: Sequence[GpuLayout]) -> str | None:
    """Why the single strategy cannot expose this node, or None when it can."""
    enabled = [layout for layout in layouts if mig_enabled(layout)]
    if not enabled:
        return None
    if len(enabled) != len(layouts):
        return "some GPUs have MIG enabled and others not"
    empty = [str(layout.gpu.index) for layout in enabled if not mig_device_profiles(layout)]
    if empty:
        return f"GPU(s) {', '.join(empty)} have MIG enabled but no MIG devices"
    profiles = sorted({p for layout in enabled for p in mig_device_profiles(layout)})
    if len(profiles) > 1:
        return f"MIG devices of more than one profile ({', '.join(profiles)})"
    return None


def base_resources(strategy: MigStrategy, layouts: Sequence[GpuLayout]) -> dict[str, int]:
    """Resource -> device count the plugin advertises with no sharing."""
    if strategy == "none":
        # Under "none" the plugin hands out MIG-enabled GPUs whole, like any other GPU.
        return {GPU_RESOURCE: len(layouts)} if layouts else {}
    if strategy == "single":
        if single_strategy_problem(layouts) is not None:
            return {GPU_RESOURCE: 0}
        devices = sum(len(mig_device_profiles(layout)) for layout in layouts)
        return {GPU_RESOURCE: devices or len(layouts)}
    counts: Counter[str] = Counter()
    for layout in layouts:
        if not mig_enabled(layout):
            counts[GPU_RESOURCE] += 1
            continue
        for profile in mig_device_profiles(layout):
            if not _SUB_GI.match(profile):
                counts[mig_resource_name(profile)] += 1
    return dict(counts)


def advertise(config: PluginConfig, layouts: Sequence[GpuLayout]) -> tuple[Advertised, ...]:
    """Every resource the plugin advertises for ``config`` on a node with ``layouts``."""
    active = config.sharing.active
    shared = {r.name: r.replicas for r in active.resources} if active is not None else {}
    rename = active is not None and active.rename_by_default
    result = []
    for name, devices in base_resources(config.mig_strategy, layouts).items():
        replicas = shared.get(name, 1)
        advertised = name + SHARED_SUFFIX if rename and replicas > 1 else name
        result.append(Advertised(advertised, devices, replicas))
    return tuple(sorted(result, key=lambda a: a.resource))
