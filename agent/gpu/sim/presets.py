"""Named simulated nodes (``gpu-agent --simulate <preset>``): which GPUs, which driver."""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import FieldViolation, InvalidSpec


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
    name: str
    description: str
    gpus: tuple[str, ...]  # model keys (agent.gpu.models.MODELS), in NVML index order
    driver_version: str  # at least every model's min_driver_version
    cuda_driver_version: int  # nvmlSystemGetCudaDriverVersion, e.g. 12040 = CUDA 12.4
    #: how the GPUs' NVLinks connect: "switch" (NVSwitch or direct links: every NVLink GPU of a
    #: model reaches every other), "pairs" (bridges 0-1, 2-3, ...) or "none"
    nvlink: str = "switch"
    host: Host = Host()

    def nvlink_peers(self, a: int, b: int) -> bool:
        """GPUs ``a`` and ``b`` reach each other over NVLink."""
        if a == b or self.nvlink == "none" or self.gpus[a] != self.gpus[b]:
            return False
        return self.nvlink == "switch" or a // 2 == b // 2


#: 2x AMD EPYC 7742 in NPS4 (16 cores per NUMA node); GPU i's node as nvidia-smi topo -m lists it
_DGX_A100_HOST = Host(numa_per_socket=4, cores_per_numa=16, gpu_numa=(3, 3, 1, 1, 7, 7, 5, 5))
#: one 72-core Grace CPU (one thread per core) per superchip, its GPU on its NUMA node
_GH200_HOST = Host(sockets=4, cores_per_numa=72, threads_per_core=1)

_PRESET_LIST = (
    Preset(
        name="dgx-a100",
        description="DGX A100: 8x A100-SXM4-40GB",
        gpus=("A100-SXM4-40GB",) * 8,
        driver_version="535.183.01",
        cuda_driver_version=12020,
        host=_DGX_A100_HOST,
    ),
    Preset(
        name="dgx-a100-80",
        description="DGX A100 80GB: 8x A100-SXM4-80GB",
        gpus=("A100-SXM4-80GB",) * 8,
        driver_version="535.183.01",
        cuda_driver_version=12020,
        host=_DGX_A100_HOST,
    ),
    Preset(
        name="a30-node",
        description="PCIe server with 4x A30 (4-slice MIG grid)",
        gpus=("A30",) * 4,
        driver_version="535.183.01",
        cuda_driver_version=12020,
        nvlink="none",  # no NVLink bridges fitted
    ),
    Preset(
        name="dgx-h100",
        description="DGX H100: 8x H100 SXM5 80GB",
        gpus=("H100-SXM5-80GB",) * 8,
        driver_version="550.90.07",
        cuda_driver_version=12040,
    ),
    Preset(
        name="h100-nvl",
        description="PCIe server with 2x H100 NVL 94GB (one NVLink-bridged pair)",
        gpus=("H100-NVL-94GB",) * 2,
        driver_version="550.90.07",
        cuda_driver_version=12040,
        nvlink="pairs",
    ),
    Preset(
        name="hgx-h200",
        description="HGX H200: 8x H200 SXM 141GB",
        gpus=("H200-SXM-141GB",) * 8,
        # H200 needs R550 (>= 550.90.07) for MIG (reference/mig.md §1.8).
        driver_version="550.90.07",
        cuda_driver_version=12040,
    ),
    Preset(
        name="gh200",
        description="4x GH200 superchip (H100 96GB HBM3) node",
        gpus=("GH200-96GB",) * 4,
        driver_version="550.90.07",
        cuda_driver_version=12040,
        host=_GH200_HOST,
    ),
    Preset(
        name="gh200-144",
        description="4x GH200 144G HBM3e superchip node",
        gpus=("GH200-144GB",) * 4,
        driver_version="550.90.07",
        cuda_driver_version=12040,
        host=_GH200_HOST,
    ),
    Preset(
        name="hgx-h20",
        description="HGX H20: 8x H20 96GB",
        gpus=("H20",) * 8,
        # H20 needs R535 (>= 535.161.07) for MIG (reference/mig.md §1.8).
        driver_version="535.161.07",
        cuda_driver_version=12020,
    ),
    Preset(
        name="dgx-b200",
        description="DGX B200: 8x B200 180GB",
        gpus=("B200",) * 8,
        # B200 needs R570 (>= 570.133.20) for MIG (reference/mig.md §1.8).
        driver_version="570.133.20",
        cuda_driver_version=12080,
    ),
    Preset(
        name="rtx-pro-6000",
        description="RTX PRO server: 8x RTX PRO 6000 Blackwell Server Edition 96GB (4-slice MIG)",
        gpus=("RTX-PRO-6000-96GB",) * 8,
        # RTX PRO 6000 Blackwell needs R575 (>= 575.51.03) for MIG (the MIG user guide).
        driver_version="575.51.03",
        cuda_driver_version=12090,
    ),
    Preset(
        name="mixed",
        description="Two models on one node: 4x A100-SXM4-80GB then 4x H100 SXM5 80GB",
        gpus=("A100-SXM4-80GB",) * 4 + ("H100-SXM5-80GB",) * 4,
        driver_version="550.90.07",
        cuda_driver_version=12040,
    ),
)

PRESETS: dict[str, Preset] = {p.name: p for p in _PRESET_LIST}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        allowed = ", ".join(PRESETS)
        raise InvalidSpec(
            f"unknown simulator preset {name!r}; allowed: {allowed}",
            [FieldViolation("preset", f"must be one of: {allowed}")],
        ) from None
