"""GPU models and their MIG profile tables: product data, no driver behaviour.

One source for everything that must know a board without asking its driver: the coordinator's
catalog (profiles of a GPU whose MIG is off, so its driver lists none) and the simulated driver
(``agent.gpu.sim``), which pretends to be these boards. The real driver path never reads it:
on hardware the agent asks NVML.

Every MIG number comes from reference/mig.md §1.3 (profile tables) and §1.4 (placements), or,
for the boards added later, from the sources cited above each table; the tests in
tests/unit/sim/test_models.py pin each table. Device-level numbers the sources do not give
(clocks, power, subsystem ids) are plausible, illustrative values the simulator alone uses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pynvml

from agent.gpu.profiles import profile_name as _profile_name

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True, slots=True)
class GiProfileSpec:
    """One GPU-instance profile as NVML's profile-info query reports it (mig.md §1.2-1.3)."""

    constant: int  # NVML_GPU_INSTANCE_PROFILE_* value passed to the info query
    id: int  # profile ID that create / placement / listing calls take
    attrs: str  # "", or a name suffix: "+me", "+me.all", "+gfx", "-me"
    slice_count: int  # compute slices G
    memory_slices: int  # placement size, not slice_count (3g -> 4, 7g -> 8, 1g REV2 -> 2)
    instance_count: int
    memory_mb: int  # memorySizeMB (MiB)
    multiprocessor_count: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    starts: tuple[int, ...]  # valid placement starts, in memory slices


@dataclass(frozen=True, slots=True)
class CiProfileSpec:
    """A compute-instance profile inside a GI (mig.md §1.6)."""

    constant: int  # NVML_COMPUTE_INSTANCE_PROFILE_*; on hardware the CI profile id equals it
    id: int
    slice_count: int  # compute slices C
    instance_count: int
    multiprocessor_count: int
    starts: tuple[int, ...]  # placement starts in compute slices inside the GI


# CI profiles the simulator offers, by compute slices C (mig.md §1.2: CI id == constant).
# Hopper's 1c REV1 (id 7, only in a 2g GI) is left out.
_CI_CONSTANTS: dict[int, int] = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}

_ARCH_CODES: dict[str, int] = {
    "ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
    "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
    "blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL,
}


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    name: str  # what nvmlDeviceGetName returns
    architecture: str  # "ampere" | "hopper" | "blackwell"
    cuda_capability: tuple[int, int]
    pci_device_id: int  # packed device << 16 | vendor, as mig-parted's device-filter matches it
    pci_subsystem_id: int  # packed subsystem << 16 | vendor; illustrative
    memory_total_bytes: int  # nvmlDeviceGetMemoryInfo().total; profile names depend on it
    multiprocessor_count: int  # whole GPU, MIG off
    memory_slices: int
    compute_slices: int
    gi_profiles: tuple[GiProfileSpec, ...]
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    #: default (and, on these boards, maximum) power management limit
    power_limit_w: int
    idle_power_w: int
    #: lowest power management limit the driver accepts (nvidia-smi's "Min Power Limit")
    min_power_limit_w: int
    nvlink_links: int
    pcie_generation: int
    pcie_width: int
    min_driver_version: str  # mig.md §1.8 (guide v620) minimum driver for MIG on this model
    hbm: bool = True  # HBM memory (a memory temperature sensor); False for GDDR boards

    @property
    def arch_code(self) -> int:
        """The NVML_DEVICE_ARCH_* value nvmlDeviceGetArchitecture returns."""
        return _ARCH_CODES[self.architecture]

    @property
    def gpm_supported(self) -> bool:
        # GPM (GPU performance monitoring) exists from Hopper on (nvitop gates it on the arch).
        return self.architecture != "ampere"

    def gi_profile_by_constant(self, constant: int) -> GiProfileSpec | None:
        return next((p for p in self.gi_profiles if p.constant == constant), None)

    def gi_profile_by_id(self, profile_id: int) -> GiProfileSpec | None:
        return next((p for p in self.gi_profiles if p.id == profile_id), None)

    def ci_profiles(self, gi: GiProfileSpec) -> tuple[CiProfileSpec, ...]:
        """CI profiles inside a GI of profile ``gi`` (mig.md §1.6).

        go-nvlib's rule: C <= G, and C == G or 2*C <= G+1. Placements start at multiples of C.
        SMs are ``gi SMs * C // G``: an approximation (exact when C == G); real drivers report
        per-profile values that need not be proportional.
        """
        g = gi.slice_count
        return tuple(
            CiProfileSpec(
                constant=constant,
                id=constant,
                slice_count=c,
                instance_count=g // c,
                multiprocessor_count=gi.multiprocessor_count * c // g,
                starts=tuple(range(0, g - c + 1, c)),
            )
            for c, constant in _CI_CONSTANTS.items()
            if c <= g and (c == g or 2 * c <= g + 1)
        )


def model_key(name: str) -> str:
    """A GPU product name as matched: case-insensitive, the ``NVIDIA`` prefix optional."""
    key = " ".join(name.split()).casefold()
    return key.removeprefix("nvidia ")


def profile_name(model: GpuModel, gi: GiProfileSpec, ci_slices: int | None = None) -> str:
    """The profile name this model's numbers give, e.g. ``3g.71gb`` or ``1c.3g.20gb``."""
    total = model.memory_total_bytes
    return _profile_name(gi.slice_count, gi.memory_mb, total, gi.attrs, ci_slices)


def _gi(
    constant: int,
    profile_id: int,
    attrs: str,
    g: int,
    m: int,
    count: int,
    memory_mb: int,
    sm: int,
    ce: int,
    dec: int,
    jpg: int,
    ofa: int,
    starts: tuple[int, ...],
    enc: int = 0,
) -> GiProfileSpec:
    """A table row in the reference's column order; NVENC is 0 except where a row gives it."""
    return GiProfileSpec(
        constant=constant,
        id=profile_id,
        attrs=attrs,
        slice_count=g,
        memory_slices=m,
        instance_count=count,
        memory_mb=memory_mb,
        multiprocessor_count=sm,
        copy_engines=ce,
        decoders=dec,
        encoders=enc,
        jpegs=jpg,
        ofas=ofa,
        starts=starts,
    )


def _with_memory(base: tuple[GiProfileSpec, ...], *mib: int) -> tuple[GiProfileSpec, ...]:
    """``base``'s rows on a board of another memory size: the same profiles, SMs and engines, with
    the MiB of a GI of 1, 2, 4 and 8 memory slices (a GI's memory follows its memory slices)."""
    by_slices = dict(zip((1, 2, 4, 8), mib, strict=True))
    return tuple(replace(p, memory_mb=by_slices[p.memory_slices]) for p in base)


_P1 = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
_P1_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
_P1_2M = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2  # 1g with twice the memory
_P2 = pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE
_P2_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
_P3 = pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
_P4 = pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE
_P7 = pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
_P1_GFX = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
_P2_GFX = pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX
_P4_GFX = pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX
_P1_NO_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME
_P2_NO_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME
_P1_ALL_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME
_P2_ALL_ME = pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME

# Valid starts on the 8-memory-slice grid (mig.md §1.4) and the 4-slice A30 grid.
_S_1G = (0, 1, 2, 3, 4, 5, 6)
_S_1G_2M = (0, 2, 4, 6)
_S_2G = (0, 2, 4)
_S_3G = (0, 4)
_S_ZERO = (0,)
_S_A30_1G = (0, 1, 2, 3)
_S_A30_2G = (0, 2)

# Memory the tables give only as nvidia-smi's two-decimal GiB is taken as the nearest 32 MiB
# multiple, e.g. 19.62 GiB -> 20096 MiB (19.625 GiB).

# mig.md §1.3 "A100-SXM4-40GB"; MiB values as given there (go-nvml a100 mock). 3g/4g "19.5-19.6"
# GiB -> 19968 MiB (19.5 GiB, also the mock's value).
# fmt: off
_A100_40GB_PROFILES = (
    #   const   id  attrs  G  M  max  MiB    SM  CE DEC JPG OFA starts
    _gi(_P1,    19, "",    1, 1, 7,   4864,  14, 1, 0,  0,  0,  _S_1G),
    _gi(_P1_ME, 20, "+me", 1, 1, 1,   4864,  14, 1, 1,  1,  1,  _S_1G),
    _gi(_P1_2M, 15, "",    1, 2, 4,   9856,  14, 1, 1,  0,  0,  _S_1G_2M),
    _gi(_P2,    14, "",    2, 2, 3,   9856,  28, 2, 1,  0,  0,  _S_2G),
    _gi(_P3,     9, "",    3, 4, 2,   19968, 42, 3, 2,  0,  0,  _S_3G),
    _gi(_P4,     5, "",    4, 4, 1,   19968, 56, 4, 2,  0,  0,  _S_ZERO),
    _gi(_P7,     0, "",    7, 8, 1,   40192, 98, 7, 5,  1,  1,  _S_ZERO),
)

# mig.md §1.3 "A100-80GB": GiB x 1024; 7g 80384 MiB from the go-nvml mock. The table has no
# DEC/JPG/OFA columns: the 40GB values are used (assumed per reference: "same grid").
_A100_80GB_PROFILES = _with_memory(_A100_40GB_PROFILES, 9728, 19968, 40192, 80384)

# mig.md §1.3 "A30-24GB" (4 memory / 4 compute slices) and §1.4 A30 grid. 5.81 -> 5952,
# 11.69 -> 11968, 4g "23.44-23.5" -> 24000 (23.4375 GiB). 2g+me starts assumed per reference.
_A30_PROFILES = (
    #   const   id  attrs  G  M  max  MiB    SM  CE DEC JPG OFA starts
    _gi(_P1,    14, "",    1, 1, 4,   5952,  14, 1, 0,  0,  0,  _S_A30_1G),
    _gi(_P1_ME, 21, "+me", 1, 1, 1,   5952,  14, 1, 1,  1,  1,  _S_A30_1G),
    _gi(_P2,     5, "",    2, 2, 2,   11968, 28, 2, 2,  0,  0,  _S_A30_2G),
    _gi(_P2_ME,  6, "+me", 2, 2, 1,   11968, 28, 2, 2,  1,  1,  _S_A30_2G),
    _gi(_P4,     0, "",    4, 4, 1,   24000, 56, 4, 4,  1,  1,  _S_ZERO),
)

# mig.md §1.3 "H100 80GB": 9.75 -> 9984, 19.62 -> 20096, 39.5 -> 40448, 79.25 -> 81152 MiB.
_H100_80GB_PROFILES = (
    #   const   id  attrs  G  M  max  MiB    SM   CE DEC JPG OFA starts
    _gi(_P1,    19, "",    1, 1, 7,   9984,  16,  1, 1,  1,  0,  _S_1G),
    _gi(_P1_ME, 20, "+me", 1, 1, 1,   9984,  16,  1, 1,  1,  1,  _S_1G),
    _gi(_P1_2M, 15, "",    1, 2, 4,   20096, 26,  1, 1,  1,  0,  _S_1G_2M),
    _gi(_P2,    14, "",    2, 2, 3,   20096, 32,  2, 2,  2,  0,  _S_2G),
    _gi(_P3,     9, "",    3, 4, 2,   40448, 60,  3, 3,  3,  0,  _S_3G),
    _gi(_P4,     5, "",    4, 4, 1,   40448, 64,  4, 4,  4,  0,  _S_ZERO),
    _gi(_P7,     0, "",    7, 8, 1,   81152, 132, 8, 7,  7,  1,  _S_ZERO),
)

# mig.md §1.3 "H100 94GB" (NVL; starts measured with -lgipp): 10.75 -> 11008,
# 21.62 -> 22144, 46.38 -> 47488, 93.12 -> 95360 MiB.
_H100_NVL_PROFILES = _with_memory(_H100_80GB_PROFILES, 11008, 22144, 47488, 95360)

# mig.md §1.3 "H200 141GB": 16.0 -> 16384, 32.25 -> 33024, 69.5 -> 71168, "~140" -> 143360 MiB.
# The table has no starts column: the 8-slice grid of §1.4 (which lists H200) is used.
_H200_PROFILES = _with_memory(_H100_80GB_PROFILES, 16384, 33024, 71168, 143360)

# H100 96GB (H100 on GH200, and H20): the MIG user guide's "H100 96GB" table (names, memory
# fractions, engines, counts: same rows as H100 80GB), supported-mig-profiles page
# (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html); ids and starts of
# the 8-slice grid (mig.md §1.2, §1.4). No -lgip listing was found: memory is the H100 NVL's
# scaled by board size to the nearest 0.25 GiB (11.0, 22.0, 47.25, 95.0 GiB), SMs are the other
# Hopper boards' (the 1g.24gb 26 is assumed, as mig.md says).
_H100_96GB_PROFILES = _with_memory(_H100_80GB_PROFILES, 11264, 22528, 48384, 97280)

# H20 (96GB, 78 SMs): the guide lists it as a 7-instance 96GB Hopper part and the GPU Operator's
# default config groups it with H100-96GB (device-filter 0x2329 in all-balanced), so the names,
# memory and engines are H100 96GB's. SM counts are an assumption: H100's scaled by 78/132.
_H20_PROFILES = tuple(
    replace(p, multiprocessor_count=p.multiprocessor_count * 78 // 132) for p in _H100_96GB_PROFILES
)

# GH200 144G HBM3e (0x2348): `nvidia-smi mig -lgip` in NVIDIA/mig-parted PR #139 for 1g.18gb
# (17.50 GiB, 16 SM), 1g.18gb+me, 1g.36gb (35.25 GiB, 26 SM) and 2g.36gb (32 SM, CE 2, 2 DEC,
# 2 JPEG); the rest of that listing was not readable: 3g.72gb/4g.72gb at 71.5 GiB and 7g.144gb at
# 142.75 GiB are assumed (the half and whole board less the overhead H200 shows), with H200's
# SMs and engines. Names and counts as in the GPU Operator's default config.
_GH200_144GB_PROFILES = _with_memory(_H100_80GB_PROFILES, 17920, 36096, 73216, 146176)

# B200 180GB (0x2901): the guide's "B200 180 GB" table (counts, memory fractions, CE 2/2/2/3/6/8/16,
# NVDEC/JPEG/OFA) and `nvidia-smi mig -lgip` in NVIDIA/mig-parted PR #166 (ids 19/20/15/14; 22.00
# and 44.25 GiB; SMs 18/18/30/36; the 2g row there shows CE 4 and 2 NVDEC/2 JPEG where the guide
# prints 3 and 1/1: NVML's numbers are used). 3g/4g/7g memory (89.0, 89.0, 178.5 GiB) and SMs
# (60, 72, 144) are assumed; their engines are the guide's. Starts: the 8-slice grid (mig.md §1.4
# lists B200).
_B200_PROFILES = (
    #   const   id  attrs  G  M  max  MiB     SM   CE  DEC JPG OFA starts
    _gi(_P1,    19, "",    1, 1, 7,   22528,  18,  2,  1,  1,  0,  _S_1G),
    _gi(_P1_ME, 20, "+me", 1, 1, 1,   22528,  18,  2,  1,  1,  1,  _S_1G),
    _gi(_P1_2M, 15, "",    1, 2, 4,   45312,  30,  2,  1,  1,  0,  _S_1G_2M),
    _gi(_P2,    14, "",    2, 2, 3,   45312,  36,  4,  2,  2,  0,  _S_2G),
    _gi(_P3,     9, "",    3, 4, 2,   91136,  60,  6,  1,  1,  0,  _S_3G),
    _gi(_P4,     5, "",    4, 4, 1,   91136,  72,  8,  1,  1,  0,  _S_ZERO),
    _gi(_P7,     0, "",    7, 8, 1,   182784, 144, 16, 1,  1,  1,  _S_ZERO),
)

# RTX PRO 6000 Blackwell 96GB (0x2BB5; Server, Workstation and Max-Q editions): a 4-slice part
# (4 memory, 4 compute slices). Rows, counts and engines (NVDEC/NVENC/JPEG/OFA, CE) from the guide's
# "RTX PRO 6000 Blackwell MIG Profiles" table; ids, memory (23.62/47.38/95.12 GiB) and SMs
# (46/94/188) from `nvidia-smi mig -lgip` in GoogleCloudPlatform/container-engine-accelerators
# PR #564. Constants: nvml.h's _GFX, _NO_ME and _ALL_ME profiles (mig.md §1.2). No -lgipp listing
# was found: starts are assumed to follow the A30's 4-slice grid. nvml.h: a +me.all instance
# blocks every other profile except the -me ones (enforced by the simulator's layout rules).
_RTX_PRO_6000_PROFILES = (
    #   const       id  attrs      G  M  max  MiB    SM   CE DEC JPG OFA starts      NVENC
    _gi(_P1,        14, "",        1, 1, 4,   24192, 46,  1, 1,  1,  0,  _S_A30_1G, enc=1),
    _gi(_P1_ME,     21, "+me",     1, 1, 1,   24192, 46,  1, 1,  1,  1,  _S_A30_1G, enc=1),
    _gi(_P1_GFX,    47, "+gfx",    1, 1, 4,   24192, 46,  1, 1,  1,  0,  _S_A30_1G, enc=1),
    _gi(_P1_ALL_ME, 65, "+me.all", 1, 1, 1,   24192, 46,  1, 4,  4,  1,  _S_A30_1G, enc=4),
    _gi(_P1_NO_ME,  67, "-me",     1, 1, 4,   24192, 46,  1, 0,  0,  0,  _S_A30_1G),
    _gi(_P2,         5, "",        2, 2, 2,   48512, 94,  2, 2,  2,  0,  _S_A30_2G, enc=2),
    _gi(_P2_GFX,    35, "+gfx",    2, 2, 2,   48512, 94,  2, 2,  2,  0,  _S_A30_2G, enc=2),
    _gi(_P2_ALL_ME, 64, "+me.all", 2, 2, 1,   48512, 94,  2, 4,  4,  1,  _S_A30_2G, enc=4),
    _gi(_P2_NO_ME,  66, "-me",     2, 2, 2,   48512, 94,  2, 0,  0,  0,  _S_A30_2G),
    _gi(_P4,         0, "",        4, 4, 1,   97408, 188, 4, 4,  4,  1,  _S_ZERO,   enc=4),
    _gi(_P4_GFX,    32, "+gfx",    4, 4, 1,   97408, 188, 4, 4,  4,  1,  _S_ZERO,   enc=4),
)
# fmt: on

# Device level. PCI device ids: mig.md §1.3 / §3.5. Memory totals: what nvidia-smi prints (MiB);
# they make every name come out as §1.3 / §3.5 say. Names, SM counts, NVLink counts: public spec
# sheets. Clocks, power, subsystem ids and the H100 NVL link count (600 GB/s bridge / 50 GB/s per
# NVLink4 link) are illustrative, except these power limits (default = max, and min, in W), which
# are what NVIDIA's datasheets and nvidia-smi -q report: A100 SXM4 400/100, A30 165/100, H100 SXM5
# 700/200, H200 SXM 700/200. The other models' minimums (200 W; 150 W on the RTX PRO 6000) are
# illustrative.
# fmt: off
_MODEL_LIST = (
    # GpuModel's fields in order: key, name, architecture; CUDA capability, PCI device id,
    # subsystem id, total memory, SMs, memory slices, compute slices; GI profiles, max SM and
    # memory clocks (MHz), power limit, idle power, min power limit (W), NVLinks, PCIe generation
    # and width, min driver for MIG (and hbm, where False).
    GpuModel("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "ampere",
             (8, 0), 0x20B010DE, 0x134F10DE, 40960 * MIB, 108, 8, 7,
             _A100_40GB_PROFILES, 1410, 1215, 400, 55, 100, 12, 4, 16, "450.80.02"),
    GpuModel("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "ampere",
             (8, 0), 0x20B210DE, 0x147F10DE, 81920 * MIB, 108, 8, 7,
             _A100_80GB_PROFILES, 1410, 1593, 400, 60, 100, 12, 4, 16, "450.80.02"),
    GpuModel("A30", "NVIDIA A30", "ampere",
             (8, 0), 0x20B710DE, 0x153210DE, 24576 * MIB, 56, 4, 4,
             _A30_PROFILES, 1440, 1215, 165, 30, 100, 0, 4, 16, "460.73.01"),
    GpuModel("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", "hopper",
             (9, 0), 0x233010DE, 0x16C110DE, 81559 * MIB, 132, 8, 7,
             _H100_80GB_PROFILES, 1980, 2619, 700, 70, 200, 18, 5, 16, "525.85.12"),
    GpuModel("H100-NVL-94GB", "NVIDIA H100 NVL", "hopper",
             (9, 0), 0x232110DE, 0x183910DE, 95830 * MIB, 132, 8, 7,
             _H100_NVL_PROFILES, 1785, 2619, 400, 60, 200, 12, 5, 16, "525.85.12"),
    GpuModel("H200-SXM-141GB", "NVIDIA H200", "hopper",
             (9, 0), 0x233510DE, 0x18BE10DE, 143771 * MIB, 132, 8, 7,
             _H200_PROFILES, 1980, 3201, 700, 75, 200, 18, 5, 16, "550.90.07"),
    GpuModel("GH200-96GB", "NVIDIA GH200 480GB", "hopper",
             (9, 0), 0x234210DE, 0x16EB10DE, 97871 * MIB, 132, 8, 7,
             _H100_96GB_PROFILES, 1980, 2619, 900, 90, 200, 18, 5, 16, "525.85.12"),
    GpuModel("H20", "NVIDIA H20", "hopper",
             (9, 0), 0x232910DE, 0x198B10DE, 97871 * MIB, 78, 8, 7,
             _H20_PROFILES, 1980, 2619, 500, 60, 200, 18, 5, 16, "535.161.07"),
    GpuModel("GH200-144GB", "NVIDIA GH200 144G HBM3e", "hopper",
             (9, 0), 0x234810DE, 0x18B010DE, 147008 * MIB, 132, 8, 7,
             _GH200_144GB_PROFILES, 1980, 2619, 900, 90, 200, 18, 5, 16, "550.90.07"),
    GpuModel("B200", "NVIDIA B200", "blackwell",
             (10, 0), 0x290110DE, 0x199910DE, 183359 * MIB, 148, 8, 7,
             _B200_PROFILES, 1965, 3996, 1000, 140, 200, 18, 5, 16, "570.133.20"),
    GpuModel("RTX-PRO-6000-96GB", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "blackwell",
             (12, 0), 0x2BB510DE, 0x204E10DE, 97887 * MIB, 188, 4, 4,
             _RTX_PRO_6000_PROFILES, 2430, 14001, 600, 35, 150, 0, 5, 16, "575.51.03", hbm=False),
)
# fmt: on

MODELS: dict[str, GpuModel] = {m.key: m for m in _MODEL_LIST}
