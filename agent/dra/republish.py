"""Static MIG under DRA: make the DRA driver publish a new layout, and check that it did.

NVIDIA's DRA driver discovers MIG devices once, when its GPU kubelet plugin starts; "if you
make a manual change to a node's GPU or MIG configuration ... you must restart the GPU kubelet
plugin for the changes to take effect in the resource pool" (dra-driver-nvidia-gpu,
site/content/docs/concepts/gpu-allocation.md). So after a MIG apply on a ``dra`` node the agent
deletes this node's kubelet plugin pod (its DaemonSet makes a new one: the documented restart,
the same call sharing's restart-pod reload makes) and waits until this node's ResourceSlices of
the driver list exactly the devices NVML reports after the apply: the MIG devices' uuids on a
GPU with MIG on, the GPU's own uuid on a GPU with MIG off (`expected_uuids`). A GPU with MIG on
and no instance publishes nothing (the driver's "stranded" GPU). Only the GPUs NVML read are
compared (`Expected`): a listed device of a GPU that is lost or cannot be read (its own uuid, or
its ``parentUUID`` for a MIG device) is not looked at, as NVML says nothing of what it holds.

The wait is bounded (``dra.republish_timeout_s``); past it, or with no plugin pod to restart,
`Republisher.republish` raises Conflict saying what the slices list, and the MIG service rolls
the layout back as for any failed apply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent import safeyaml
from agent.dra.slices import DriverSlices, PublishedDevice
from agent.dra.watch import AllocationWatch
from agent.errors import AgentError, Conflict
from agent.gpu.types import GpuInfo, GpuLayout
from agent.kube import KubeClient

__all__ = ["Expected", "Republisher", "expected_uuids"]

log = logging.getLogger(__name__)

#: How often the wait says where it is (the operation's progress), at most.
PROGRESS_S = 1.0
#: Names listed in an error at most.
_SHOWN = 6


def expected_uuids(layouts: Sequence[GpuLayout]) -> tuple[str, ...]:
    """The uuids the driver publishes for these layouts, sorted."""
    found: list[str] = []
    for layout in layouts:
        mode = layout.gpu.mig_mode
        if mode is not None and mode.current:
            found += [ci.uuid for gi in layout.instances for ci in gi.compute_instances if ci.uuid]
        else:
            found.append(layout.gpu.uuid)
    return tuple(sorted(found))


@dataclass(frozen=True, slots=True)
class Expected:
    """What the driver is to list after a change: the devices (``uuids``) of the GPUs NVML
    read, and which listed devices are compared with them. A device of a GPU not read (lost,
    or failing a read: ``not_read``) is not: what it holds is unknown. It is told by its own
    uuid or its ``parentUUID``; when such a GPU's uuid is unknown too (not read since this
    process started), only the devices of the GPUs read (``read``) are compared."""

    uuids: tuple[str, ...]
    read: frozenset[str] = frozenset()
    #: the GPUs not read
    not_read: tuple[GpuInfo, ...] = ()

    @classmethod
    def of(cls, layouts: Sequence[GpuLayout], not_read: Sequence[GpuInfo] = ()) -> Expected:
        read = frozenset(layout.gpu.uuid for layout in layouts)
        return cls(expected_uuids(layouts), read, tuple(not_read))

    def compared(self, device: PublishedDevice) -> bool:
        """Whether a listed device is compared: not one of a GPU that was not read."""
        owner = device.parent or device.uuid
        if owner in self.read or not self.not_read:
            return True
        gone = {g.uuid for g in self.not_read}
        return owner not in gone and "" not in gone

    def listed(self, slices: DriverSlices) -> tuple[str, ...]:
        """The uuids the slices list that are compared, sorted."""
        return tuple(sorted(d.uuid for d in slices.devices if d.uuid and self.compared(d)))

    def left_out(self) -> str:
        """`` (GPU 7 not read: its devices are not compared)``, or ""."""
        if not self.not_read:
            return ""
        gpus = ", ".join(str(g.index) for g in self.not_read)
        return f" (GPU {gpus} not read: its devices are not compared)"


class Republisher:
    def __init__(
        self,
        kube: KubeClient,
        watch: AllocationWatch,
        *,
        namespace: str,
        label_selector: str,
        timeout_s: float,
    ) -> None:
        self._kube = kube
        self._watch = watch
        self._namespace = namespace
        self._selector = label_selector
        self.timeout_s = timeout_s

    def check(self) -> None:
        """Before a change: this node's kubelet plugin pod is there and may be deleted (a
        dry-run delete, which the API server authorizes as a real one). Conflict saying why
        not: the change would be applied, then rolled back when the restart fails."""
        try:
            pods = self._kube.delete_pods(
                self._namespace, self._selector, self._watch.node, dry_run=True
            )
        except AgentError as exc:
            raise Conflict(
                f"the DRA driver's kubelet plugin could not be restarted after the change "
                f"({self._where()}; check dra.plugin_namespace and dra.plugin_label_selector, "
                f"and the agent's Role there): {exc}; nothing was changed"
            ) from exc
        if not pods:
            raise Conflict(
                f"no DRA kubelet plugin pod on this node matched {self._where()}: nothing would "
                f"make {self._watch.driver} republish its ResourceSlices (check "
                "dra.plugin_namespace and dra.plugin_label_selector); nothing was changed"
            )

    def restart(self) -> tuple[str, ...]:
        """Delete this node's kubelet plugin pod(s); Conflict when none matched."""
        try:
            deleted = self._kube.delete_pods(self._namespace, self._selector, self._watch.node)
        except AgentError as exc:
            raise Conflict(
                f"could not restart the DRA driver's kubelet plugin ({self._where()}): {exc}"
            ) from exc
        if not deleted:
            raise Conflict(
                f"no DRA kubelet plugin pod on this node matched {self._where()}: nothing makes "
                f"{self._watch.driver} republish its ResourceSlices (check dra.plugin_namespace "
                "and dra.plugin_label_selector)"
            )
        return deleted

    def republish(self, expected: Expected, progress: Callable[[str], None]) -> None:
        """Restart the plugin, then wait until the slices list exactly ``expected`` (of the
        GPUs read: `Expected`)."""
        want, aside = expected.uuids, expected.left_out()
        changes = self._watch.slice_changes
        pods = self.restart()
        progress(
            f"restarted the DRA kubelet plugin ({', '.join(pods)}); waiting up to "
            f"{self.timeout_s:.0f}s for the ResourceSlices of {self._watch.driver} to list "
            f"{len(want)} device(s){aside}"
        )
        deadline = time.monotonic() + self.timeout_s
        said = time.monotonic()
        while True:
            now = self._watch.slices()
            listed = expected.listed(now) if now is not None else None
            if self._watch.slice_changes > changes and listed == want:
                log.info("%s republished %d device(s) on this node", self._watch.driver, len(want))
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise Conflict(self._why(want, listed) + aside)
            self._watch.wait(self._watch.slice_changes, min(left, PROGRESS_S))
            if time.monotonic() - said >= PROGRESS_S:
                said = time.monotonic()
                found = len(set(listed or ()) & set(want))
                progress(
                    f"waiting for the ResourceSlices of {self._watch.driver}: {found} of the "
                    f"{len(want)} device(s) NVML has listed{aside}"
                )

    def _why(self, want: tuple[str, ...], listed: tuple[str, ...] | None) -> str:
        head = (
            f"the DRA driver {self._watch.driver} did not republish the new layout within "
            f"{self.timeout_s:g}s (dra.republish_timeout_s)"
        )
        if listed is None:
            return f"{head}: its ResourceSlices on this node could not be read"
        missing = sorted(set(want) - set(listed))
        extra = sorted(set(listed) - set(want))
        parts = []
        if missing:
            parts.append(f"{len(missing)} new device(s) not listed ({_some(missing)})")
        if extra:
            parts.append(f"{len(extra)} device(s) listed that NVML no longer has ({_some(extra)})")
        if not parts:
            parts.append("its ResourceSlices did not change after the kubelet plugin restart")
        return f"{head}: {'; '.join(parts)}"

    def _where(self) -> str:
        return f"namespace {self._namespace}, selector {self._selector}"


def _some(names: Sequence[str]) -> str:
    return safeyaml.some(names, _SHOWN)
