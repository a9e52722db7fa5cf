"""Which pods hold which GPUs: kubelet's PodResources v1 ``List`` over its Unix socket.

kubelet reports, per container, the device ids the device plugin allocated (reference §5), and
the DRA claims' devices by pool and device name, resolved through this node's ResourceSlices
(``dra.py``) to a UUID or, for a DynamicMIG device, to its parent GPU, GI profile and placement,
which the attribution stage matches against the MIG instances NVML reports. Every
id form is understood: ``GPU-<uuid>``, ``MIG-<uuid>``, the legacy ``MIG-GPU-<uuid>/<gi>/<ci>``,
GKE's ``nvidia<N>[/gi<G>][/vgpu<k>]``, each optionally with a time-slicing / MPS replica suffix
``::<n>``. A device held by several containers (replicas of a shared GPU) maps to all of them,
sorted, so label sets are stable and never "last writer wins".

:class:`PodWatcher` calls ``List`` on its own thread and cadence (kubelet rate-limits the API) and
keeps the last good answer when a call fails, so pod labels do not flap with kubelet restarts;
only for a while (``KEEP_LIST_PERIODS``, ``KEEP_MIN_S``): a pod deleted meanwhile must not keep
its GPU's labels and a 0-byte row for as long as kubelet stays down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import grpc

from agent._proto.k8s.podresources.v1 import api_pb2, api_pb2_grpc
from agent.safeyaml import capped
from agent.telemetry.allocation import Allocation, DeviceId, parse_device_id
from agent.telemetry.dra import DRIVER as DRA_DRIVER
from agent.telemetry.dra import DeviceKey, DraDevices, SliceDevice
from agent.telemetry.reader import Degraded, Frame, Part, Reader
from agent.telemetry.snapshot import DraClaim, PodRef
from agent.telemetry.stats import TelemetryStats

log = logging.getLogger(__name__)

__all__ = [
    "KEEP_LIST_PERIODS",
    "KEEP_MIN_S",
    "PodResourcesClient",
    "PodWatcher",
    "PodsReader",
    "UnresolvedClaims",
]

_RESOURCE_PREFIX = "nvidia.com/"
#: How a GPU or MIG id of ours begins: one that does not parse is malformed, not foreign (an
#: RDMA device's ``mlx5_0`` under ``nvidia.com/rdma_shared_device_a`` is foreign)
_OURS = ("GPU-", "MIG-", "nvidia")
#: Malformed ids kept to say once: a few, each cut short
_SAID_IDS, _SAID_ID_CHARS = 3, 80
#: While List fails, its last answer is served for this many List periods, and at least
#: KEEP_MIN_S (a kubelet restart, so labels do not flap); then no pod is attributed
KEEP_LIST_PERIODS = 3
KEEP_MIN_S = 30.0


class PodResourcesClient:
    """``v1.PodResourcesLister/List`` over kubelet's Unix socket."""

    def __init__(self, socket: Path, timeout_s: float = 10.0) -> None:
        self._socket = socket
        self._timeout_s = timeout_s
        self._channel: grpc.Channel | None = None

    def list(
        self,
        dra: Mapping[DeviceKey, SliceDevice] | None = None,
        malformed: list[str] | None = None,
    ) -> tuple[Allocation, ...]:
        """GPU allocations of all active pods, DRA claims' devices looked up in ``dra`` ((pool,
        device) -> the slice's device); with no slices known (None: no API server, or not
        listed yet) DRA claims are left out. A device id that looks like a GPU's or MIG
        device's but is none is skipped and appended to ``malformed``. Raises grpc.RpcError
        when kubelet fails."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self._socket}")
        stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout_s)
        return tuple(_allocations(response, dra, [] if malformed is None else malformed))

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _allocations(
    response: api_pb2.ListPodResourcesResponse,
    dra: Mapping[DeviceKey, SliceDevice] | None,
    malformed: list[str],
) -> Iterable[Allocation]:
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                if not devices.resource_name.startswith(_RESOURCE_PREFIX):
                    continue
                for raw in devices.device_ids:
                    parsed = parse_device_id(raw)
                    if parsed is not None:
                        yield Allocation(ref, devices.resource_name, parsed)
                    elif raw.startswith(_OURS):
                        malformed.append(raw)
            # DRA claims (kubelet's KubeletPodResourcesDynamicResources): by pool and device name.
            if dra is None:
                continue  # no slices known: a claim's device cannot be told yet
            for claim in container.dynamic_resources:
                for res in claim.claim_resources:
                    if res.driver_name != DRA_DRIVER:
                        continue
                    device = dra.get((res.pool_name, res.device_name))
                    mig = device is not None and device.kind == "mig"
                    ref_claim = DraClaim(
                        claim.claim_name,
                        claim.claim_namespace,
                        res.driver_name,
                        res.pool_name,
                        res.device_name,
                        mig_profile=device.profile if mig and device else None,
                        mig_device_uuid=device.uuid if mig and device else None,
                    )
                    claim_ref = f"{claim.claim_namespace}/{claim.claim_name}"
                    parsed = _dra_device_id(device) if device is not None else None
                    yield Allocation(ref, f"dra:{claim_ref}", parsed, ref_claim)


def _dra_device_id(device: SliceDevice) -> DeviceId | None:
    """How attribution finds a DRA device: by the slice's UUID, else (a DynamicMIG device, made
    when its claim was prepared) by parent, GI profile id and placement start."""
    if device.uuid is not None:
        parsed = parse_device_id(device.uuid)
        return parsed if parsed is not None and parsed.replica is None else None
    if device.profile_id is None or device.placement_start is None:
        return None  # a MIG device with neither a UUID nor the driver's canonical name
    return DeviceId(
        gpu_uuid=device.parent_uuid,
        minor=device.parent_minor,
        profile_id=device.profile_id,
        placement_start=device.placement_start,
    )


class PodWatcher:
    """Refreshes allocations every ``period_s`` on a daemon thread; :meth:`current` is lock-free.

    A missing socket turns attribution off with one log line and no errors. In a cluster
    (``in_cluster``) the directory is not mounted, and :meth:`absent` says so; outside one no
    kubelet runs and no pod holds a GPU, so nothing is missing (doctor's pod-resources rule).
    A failing kubelet keeps the last good answer, counts ``kubelet`` errors and says so
    (:meth:`failing`), so the pods source reports itself degraded; once that answer is older
    than ``keep_s`` (default: ``KEEP_LIST_PERIODS`` periods, at least ``KEEP_MIN_S``) it is
    dropped and no pod is attributed until kubelet answers.
    """

    def __init__(
        self,
        client: PodResourcesClient,
        socket: Path,
        period_s: float,
        stats: TelemetryStats,
        dra: DraDevices | None = None,
        *,
        in_cluster: bool = True,
        keep_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._in_cluster = in_cluster
        self._dra = dra
        self._socket = socket
        self._period_s = period_s
        self._keep_s = max(KEEP_LIST_PERIODS * period_s, KEEP_MIN_S) if keep_s is None else keep_s
        self._clock = clock
        self._stats = stats
        self._current: tuple[Allocation, ...] = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said_missing = False
        #: why the latest List failed (None once one succeeds); when (``clock``) the answer
        #: served was listed, None while none is
        self._failing: str | None = None
        self._answered_at: float | None = None
        #: the malformed device ids of the latest answer, said once while they stay
        self._malformed: frozenset[str] = frozenset()

    def current(self) -> tuple[Allocation, ...]:
        return self._current

    def absent(self) -> str | None:
        """Why kubelet cannot be asked at all (no socket in a cluster); None while it can, or
        outside a cluster, where there are no pods to ask about."""
        if not (self._said_missing and self._in_cluster):
            return None
        return f"no kubelet pod-resources socket at {self._socket}"

    def failing(self) -> str | None:
        """Why kubelet's latest List failed, and what is served meanwhile; None while it
        answers. Kept stable (the gRPC code, not kubelet's text): it is a label value."""
        return self._failing

    def refresh(self) -> None:
        """One List call; the thread calls this every period."""
        if not self._socket.exists():
            if not self._said_missing:
                why = "pods not attributed" if self._in_cluster else "not in a cluster: no pods"
                log.info("no kubelet pod-resources socket at %s: %s", self._socket, why)
                self._said_missing = True
            self._current, self._answered_at = (), None
            return
        self._said_missing = False
        started = time.monotonic()
        listed_at = self._clock()
        malformed: list[str] = []
        try:
            self._current = self._client.list(self._dra.lookup() if self._dra else None, malformed)
            self._stats.observe_source("kubelet", time.monotonic() - started)
            self._failing, self._answered_at = None, listed_at
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            kept = self._failed(code.name if code else "error")
            log.warning("kubelet pod-resources List failed (%s): %s", kept, _rpc_text(exc))
        except Exception as exc:  # anything else (an answer not read, a bug): as kubelet's
            kept = self._failed(type(exc).__name__)
            log.exception("kubelet pod-resources List failed (%s)", kept)
        else:
            self._say_malformed(malformed)

    def _failed(self, why: str) -> str:
        """The latest List failed: the last answer is served, said to be no longer current,
        while it is at most ``keep_s`` old; after that nothing is. Returns what is served."""
        self._stats.error("kubelet")
        if self._answered_at is None:
            kept = "pods not attributed yet"
        elif self._clock() - self._answered_at <= self._keep_s:
            kept = "pods as of its last answer"
        else:
            self._current = ()
            kept = f"pods not attributed: its last answer is over {self._keep_s:g} s old"
        self._failing = f"kubelet pod-resources List failed ({why}): {kept}"
        return kept

    def _say_malformed(self, malformed: list[str]) -> None:
        """Count the answer's malformed ids (``kubelet_device_id``); log them when they change."""
        if malformed:
            self._stats.error("kubelet_device_id", len(malformed))
        ids = frozenset(malformed)
        if ids and ids != self._malformed:
            shown = ", ".join(repr(capped(i, _SAID_ID_CHARS)) for i in sorted(ids)[:_SAID_IDS])
            log.warning(
                "kubelet pod-resources: %d device ids of nvidia.com/ resources are no GPU or "
                "MIG id, skipped (their pods are not attributed): %s%s",
                len(ids),
                shown,
                ", ..." if len(ids) > _SAID_IDS else "",
            )
        self._malformed = ids

    def start(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="gpu-agent-pods", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._client.close()

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self.refresh()


class PodsReader(Reader):
    """The kubelet pod-resources reader: the device plugin's allocations from the watcher's
    latest List (the last good answer while kubelet fails). With no socket in a cluster, nobody
    can tell who holds what: the reader fails, saying so, and GPU series carry no pod. Outside a
    cluster no pod holds a GPU, and the reader says just that. While kubelet's List fails,
    the reader serves its last answer (labels do not flap) and is reported degraded; once that
    answer is too old to be served (``PodWatcher``), it serves none, still degraded."""

    name = "pods"
    after_attribution = False

    def __init__(self, watcher: PodWatcher) -> None:
        self._watcher = watcher

    def read(self, frame: Frame) -> Part:
        absent = self._watcher.absent()
        if absent is not None:
            raise Degraded(absent)
        allocations = tuple(a for a in self._watcher.current() if a.claim is None)
        return Part(allocations=allocations, degraded=self._watcher.failing())


def _rpc_text(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return f"{code.name if code else 'error'}: {details}"


class UnresolvedClaims:
    """Counts (``dra_unresolved``) and logs each DRA claim's device that matches nothing on
    this node once, while it stays unresolved: it is left unattributed, never guessed."""

    def __init__(self, stats: TelemetryStats) -> None:
        self._stats = stats
        self._seen: set[tuple[str, ...]] = set()

    def report(self, now: Mapping[tuple[str, ...], Allocation]) -> None:
        for key, allocation in now.items():
            if key in self._seen:
                continue
            self._stats.error("dra_unresolved")
            claim = allocation.claim
            assert claim is not None
            why = (
                "not a GPU or MIG device in this node's ResourceSlices"
                if allocation.device is None
                else f"no GPU or MIG instance of this node is {describe(allocation.device)}"
            )
            log.warning(
                "DRA claim %s/%s device %s/%s (pod %s/%s) is left unattributed: %s",
                claim.namespace,
                claim.name,
                claim.pool,
                claim.device,
                allocation.pod.namespace,
                allocation.pod.name,
                why,
            )
        self._seen = set(now)


def describe(device: DeviceId) -> str:
    """A DRA device as a log line names it."""
    if device.profile_id is not None:
        return (
            f"GPU {device.gpu_uuid or ''} (minor {device.minor}) GI profile {device.profile_id} "
            f"at placement {device.placement_start}"
        )
    return device.uuid or device.gpu_uuid or f"nvidia{device.minor}"
