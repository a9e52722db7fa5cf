"""Named simulated nodes (``gpu-agent --simulate <preset>``): a node shape (agent.gpu.shapes) and
the driver, NVLink and CPUs the simulator gives it."""

from __future__ import annotations

from dataclasses import dataclass

from agent.gpu.shapes import SHAPES, NodeShape, get_shape


@dataclass(frozen=True, slots=True)
class Host:
    """The CPUs and NUMA nodes around the GPUs (nvmlDeviceGetCpuAffinity/MemoryAffinity).

    Logical CPUs are numbered as Linux numbers them: each NUMA node's cores in order, then the
    second hardware thread of every core in the same order."""

    sockets: int = 2
    numa_per_socket: int = 1
    cores_per_numa: int = 56
    threads_per_core: int = 2
    #: each GPU's NUMA node, in NVML index order; None: GPUs split evenly, in index order
    gpu_numa: tuple[int, ...] | None = None

    @property
    def numa_nodes(self) -> int:
        return self.sockets * self.numa_per_socket

    def numa_of(self, gpu: int, gpus: int) -> int:
        if self.gpu_numa is not None:
            return self.gpu_numa[gpu]
        return gpu * self.numa_nodes // gpus

    def cpus(self, numa: int) -> list[int]:
        cores = self.numa_nodes * self.cores_per_numa
        first = numa * self.cores_per_numa
        return [
            t * cores + first + c
            for t in range(self.threads_per_core)
            for c in range(self.cores_per_numa)
        ]

    def socket_numa(self, numa: int) -> list[int]:
        first = numa // self.numa_per_socket * self.numa_per_socket
        return list(range(first, first + self.numa_per_socket))


@dataclass(frozen=True, slots=True)
class Preset:
    """A simulated node: a node shape (its GPUs) and how the simulator runs it."""

    shape: NodeShape
    driver_version: str  # at least every model's min_driver_version
    cuda_driver_version: int  # nvmlSystemGetCudaDriverVersion, e.g. 12040 = CUDA 12.4
    #: how the GPUs' NVLinks connect: "switch" (NVSwitch or direct links: every NVLink GPU of a
    #: model reaches every other), "pairs" (bridges 0-1, 2-3, ...) or "none"
    nvlink: str = "switch"
    host: Host = Host()

    @property
    def name(self) -> str:
        return self.shape.name

    @property
    def description(self) -> str:
        return self.shape.description

    @property
    def gpus(self) -> tuple[str, ...]:
        """Model keys (agent.gpu.models.MODELS), in NVML index order."""
        return self.shape.gpus

    def nvlink_peers(self, a: int, b: int) -> bool:
        """GPUs ``a`` and ``b`` reach each other over NVLink."""
        if a == b or self.nvlink == "none" or self.gpus[a] != self.gpus[b]:
            return False
        return self.nvlink == "switch" or a // 2 == b // 2


#: 2x AMD EPYC 7742 in NPS4 (16 cores per NUMA node); GPU i's node as nvidia-smi topo -m lists it
_DGX_A100_HOST = Host(numa_per_socket=4, cores_per_numa=16, gpu_numa=(3, 3, 1, 1, 7, 7, 5, 5))
#: one 72-core Grace CPU (one thread per core) per superchip, its GPU on its NUMA node
_GH200_HOST = Host(sockets=4, cores_per_numa=72, threads_per_core=1)

# Each driver is at least its models' minimum for MIG (reference/mig.md §1.8): H20 needs R535
# (>= 535.161.07), H200 R550 (>= 550.90.07), B200 R570 (>= 570.133.20), and the RTX PRO 6000
# Blackwell R575 (>= 575.51.03, the MIG user guide).
_PRESET_LIST = (
    # shape, driver, CUDA driver version; NVLink and host where not the default
    Preset(SHAPES["dgx-a100"], "535.183.01", 12020, host=_DGX_A100_HOST),
    Preset(SHAPES["dgx-a100-80"], "535.183.01", 12020, host=_DGX_A100_HOST),
    Preset(SHAPES["a30-node"], "535.183.01", 12020, nvlink="none"),  # no NVLink bridges fitted
    Preset(SHAPES["dgx-h100"], "550.90.07", 12040),
    Preset(SHAPES["h100-nvl"], "550.90.07", 12040, nvlink="pairs"),
    Preset(SHAPES["hgx-h200"], "550.90.07", 12040),
    Preset(SHAPES["gh200"], "550.90.07", 12040, host=_GH200_HOST),
    Preset(SHAPES["gh200-144"], "550.90.07", 12040, host=_GH200_HOST),
    Preset(SHAPES["hgx-h20"], "535.161.07", 12020),
    Preset(SHAPES["dgx-b200"], "570.133.20", 12080),
    Preset(SHAPES["rtx-pro-6000"], "575.51.03", 12090),
    Preset(SHAPES["mixed"], "550.90.07", 12040),
)

PRESETS: dict[str, Preset] = {p.name: p for p in _PRESET_LIST}


def get_preset(name: str) -> Preset:
    get_shape(name)  # an unknown name is refused naming the shapes there are
    return PRESETS[name]
