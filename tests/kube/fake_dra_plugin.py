"""A stand-in for NVIDIA's DRA driver GPU kubelet plugin on one simulated node (tests only).

It does on the API stand-in what the real plugin does on a cluster: when it starts, and each
time its pod is deleted (restarted by its DaemonSet), it reads the node's GPUs (the simulator's
state, as the plugin reads NVML) and publishes this node's ResourceSlice of ``gpu.nvidia.com``,
then runs in a new pod. Device names and attributes are the driver's (kubernetes-sigs/
dra-driver-nvidia-gpu at 9593204, cmd/gpu-kubelet-plugin): ``gpu-<minor>`` with ``type: gpu``,
``uuid``, ``productName``, ``brand``, ``architecture``, ``cudaComputeCapability``,
``driverVersion``, ``cudaDriverVersion``, ``resource.kubernetes.io/pciBusID``; a MIG device
``gpu-<minor>-mig-<profile>-<profileId>-<placementStart>`` with ``type: mig``, ``uuid``,
``parentUUID``, ``profile`` and the parent's attributes, capacity ``memorySlice<i>`` per memory
slice it holds; a GPU with MIG on publishes its MIG devices only (none: nothing). The simulator's
index stands in for the device minor.

``dynamic_mig`` publishes the DynamicMIG form instead (KEP-4815 partitionable devices): one
shared counter set ``gpu-<minor>-counter-set`` per GPU, the whole GPU and every possible MIG
placement as devices consuming from it, the MIG ones without a uuid. ``republish=False`` is a
plugin that restarts but never publishes again (stuck on start-up); ``delay_s`` is how long a
restart takes.
"""

from __future__ import annotations

import itertools
import re
import threading
from pathlib import Path
from typing import Any

from agent.gpu.models import MODELS, GpuModel, profile_name
from agent.gpu.sim import SimControl
from tests.kube.fake_api import FakeKubeApi, Pod

DRIVER = "gpu.nvidia.com"
NAMESPACE = "gpu-operator"
LABELS = {"app": "nvidia-dra-driver-kubelet-plugin"}


def _string(value: str) -> dict[str, str]:
    return {"string": value}


def _version(value: str) -> dict[str, str]:
    parts = [*value.split("."), "0", "0"][:3]
    return {"version": ".".join(str(int(p)) for p in parts)}


def _device_name(minor: int, profile: str, profile_id: int, start: int) -> str:
    """mig.go ``ToCanonicalName``: dots dropped, lower-cased, other characters to '-'."""
    pname = re.sub(r"[^a-z0-9-.]", "-", profile.replace(".", "").lower()).strip("-")
    return f"gpu-{minor}-mig-{pname}-{profile_id}-{start}"


class FakeDraPlugin:
    def __init__(
        self,
        api: FakeKubeApi,
        node: str,
        state_dir: Path,
        *,
        dynamic_mig: bool = False,
        republish: bool = True,
        delay_s: float = 0.05,
    ) -> None:
        self.api = api
        self.node = node
        self.state_dir = state_dir
        self.dynamic_mig = dynamic_mig
        self.republish = republish
        self.delay_s = delay_s
        self.restarts = 0
        self.publishes = 0
        self._generation = 0
        self._names = itertools.count()
        self._pod = ""
        self._previous = api.on_delete

    def start(self) -> FakeDraPlugin:
        self.api.on_delete = self._deleted
        self.publish()
        self._run_pod()
        return self

    def publish(self) -> list[dict[str, Any]]:
        """This node's ResourceSlice(s) from the simulated GPUs as they are now: one slice
        (static), or one per GPU with its counter set (DynamicMIG on Kubernetes 1.34: driver.go
        ``generateCombinedResourceSlices``)."""
        node = SimControl(self.state_dir).describe()
        self._generation += 1
        pools: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
        static: list[dict[str, Any]] = []
        for gpu in node["gpus"]:
            model = MODELS[gpu["model"]]
            common = self._common(gpu, model, node)
            if self.dynamic_mig:
                pools.append(
                    ([self._counter_set(gpu, model)], self._partitionable(gpu, model, common))
                )
            elif gpu["mig"]["current"]:
                static += self._mig_devices(gpu, common)
            else:
                static.append(
                    {
                        "name": f"gpu-{gpu['index']}",
                        "attributes": {
                            **common,
                            "type": _string("gpu"),
                            "uuid": _string(gpu["uuid"]),
                            "resource.kubernetes.io/pciBusID": _string(gpu["pci_bus_id"].lower()),
                        },
                        "capacity": {"memory": {"value": str(model.memory_total_bytes)}},
                    }
                )
        if not self.dynamic_mig:
            pools = [([], static)]
        self.publishes += 1
        published = []
        for n, (counters, devices) in enumerate(pools):
            spec: dict[str, Any] = {
                "driver": DRIVER,
                "nodeName": self.node,
                "pool": {
                    "name": self.node,
                    "generation": self._generation,
                    "resourceSliceCount": len(pools),
                },
                "devices": devices,
            }
            if counters:
                spec["sharedCounters"] = counters
            published.append(
                self.api.put_dra(
                    "resourceslices",
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": f"{self.node}-{DRIVER}-{n}"},
                        "spec": spec,
                    },
                )
            )
        return published

    def _common(self, gpu: dict[str, Any], model: GpuModel, node: dict[str, Any]) -> dict[str, Any]:
        major, minor = model.cuda_capability
        return {
            "productName": _string(model.name),
            "brand": _string("Nvidia"),
            "architecture": _string(model.architecture.capitalize()),
            "cudaComputeCapability": _version(f"{major}.{minor}"),
            "driverVersion": _version(str(node["driver_version"])),
            "cudaDriverVersion": _version(str(node["cuda_driver_version"])),
        }

    def _mig_devices(self, gpu: dict[str, Any], common: dict[str, Any]) -> list[dict[str, Any]]:
        devices = []
        for gi in gpu["gpu_instances"]:
            start, size = gi["placement"]["start"], gi["placement"]["size"]
            for n, ci in enumerate(gi["compute_instances"]):
                name = _device_name(gpu["index"], gi["profile"], gi["profile_id"], start)
                devices.append(
                    {
                        "name": name if n == 0 else f"{name}-{ci['id']}",
                        "attributes": {
                            **common,
                            "type": _string("mig"),
                            "uuid": _string(ci["uuid"]),
                            "parentUUID": _string(gpu["uuid"]),
                            "profile": _string(gi["profile"]),
                        },
                        "capacity": {
                            f"memorySlice{i}": {"value": "1"} for i in range(start, start + size)
                        },
                    }
                )
        return devices

    def _counter_set(self, gpu: dict[str, Any], model: GpuModel) -> dict[str, Any]:
        counters = {f"memory-slice-{i}": {"value": "1"} for i in range(model.memory_slices)}
        counters["multiprocessors"] = {"value": str(model.multiprocessor_count)}
        return {"name": f"gpu-{gpu['index']}-counter-set", "counters": counters}

    def _partitionable(
        self, gpu: dict[str, Any], model: GpuModel, common: dict[str, Any]
    ) -> list[dict[str, Any]]:
        counter_set = f"gpu-{gpu['index']}-counter-set"
        whole = {f"memory-slice-{i}": {"value": "1"} for i in range(model.memory_slices)}
        devices: list[dict[str, Any]] = [
            {
                "name": f"gpu-{gpu['index']}",
                "attributes": {**common, "type": _string("gpu"), "uuid": _string(gpu["uuid"])},
                "consumesCounters": [{"counterSet": counter_set, "counters": whole}],
            }
        ]
        for spec in model.gi_profiles[:3]:  # a few profiles: the slice stays under 128 devices
            profile = profile_name(model, spec)
            for start in spec.starts:
                used = range(start, start + spec.memory_slices)
                devices.append(
                    {
                        "name": _device_name(gpu["index"], profile, spec.id, start),
                        "attributes": {
                            **common,
                            "type": _string("mig"),
                            "parentUUID": _string(gpu["uuid"]),
                            "profile": _string(profile),
                        },
                        "consumesCounters": [
                            {
                                "counterSet": counter_set,
                                "counters": {f"memory-slice-{i}": {"value": "1"} for i in used},
                            }
                        ],
                    }
                )
        return devices

    def _run_pod(self) -> None:
        self._pod = f"nvidia-dra-driver-kubelet-plugin-{next(self._names)}"
        self.api.pods.append(Pod(NAMESPACE, self._pod, self.node, dict(LABELS)))

    def _deleted(self, namespace: str, name: str) -> None:
        self._previous(namespace, name)
        if namespace != NAMESPACE or name != self._pod:
            return
        self.restarts += 1
        # Not under the API's lock: the new pod starts a moment later, as a DaemonSet's does.
        threading.Timer(self.delay_s, self._restarted).start()

    def _restarted(self) -> None:
        with self.api.lock:
            if self.republish:
                self.publish()
            self._run_pod()
