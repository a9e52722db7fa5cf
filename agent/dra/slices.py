"""A small, bounded reader of one driver's ``resource.k8s.io/v1`` ResourceSlices on this node.

Pure: JSON objects as the API server sends them in, the facts the allocation mode and the
republish check need out. Written for this package (agent/telemetry/dra.py has its own reader
for attribution; the two need different facts). Nothing here trusts the objects: anyone with
write access to ResourceSlices can publish one, so every count and string is bounded and a
slice that is not what the schema says is counted as malformed, never guessed at.

What NVIDIA's DRA driver (``gpu.nvidia.com``, kubernetes-sigs/dra-driver-nvidia-gpu at
9593204, cmd/gpu-kubelet-plugin) publishes, and what this reads of it:

- device names ``gpu-<minor>`` for a whole GPU (deviceinfo.go ``GpuInfo.CanonicalName``) and
  ``gpu-<minor>-mig-<profile>-<profileId>-<placementStart>`` for a MIG device (mig.go
  ``ToCanonicalName``: the profile lower-cased, dots dropped, other characters to ``-``);
- attributes ``type`` (``gpu``, ``mig`` or ``vfio``: types.go), ``uuid`` (the GPU's or the MIG
  device's; deviceinfo.go ``GetDevice``), ``parentUUID`` and ``profile`` on MIG devices
  (mig.go ``CommonAttributesMig``), ``productName``, ``brand``, ``architecture``,
  ``driverVersion``... An attribute's name may be written qualified (``gpu.nvidia.com/uuid``)
  or bare (``uuid``, the driver's own domain): the same attribute;
- with the DynamicMIG feature gate (alpha, off by default: pkg/featuregates) the plugin
  publishes partitionable devices instead (KEP-4815; driver.go ``publishResources`` ->
  ``GenerateDriverResources``, partitions.go): ``spec.sharedCounters`` with one counter set
  ``gpu-<minor>-counter-set`` per GPU, every device with ``consumesCounters``, and each
  possible MIG placement as an abstract device that has no ``uuid`` (``MigSpec.Attributes`` is
  the common MIG set without one) because no instance exists until a claim is prepared.
  Without the gate nothing of this appears (``applyConsumableShares`` only adds capacities and
  ``allowMultipleAllocations``), so counters or a MIG device without a uuid are the evidence of
  DynamicMIG.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["MAX_DEVICES", "MAX_SLICES", "DriverSlices", "PublishedDevice", "read_slices"]

#: Slices read of one node: a node's driver publishes one per GPU at most (plus a counter
#: slice); past this the reader stops and says so.
MAX_SLICES = 64
#: Devices read of one slice (the API server's own limit is 128).
MAX_DEVICES = 128
#: Longest string kept of a name or attribute; longer ones are malformed.
MAX_STRING = 256
#: Attributes of one device looked at (the server allows 32 attributes and capacities).
MAX_ATTRIBUTES = 32


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    name: str
    #: the ``type`` attribute: "gpu", "mig", "vfio", or "" when absent
    type: str
    #: the ``uuid`` attribute; "" for a device without one (DynamicMIG's abstract MIG devices)
    uuid: str
    profile: str = ""
    consumes_counters: bool = False
    #: the ``parentUUID`` attribute (a MIG device's GPU); "" when absent
    parent: str = ""


@dataclass(frozen=True, slots=True)
class DriverSlices:
    """What one driver's slices on this node say."""

    driver: str
    slices: int = 0
    devices: tuple[PublishedDevice, ...] = ()
    #: counter sets in ``spec.sharedCounters`` across the slices
    counter_sets: int = 0
    #: slices (of this driver and node) or devices that were not what the schema says
    malformed: int = 0
    #: more slices or devices than the bounds: not everything was read
    truncated: bool = False

    @property
    def uuids(self) -> tuple[str, ...]:
        """The devices' uuids, sorted (a device listed twice is there twice)."""
        return tuple(sorted(d.uuid for d in self.devices if d.uuid))

    @property
    def partitionable(self) -> bool:
        """The evidence of the driver's DynamicMIG mode (see the module docstring)."""
        return self.counter_sets > 0 or any(
            d.consumes_counters or (d.type == "mig" and not d.uuid) for d in self.devices
        )


def read_slices(objects: Iterable[object], driver: str, node: str) -> DriverSlices:
    """The slices of ``driver`` whose ``spec.nodeName`` is ``node`` (others are skipped: the
    list is field-selected by node, a slice of another driver is not evidence of this one)."""
    slices = counter_sets = malformed = 0
    truncated = False
    devices: list[PublishedDevice] = []
    for obj in objects:
        spec = obj.get("spec") if isinstance(obj, dict) else None
        if not isinstance(spec, dict):
            continue
        if spec.get("driver") != driver or spec.get("nodeName") != node:
            continue
        if slices >= MAX_SLICES:
            truncated = True
            break
        slices += 1
        counters = spec.get("sharedCounters")
        listed = spec.get("devices")
        if counters is None:
            counters = []
        if listed is None:
            listed = []
        if not isinstance(counters, list) or not isinstance(listed, list):
            malformed += 1
            continue
        counter_sets += min(len(counters), MAX_DEVICES)
        if len(listed) > MAX_DEVICES:
            truncated = True
        for raw in listed[:MAX_DEVICES]:
            device = _device(raw, driver)
            if device is None:
                malformed += 1
            else:
                devices.append(device)
    return DriverSlices(driver, slices, tuple(devices), counter_sets, malformed, truncated)


def _device(raw: object, driver: str) -> PublishedDevice | None:
    if not isinstance(raw, dict):
        return None
    name = raw.get("name")
    attributes = raw.get("attributes") or {}
    consumes = raw.get("consumesCounters")
    if not _short(name) or not isinstance(attributes, dict):
        return None
    if len(attributes) > MAX_ATTRIBUTES:
        return None
    if consumes is not None and not isinstance(consumes, list):
        return None
    values = _strings(attributes, driver)
    if values is None:
        return None
    assert isinstance(name, str)
    return PublishedDevice(
        name,
        values.get("type", ""),
        values.get("uuid", ""),
        values.get("profile", ""),
        bool(consumes),
        values.get("parentUUID", ""),
    )


#: the attributes read, by bare name
_READ = ("type", "uuid", "profile", "parentUUID")


def _strings(attributes: Mapping[object, object], driver: str) -> dict[str, str] | None:
    """The string attributes the reader uses, by bare name (``uuid`` or ``<driver>/uuid``; an
    attribute of another domain is not the driver's); None when one is malformed."""
    out: dict[str, str] = {}
    for key, value in attributes.items():
        if not _short(key):
            return None
        assert isinstance(key, str)
        domain, _, bare = key.rpartition("/")
        if domain not in ("", driver) or bare not in _READ:
            continue
        text = value.get("string") if isinstance(value, dict) else None
        if not _short(text):
            return None
        assert isinstance(text, str)
        out[bare] = text
    return out


def _short(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_STRING
