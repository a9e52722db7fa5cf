"""The allocation mode of this node, from what the API server says about it: pure.

Facts in (`NodeFacts`: this node's ResourceSlices of the GPU DRA driver, read by
agent.dra.slices, and the Node's ``status.allocatable`` / ``status.capacity``), one
`Allocation` out, always with the evidence it was read from. Nothing is guessed: facts not read
yet give ``unknown``, and facts that contradict each other say so.

The evidence, and where it comes from:

- **dra-dynamic-mig**: the driver's slices carry partitionable devices (shared counter sets,
  devices that consume counters, MIG devices without a uuid): only its DynamicMIG feature gate
  publishes those (kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin driver.go
  ``publishResources``; agent/dra/slices.py has the details). In that mode the driver creates a
  MIG instance as a claim is prepared and destroys, at its start, every instance it did not
  create (driver.go ``DestroyUnknownMIGDevices``); NVIDIA's MIG guide says not to run
  mig-parted or ``nvidia-smi mig`` beside it. This wins over any other evidence: it is the mode
  that forbids the most.
- **dra**: the driver's slices list devices with uuids and no counters (static MIG: instances
  made beforehand, discovered when the kubelet plugin starts; "Partitions added after the
  driver starts are not discovered until the GPU kubelet plugin restarts", the driver's MIG
  guide). Slices with no device at all are ``dra`` too: the driver runs and publishes nothing
  allocatable (a GPU with MIG on and no instance is "stranded", the driver's concepts page).
- **device-plugin**: ``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>`` allocatable above 0 on
  the Node: the extended resources only a device plugin registers with the kubelet. Capacity
  without allocatable is a plugin that stopped (the kubelet zeroes allocatable when a plugin's
  endpoint goes away and keeps the capacity a while): not evidence of one running.
- static DRA devices **and** device-plugin resources: two allocators of the same GPUs; the mode
  is ``unknown`` naming both, until ``dra.mode`` says which is meant.
- **none**: neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent import safeyaml
from agent.dra.mode import DENIED, UNANSWERED, Allocation, AllocationMode
from agent.dra.slices import MAX_SLICES, DriverSlices
from agent.safeyaml import ascii_int

__all__ = ["AUTO", "NO_API", "NodeFacts", "configured", "detect", "device_plugin_resources"]

AUTO = "auto"
NO_API = Allocation(
    AllocationMode.NONE,
    "no Kubernetes API configured, as outside a pod with a service account: nothing to detect",
)
#: Extended resources of the Node looked at; a Node has a handful.
MAX_RESOURCES = 256
_GPU = "nvidia.com/gpu"
_MIG = "nvidia.com/mig-"


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the agent has read so far; None: not read yet (the API has not answered)."""

    driver: str
    slices: DriverSlices | None
    allocatable: Mapping[str, object] | None
    capacity: Mapping[str, object] | None = None
    #: why a fact is missing (the last error of its watch), said in the evidence
    problem: str = ""
    #: whether that error was the API refusing the agent (401/403), not answering none
    denied: bool = False


def configured(setting: str, driver: str) -> Allocation | None:
    """``dra.mode`` set to a mode: that mode, said to be the config's; None for auto."""
    if setting == AUTO:
        return None
    mode = AllocationMode(setting)
    return Allocation(mode, "set in config (dra.mode)", driver if mode.is_dra else "")


def detect(facts: NodeFacts) -> Allocation:
    driver = facts.driver
    missing = [
        what
        for what, fact in (
            (f"this node's ResourceSlices of {driver}", facts.slices),
            ("this Node's allocatable resources", facts.allocatable),
        )
        if fact is None
    ]
    if missing:
        why = f": {facts.problem}" if facts.problem else ""
        return Allocation(
            AllocationMode.UNKNOWN,
            f"the Kubernetes API has not answered yet for {' and '.join(missing)}{why}",
            unread=DENIED if facts.denied else UNANSWERED,
        )
    assert facts.slices is not None and facts.allocatable is not None
    slices = facts.slices
    plugin = device_plugin_resources(facts.allocatable)
    plugin_said = _said(plugin)
    if slices.partitionable:
        evidence = (
            f"ResourceSlices of {driver} on this node carry partitionable devices "
            f"({_partitionable(slices)}): the driver's DynamicMIG mode"
        )
        if plugin:
            evidence += (
                f"; the Node also has {plugin_said} allocatable (a device plugin too: "
                "conflicting, the stricter mode applies)"
            )
        return Allocation(AllocationMode.DRA_DYNAMIC_MIG, evidence, driver)
    if slices.malformed or slices.truncated:
        unread = (
            f"{slices.malformed} malformed device(s) or slice(s)"
            if slices.malformed
            else f"more than {MAX_SLICES} slices or too many devices"
        )
        return Allocation(
            AllocationMode.UNKNOWN,
            f"ResourceSlices of {driver} on this node could not all be read ({unread}): "
            "static or dynamic MIG cannot be told; set dra.mode if this persists",
        )
    if slices.slices and plugin:
        return Allocation(
            AllocationMode.UNKNOWN,
            f"conflicting evidence: ResourceSlices of {driver} list {_devices(slices)} and the "
            f"Node has {plugin_said} allocatable (a device plugin): set dra.mode to the one "
            "that hands out this node's GPUs",
        )
    if slices.slices:
        return Allocation(
            AllocationMode.DRA,
            f"ResourceSlices of {driver} on this node list {_devices(slices)} with uuids and no "
            "shared counters (static partitions)",
            driver,
        )
    if plugin:
        return Allocation(AllocationMode.DEVICE_PLUGIN, f"Node allocatable {plugin_said}")
    evidence = f"no ResourceSlices of {driver} on this node and no {_GPU} or {_MIG}* allocatable"
    stale = device_plugin_resources(facts.capacity or {})
    if stale:
        evidence += f" ({_said(stale)} in capacity only: a device plugin that stopped)"
    return Allocation(AllocationMode.NONE, evidence)


def device_plugin_resources(resources: Mapping[str, object]) -> tuple[tuple[str, int], ...]:
    """The device plugin's extended resources above 0, sorted (bounded; a value that is not a
    whole count, such as "1k" or "-1", is not counted)."""
    found = []
    for i, (name, value) in enumerate(resources.items()):
        if i >= MAX_RESOURCES:
            break
        if not isinstance(name, str) or not (name == _GPU or name.startswith(_MIG)):
            continue
        count = _count(value)
        if count:
            found.append((name, count))
    return tuple(sorted(found))


def _said(resources: tuple[tuple[str, int], ...]) -> str:
    """At most four named (a Node may list one resource per MIG profile)."""
    return safeyaml.some([f"{k}={v}" for k, v in resources], 4)


def _count(value: object) -> int:
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    return ascii_int(text, 6) or 0


def _devices(slices: DriverSlices) -> str:
    kinds: dict[str, int] = {}
    for device in slices.devices:
        kinds[device.type or "untyped"] = kinds.get(device.type or "untyped", 0) + 1
    if not kinds:
        return "no devices"
    return (
        f"{len(slices.devices)} device(s) ("
        + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        + ")"
    )


def _partitionable(slices: DriverSlices) -> str:
    parts = []
    if slices.counter_sets:
        parts.append(f"{slices.counter_sets} shared counter set(s)")
    consuming = sum(d.consumes_counters for d in slices.devices)
    if consuming:
        parts.append(f"{consuming} device(s) consuming counters")
    abstract = sum(d.type == "mig" and not d.uuid for d in slices.devices)
    if abstract:
        parts.append(f"{abstract} MIG device(s) without a uuid")
    return ", ".join(parts)
