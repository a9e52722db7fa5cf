"""DRA attribution: which GPU or MIG instance a claim's device is, from this node's ResourceSlices;
and the DRA claims reader.

kubelet's PodResources reports the DRA claims of a container in ``dynamic_resources`` by driver,
pool and device name, never by UUID. NVIDIA's DRA driver (``gpu.nvidia.com``) publishes each
device of a node in a ResourceSlice with the attribute ``type`` (``gpu`` or ``mig``); a GPU
carries ``uuid``, a MIG device ``parentUUID`` and ``profile``, and ``uuid`` only where the
instance exists when it is published (static MIG). Under the driver's DynamicMIG mode a MIG
device is an abstract placement, created when a claim is prepared; its name is the driver's
canonical ``gpu-<parent minor>-mig-<profile>-<GI profile id>-<placement start>`` (the driver's
``MigSpecTuple.ToCanonicalName``), which is what identifies the instance on the node.

:class:`DraDevices` reads the slices of this node from the agent's shared informer of them
(agent/kube_edge.py: one list+watch per agent, ``fieldSelector=spec.nodeName``; other drivers'
slices are skipped here): a republished slice is seen as the watch delivers it, a 410 lists
again, an API server that stops answering leaves the last answer in place and
:meth:`DraDevices.status` says it is stale. The version read is ``resource.k8s.io/v1``
(Kubernetes 1.34+) or, where only that is served, ``v1beta2`` (the same shape), as discovery
finds (agent/kube_discovery.py); on a cluster that serves neither the list answers 404, which
the status says, and DRA claims are not attributed (device-plugin pods still are).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.telemetry.allocation import Allocation
from agent.telemetry.reader import Degraded, Frame, Part, Reader

if TYPE_CHECKING:  # the API server's client is loaded only on a node that reads DRA claims
    from agent.kube import InClusterKubeClient
    from agent.kube_watch import Informer

log = logging.getLogger(__name__)

__all__ = [
    "DRIVER",
    "PATH",
    "DraDevices",
    "DraReader",
    "DraSlicesCollector",
    "SliceDevice",
    "slice_devices",
]

DRIVER = "gpu.nvidia.com"
PATH = "/apis/resource.k8s.io/v1/resourceslices"
_MAX_DEVICES = 4096  # bounds what a hostile or broken answer can make the agent hold
#: A number in a device name: ASCII digits, as the driver writes them (``\d`` takes any
#: script's, and ``int()`` refuses 4300 of them with a ValueError)
_N = "[0-9]{1,9}"
#: the driver's canonical MIG device name (its ``canonicalMigNameRegex``)
_CANONICAL_MIG = re.compile(
    rf"gpu-(?P<minor>{_N})-mig-(?P<profile>.+)-(?P<id>{_N})-(?P<start>{_N})"
)

DeviceKey = tuple[str, str]  # (pool, device)


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of NVIDIA's DRA driver as its slice publishes it."""

    #: ``gpu`` or ``mig`` (the ``type`` attribute)
    kind: str
    #: ``GPU-``/``MIG-`` UUID: whole GPUs and MIG instances that exist when published
    uuid: str | None = None
    #: a MIG device's ``parentUUID``
    parent_uuid: str | None = None
    #: a MIG device's ``profile``, e.g. ``1g.10gb``
    profile: str | None = None
    #: a MIG device's parent minor, GI profile id and placement start, from its canonical name
    parent_minor: int | None = None
    profile_id: int | None = None
    placement_start: int | None = None


def slice_devices(slices: Iterable[object]) -> dict[DeviceKey, SliceDevice]:
    """(pool, device) -> the device, from ResourceSlice objects (``resource.k8s.io/v1``); other
    drivers, other device types (vfio) and malformed entries are skipped. A MIG device counts
    only with its ``parentUUID``, as dcgm-exporter reads it. Of a pool being republished, only
    the slices of its newest ``pool.generation`` count, as the scheduler reads them."""
    from agent.kube import dig

    out: dict[DeviceKey, SliceDevice] = {}
    ours = [
        spec
        for item in slices
        if isinstance(spec := dig(item, "spec"), dict) and spec.get("driver") == DRIVER
    ]
    newest: dict[str, int] = {}
    for spec in ours:
        pool, generation = dig(spec, "pool", "name"), dig(spec, "pool", "generation")
        if isinstance(pool, str) and isinstance(generation, int):
            newest[pool] = max(generation, newest.get(pool, generation))
    for spec in ours:
        pool = dig(spec, "pool", "name")
        devices = spec.get("devices")
        if not isinstance(pool, str) or not isinstance(devices, list):
            continue
        if dig(spec, "pool", "generation") != newest.get(pool):
            continue  # an older generation of a pool being republished, or no generation
        for device in devices:
            if len(out) >= _MAX_DEVICES:
                return out
            name = dig(device, "name")
            parsed = _device(name, dig(device, "attributes"))
            if isinstance(name, str) and parsed is not None:
                out[(pool, name)] = parsed
    return out


def _device(name: object, attrs: object) -> SliceDevice | None:
    kind, uuid = _string(attrs, "type"), _string(attrs, "uuid")
    if kind == "gpu":
        return SliceDevice("gpu", uuid=uuid) if uuid else None
    if kind != "mig" or not isinstance(name, str):
        return None
    parent = _string(attrs, "parentUUID")
    if not parent:
        return None
    m = _CANONICAL_MIG.fullmatch(name)
    return SliceDevice(
        "mig",
        uuid=uuid,
        parent_uuid=parent,
        profile=_string(attrs, "profile"),
        parent_minor=int(m["minor"]) if m else None,
        profile_id=int(m["id"]) if m else None,
        placement_start=int(m["start"]) if m else None,
    )


def _string(attrs: object, key: str) -> str | None:
    from agent.kube import dig

    value = dig(attrs, key, "string")
    return value if isinstance(value, str) and value else None


class DraDevices:
    """This node's DRA GPU devices, kept current by a watch on its ResourceSlices."""

    def __init__(
        self,
        client: InClusterKubeClient,
        node: str,
        *,
        watch_timeout_s: float = 300.0,
        informer: Informer | None = None,
    ) -> None:
        """``informer``: the agent's shared informer of this node's ResourceSlices (every
        driver: the others are skipped here); without it one is made per `start`."""
        self._client = client
        self._query = {"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"}
        self._watch_timeout_s = watch_timeout_s
        self._lock = threading.Lock()
        self._shared = informer
        self._informer: Informer | None = None
        self._devices: dict[DeviceKey, SliceDevice] = {}
        self._listed = False
        self._handled = False
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each change of the devices (on the watch's thread)."""
        self._listeners.append(listener)

    def lookup(self) -> Mapping[DeviceKey, SliceDevice] | None:
        """The devices as of the last answer (kept while the API server does not answer); None
        until the slices were listed once (nothing can be told about a claim's device yet)."""
        return self._devices if self._listed else None

    def start(self) -> None:
        """Start watching (again after `stop`); returns at once."""
        if self._shared is not None:
            self._start_shared(self._shared)
            return
        with self._lock:
            if self._informer is not None:
                return
            from agent.kube_watch import Informer

            informer = Informer(
                self._client,
                PATH,
                self._query,
                watch_timeout_s=self._watch_timeout_s,
                on_change=lambda: self._rebuild(informer),
            )
            self._informer = informer
        informer.start()

    def _start_shared(self, shared: Informer) -> None:
        with self._lock:
            if self._informer is not None:
                return
            self._informer = shared
            first, self._handled = not self._handled, True
        if first:
            shared.add_handler(lambda: self._rebuild(shared))  # at once when already listed
        else:
            self._rebuild(shared)
        shared.start()

    def stop(self) -> None:
        with self._lock:
            informer, self._informer = self._informer, None
        if informer is not None and informer is not self._shared:
            informer.stop()  # a shared informer is the edge's to stop

    def status(self) -> tuple[bool, str]:
        """(current, detail): False with why while the devices are the last answer kept."""
        informer = self._informer
        if informer is None:
            return False, "not watching ResourceSlices"
        if informer.unserved and informer.healthy:  # no DRA API: no claim to attribute
            return True, f"ResourceSlices {informer.unserved}"
        if not informer.synced.is_set():
            return False, f"ResourceSlices not listed yet: {informer.error or 'listing'}"
        if not informer.healthy:
            return False, (
                f"ResourceSlices stale (keeping the last {len(self._devices)} device(s)): "
                f"{informer.error}"
            )
        return True, f"watching ResourceSlices: {len(self._devices)} device(s)"

    def _rebuild(self, informer: Informer) -> None:
        if informer is self._informer:  # a stopped informer's last watch changes nothing
            self._devices = slice_devices(informer.objects())
            self._listed = True
            for listener in self._listeners:
                listener()


class DraSlicesCollector(Collector):
    """``gpu_agent_dra_slices_current``: 1 while the ResourceSlice watch is current, 0 while
    attribution uses the last answer kept (the API server down or refusing)."""

    def __init__(self, devices: DraDevices) -> None:
        self._devices = devices

    def collect(self) -> Iterator[Metric]:
        current, _detail = self._devices.status()
        gauge = GaugeMetricFamily(
            "gpu_agent_dra_slices_current",
            "1 while this node's DRA ResourceSlices are watched and current; 0 while DRA claim "
            "attribution uses the last answer kept.",
        )
        gauge.add_metric([], 1.0 if current else 0.0)
        yield gauge
        count = GaugeMetricFamily(
            "gpu_agent_dra_slice_devices",
            "GPU and MIG devices of NVIDIA's DRA driver in this node's ResourceSlices.",
        )
        devices = self._devices.lookup()
        if devices is not None:  # unknown until listed once, not 0
            count.add_metric([], float(len(devices)))
        yield count


class DraReader(Reader):
    """The DRA claims reader: the claims' devices among kubelet's allocations, told apart by
    this node's ResourceSlices. Until the slices were listed once no claim's device can be
    told: the reader fails with the watch's status, and no claim is guessed. While the watch
    is stale the last slices are kept, and the reader says so (degraded, with the status); so
    it does while kubelet's List fails (``kubelet_failing``: its claims are then kubelet's last
    answer, or none once that is too old)."""

    name = "dra"
    after_attribution = False

    def __init__(
        self,
        devices: DraDevices,
        allocations: Callable[[], Iterable[Allocation]],
        kubelet_failing: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._devices = devices
        self._allocations = allocations
        self._kubelet_failing = kubelet_failing

    def read(self, frame: Frame) -> Part:
        if self._devices.lookup() is None:
            raise Degraded(self._devices.status()[1])
        current, detail = self._devices.status()
        claimed = tuple(a for a in self._allocations() if a.claim is not None)
        why = [w for w in (None if current else detail, self._kubelet_failing()) if w]
        return Part(allocations=claimed, degraded="; ".join(why) or None)
