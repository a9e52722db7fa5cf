"""DRA attribution: which GPU or MIG device a claim's device is.

kubelet's PodResources reports the DRA claims of a container in ``dynamic_resources`` by driver,
pool and device name, never by UUID. NVIDIA's DRA driver (``gpu.nvidia.com``) publishes each
device of a node in a ResourceSlice with the attributes ``type`` (``gpu`` or ``mig``) and
``uuid`` (a ``GPU-`` or ``MIG-`` UUID), as dcgm-exporter reads them. :class:`DraDevices` lists
the slices of this node (``fieldSelector=spec.nodeName``) at most every ``period_s`` and maps
(pool, device) to that UUID; the usual device-id resolution does the rest. A failed list keeps
the last answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["DRIVER", "DraDevices", "slice_devices"]

DRIVER = "gpu.nvidia.com"
#: resource.k8s.io versions tried in order (v1 is GA since Kubernetes 1.34)
_VERSIONS = ("v1", "v1beta2", "v1beta1")
_MAX_DEVICES = 4096  # bounds what a hostile or broken answer can make the agent hold

DeviceKey = tuple[str, str]  # (pool, device)
Get = Callable[[str, Mapping[str, str]], object]


def slice_devices(listing: object) -> dict[DeviceKey, str]:
    """(pool, device) -> UUID from a ResourceSliceList of any served version (v1 devices carry
    ``attributes``, v1beta1 ones ``basic.attributes``); other drivers and malformed entries are
    skipped."""
    out: dict[DeviceKey, str] = {}
    items = listing.get("items") if isinstance(listing, dict) else None
    for item in items if isinstance(items, list) else []:
        spec = item.get("spec") if isinstance(item, dict) else None
        if not isinstance(spec, dict) or spec.get("driver") != DRIVER:
            continue
        pool = _dig(spec, "pool", "name")
        devices = spec.get("devices")
        if not isinstance(pool, str) or not isinstance(devices, list):
            continue
        for device in devices:
            if len(out) >= _MAX_DEVICES:
                return out
            name = device.get("name") if isinstance(device, dict) else None
            attrs = _dig(device, "attributes") or _dig(device, "basic", "attributes")
            uuid = _dig(attrs, "uuid", "string")
            if isinstance(name, str) and isinstance(uuid, str) and uuid:
                out[(pool, name)] = uuid
    return out


def _dig(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


class DraDevices:
    """This node's DRA GPU devices from the API server, refreshed lazily."""

    def __init__(
        self,
        get: Get,
        node: str,
        period_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._get = get
        self._node = node
        self._period_s = period_s
        self._clock = clock
        self._devices: dict[DeviceKey, str] = {}
        self._read_at: float | None = None
        self._version: str | None = None

    def lookup(self) -> Mapping[DeviceKey, str]:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._period_s:
            self._read_at = now
            self._refresh()
        return self._devices

    def _refresh(self) -> None:
        query = {"fieldSelector": f"spec.nodeName={self._node}"}
        versions = (self._version,) if self._version else _VERSIONS
        for version in versions:
            try:
                listing = self._get(f"/apis/resource.k8s.io/{version}/resourceslices", query)
            except Exception as exc:  # the API server's errors: keep the last answer
                log.debug("ResourceSlices %s: %s", version, exc)
                continue
            self._devices = slice_devices(listing)
            self._version = version
            return
        if self._version is None:
            log.info("no resource.k8s.io ResourceSlices to read: DRA claims are not attributed")
