"""Pins the simulator's GPU tables to reference/mig.md, transcribed here by hand.

If a number in agent/gpu/models.py drifts from the reference, a test here names it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pynvml
import pytest

from agent.errors import InvalidSpec
from agent.gpu.models import GIB, MIB, MODELS, GiProfileSpec, GpuModel, profile_name
from agent.gpu.sim import generations
from agent.gpu.sim.presets import PRESETS, get_preset

# mig.md §1.2: NVML_GPU_INSTANCE_PROFILE_* values.
GI_CONSTANTS = {
    "1_SLICE": 0x0,
    "2_SLICE": 0x1,
    "3_SLICE": 0x2,
    "4_SLICE": 0x3,
    "7_SLICE": 0x4,
    "1_SLICE_REV1": 0x7,
    "2_SLICE_REV1": 0x8,
    "1_SLICE_REV2": 0x9,
    "1_SLICE_GFX": 0x0A,
    "2_SLICE_GFX": 0x0B,
    "4_SLICE_GFX": 0x0C,
    "1_SLICE_NO_ME": 0x0D,
    "2_SLICE_NO_ME": 0x0E,
    "1_SLICE_ALL_ME": 0x0F,
    "2_SLICE_ALL_ME": 0x10,
}
# mig.md §1.2: NVML_COMPUTE_INSTANCE_PROFILE_* values, by compute slices.
CI_CONSTANTS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}

S1 = (0, 1, 2, 3, 4, 5, 6)
S1_2M = (0, 2, 4, 6)
S2 = (0, 2, 4)
S3 = (0, 4)
S0 = (0,)
Q1 = (0, 1, 2, 3)  # 4-slice grid (A30; RTX PRO 6000 assumed alike)
Q2 = (0, 2)

# mig.md §1.3 (and, for the boards added for issue #20, the sources cited in
# agent/gpu/models.py), one row per GI profile:
# name, constant, id, C, M, max, MiB, SM, CE, DEC, JPG, OFA, starts
Row = tuple[str, str, int, int, int, int, int, int, int, int, int, int, tuple[int, ...]]
# fmt: off
PROFILES: dict[str, list[Row]] = {
    "A100-SXM4-40GB": [
        ("1g.5gb",     "1_SLICE",      19, 1, 1, 7, 4864,  14, 1, 0, 0, 0, S1),
        ("1g.5gb+me",  "1_SLICE_REV1", 20, 1, 1, 1, 4864,  14, 1, 1, 1, 1, S1),
        ("1g.10gb",    "1_SLICE_REV2", 15, 1, 2, 4, 9856,  14, 1, 1, 0, 0, S1_2M),
        ("2g.10gb",    "2_SLICE",      14, 2, 2, 3, 9856,  28, 2, 1, 0, 0, S2),
        ("3g.20gb",    "3_SLICE",       9, 3, 4, 2, 19968, 42, 3, 2, 0, 0, S3),
        ("4g.20gb",    "4_SLICE",       5, 4, 4, 1, 19968, 56, 4, 2, 0, 0, S0),
        ("7g.40gb",    "7_SLICE",       0, 7, 8, 1, 40192, 98, 7, 5, 1, 1, S0),
    ],
    # Engines: the 80GB table has none; the 40GB ones are assumed ("same grid").
    "A100-SXM4-80GB": [
        ("1g.10gb",    "1_SLICE",      19, 1, 1, 7, 9728,  14, 1, 0, 0, 0, S1),
        ("1g.10gb+me", "1_SLICE_REV1", 20, 1, 1, 1, 9728,  14, 1, 1, 1, 1, S1),
        ("1g.20gb",    "1_SLICE_REV2", 15, 1, 2, 4, 19968, 14, 1, 1, 0, 0, S1_2M),
        ("2g.20gb",    "2_SLICE",      14, 2, 2, 3, 19968, 28, 2, 1, 0, 0, S2),
        ("3g.40gb",    "3_SLICE",       9, 3, 4, 2, 40192, 42, 3, 2, 0, 0, S3),
        ("4g.40gb",    "4_SLICE",       5, 4, 4, 1, 40192, 56, 4, 2, 0, 0, S0),
        ("7g.80gb",    "7_SLICE",       0, 7, 8, 1, 80384, 98, 7, 5, 1, 1, S0),
    ],
    "A30": [
        ("1g.6gb",     "1_SLICE",      14, 1, 1, 4, 5952,  14, 1, 0, 0, 0, (0, 1, 2, 3)),
        ("1g.6gb+me",  "1_SLICE_REV1", 21, 1, 1, 1, 5952,  14, 1, 1, 1, 1, (0, 1, 2, 3)),
        ("2g.12gb",    "2_SLICE",       5, 2, 2, 2, 11968, 28, 2, 2, 0, 0, (0, 2)),
        ("2g.12gb+me", "2_SLICE_REV1",  6, 2, 2, 1, 11968, 28, 2, 2, 1, 1, (0, 2)),
        ("4g.24gb",    "4_SLICE",       0, 4, 4, 1, 24000, 56, 4, 4, 1, 1, S0),
    ],
    "H100-SXM5-80GB": [
        ("1g.10gb",    "1_SLICE",      19, 1, 1, 7, 9984,  16,  1, 1, 1, 0, S1),
        ("1g.10gb+me", "1_SLICE_REV1", 20, 1, 1, 1, 9984,  16,  1, 1, 1, 1, S1),
        ("1g.20gb",    "1_SLICE_REV2", 15, 1, 2, 4, 20096, 26,  1, 1, 1, 0, S1_2M),
        ("2g.20gb",    "2_SLICE",      14, 2, 2, 3, 20096, 32,  2, 2, 2, 0, S2),
        ("3g.40gb",    "3_SLICE",       9, 3, 4, 2, 40448, 60,  3, 3, 3, 0, S3),
        ("4g.40gb",    "4_SLICE",       5, 4, 4, 1, 40448, 64,  4, 4, 4, 0, S0),
        ("7g.80gb",    "7_SLICE",       0, 7, 8, 1, 81152, 132, 8, 7, 7, 1, S0),
    ],
    "H100-NVL-94GB": [
        ("1g.12gb",    "1_SLICE",      19, 1, 1, 7, 11008, 16,  1, 1, 1, 0, S1),
        ("1g.12gb+me", "1_SLICE_REV1", 20, 1, 1, 1, 11008, 16,  1, 1, 1, 1, S1),
        ("1g.24gb",    "1_SLICE_REV2", 15, 1, 2, 4, 22144, 26,  1, 1, 1, 0, S1_2M),
        ("2g.24gb",    "2_SLICE",      14, 2, 2, 3, 22144, 32,  2, 2, 2, 0, S2),
        ("3g.47gb",    "3_SLICE",       9, 3, 4, 2, 47488, 60,  3, 3, 3, 0, S3),
        ("4g.47gb",    "4_SLICE",       5, 4, 4, 1, 47488, 64,  4, 4, 4, 0, S0),
        ("7g.94gb",    "7_SLICE",       0, 7, 8, 1, 95360, 132, 8, 7, 7, 1, S0),
    ],
    "H200-SXM-141GB": [
        ("1g.18gb",    "1_SLICE",      19, 1, 1, 7, 16384,  16,  1, 1, 1, 0, S1),
        ("1g.18gb+me", "1_SLICE_REV1", 20, 1, 1, 1, 16384,  16,  1, 1, 1, 1, S1),
        ("1g.35gb",    "1_SLICE_REV2", 15, 1, 2, 4, 33024,  26,  1, 1, 1, 0, S1_2M),
        ("2g.35gb",    "2_SLICE",      14, 2, 2, 3, 33024,  32,  2, 2, 2, 0, S2),
        ("3g.71gb",    "3_SLICE",       9, 3, 4, 2, 71168,  60,  3, 3, 3, 0, S3),
        ("4g.71gb",    "4_SLICE",       5, 4, 4, 1, 71168,  64,  4, 4, 4, 0, S0),
        ("7g.141gb",   "7_SLICE",       0, 7, 8, 1, 143360, 132, 8, 7, 7, 1, S0),
    ],
    # MIG user guide "H100 96GB" table; memory and the 1g.24gb SMs assumed (see models.py).
    "GH200-96GB": [
        ("1g.12gb",    "1_SLICE",      19, 1, 1, 7, 11264, 16,  1, 1, 1, 0, S1),
        ("1g.12gb+me", "1_SLICE_REV1", 20, 1, 1, 1, 11264, 16,  1, 1, 1, 1, S1),
        ("1g.24gb",    "1_SLICE_REV2", 15, 1, 2, 4, 22528, 26,  1, 1, 1, 0, S1_2M),
        ("2g.24gb",    "2_SLICE",      14, 2, 2, 3, 22528, 32,  2, 2, 2, 0, S2),
        ("3g.48gb",    "3_SLICE",       9, 3, 4, 2, 48384, 60,  3, 3, 3, 0, S3),
        ("4g.48gb",    "4_SLICE",       5, 4, 4, 1, 48384, 64,  4, 4, 4, 0, S0),
        ("7g.96gb",    "7_SLICE",       0, 7, 8, 1, 97280, 132, 8, 7, 7, 1, S0),
    ],
    # H100 96GB's rows with SMs scaled to 78 of 132 (an assumption, see models.py).
    "H20": [
        ("1g.12gb",    "1_SLICE",      19, 1, 1, 7, 11264, 9,   1, 1, 1, 0, S1),
        ("1g.12gb+me", "1_SLICE_REV1", 20, 1, 1, 1, 11264, 9,   1, 1, 1, 1, S1),
        ("1g.24gb",    "1_SLICE_REV2", 15, 1, 2, 4, 22528, 15,  1, 1, 1, 0, S1_2M),
        ("2g.24gb",    "2_SLICE",      14, 2, 2, 3, 22528, 18,  2, 2, 2, 0, S2),
        ("3g.48gb",    "3_SLICE",       9, 3, 4, 2, 48384, 35,  3, 3, 3, 0, S3),
        ("4g.48gb",    "4_SLICE",       5, 4, 4, 1, 48384, 37,  4, 4, 4, 0, S0),
        ("7g.96gb",    "7_SLICE",       0, 7, 8, 1, 97280, 78,  8, 7, 7, 1, S0),
    ],
    # mig-parted PR #139 -lgip for the 1g/2g rows; 3g/4g/7g memory assumed.
    "GH200-144GB": [
        ("1g.18gb",    "1_SLICE",      19, 1, 1, 7, 17920,  16,  1, 1, 1, 0, S1),
        ("1g.18gb+me", "1_SLICE_REV1", 20, 1, 1, 1, 17920,  16,  1, 1, 1, 1, S1),
        ("1g.36gb",    "1_SLICE_REV2", 15, 1, 2, 4, 36096,  26,  1, 1, 1, 0, S1_2M),
        ("2g.36gb",    "2_SLICE",      14, 2, 2, 3, 36096,  32,  2, 2, 2, 0, S2),
        ("3g.72gb",    "3_SLICE",       9, 3, 4, 2, 73216,  60,  3, 3, 3, 0, S3),
        ("4g.72gb",    "4_SLICE",       5, 4, 4, 1, 73216,  64,  4, 4, 4, 0, S0),
        ("7g.144gb",   "7_SLICE",       0, 7, 8, 1, 146176, 132, 8, 7, 7, 1, S0),
    ],
    # Guide's B200 table (CE, engines, counts) and mig-parted PR #166 -lgip (ids, 1g/2g rows).
    "B200": [
        ("1g.23gb",    "1_SLICE",      19, 1, 1, 7, 22528,  18,  2,  1, 1, 0, S1),
        ("1g.23gb+me", "1_SLICE_REV1", 20, 1, 1, 1, 22528,  18,  2,  1, 1, 1, S1),
        ("1g.45gb",    "1_SLICE_REV2", 15, 1, 2, 4, 45312,  30,  2,  1, 1, 0, S1_2M),
        ("2g.45gb",    "2_SLICE",      14, 2, 2, 3, 45312,  36,  4,  2, 2, 0, S2),
        ("3g.90gb",    "3_SLICE",       9, 3, 4, 2, 91136,  60,  6,  1, 1, 0, S3),
        ("4g.90gb",    "4_SLICE",       5, 4, 4, 1, 91136,  72,  8,  1, 1, 0, S0),
        ("7g.180gb",   "7_SLICE",       0, 7, 8, 1, 182784, 144, 16, 1, 1, 1, S0),
    ],
    # Guide's RTX PRO 6000 table and GoogleCloudPlatform/container-engine-accelerators PR #564
    # -lgip (ids, 23.62/47.38/95.12 GiB, SMs). NVENC is pinned in RTX_PRO_NVENC.
    "RTX-PRO-6000-96GB": [
        ("1g.24gb",        "1_SLICE",        14, 1, 1, 4, 24192, 46,  1, 1, 1, 0, Q1),
        ("1g.24gb+me",     "1_SLICE_REV1",   21, 1, 1, 1, 24192, 46,  1, 1, 1, 1, Q1),
        ("1g.24gb+gfx",    "1_SLICE_GFX",    47, 1, 1, 4, 24192, 46,  1, 1, 1, 0, Q1),
        ("1g.24gb+me.all", "1_SLICE_ALL_ME", 65, 1, 1, 1, 24192, 46,  1, 4, 4, 1, Q1),
        ("1g.24gb-me",     "1_SLICE_NO_ME",  67, 1, 1, 4, 24192, 46,  1, 0, 0, 0, Q1),
        ("2g.48gb",        "2_SLICE",         5, 2, 2, 2, 48512, 94,  2, 2, 2, 0, Q2),
        ("2g.48gb+gfx",    "2_SLICE_GFX",    35, 2, 2, 2, 48512, 94,  2, 2, 2, 0, Q2),
        ("2g.48gb+me.all", "2_SLICE_ALL_ME", 64, 2, 2, 1, 48512, 94,  2, 4, 4, 1, Q2),
        ("2g.48gb-me",     "2_SLICE_NO_ME",  66, 2, 2, 2, 48512, 94,  2, 0, 0, 0, Q2),
        ("4g.96gb",        "4_SLICE",         0, 4, 4, 1, 97408, 188, 4, 4, 4, 1, S0),
        ("4g.96gb+gfx",    "4_SLICE_GFX",    32, 4, 4, 1, 97408, 188, 4, 4, 4, 1, S0),
    ],
}
RTX_PRO_NVENC = {
    "1g.24gb": 1, "1g.24gb+me": 1, "1g.24gb+gfx": 1, "1g.24gb+me.all": 4, "1g.24gb-me": 0,
    "2g.48gb": 2, "2g.48gb+gfx": 2, "2g.48gb+me.all": 4, "2g.48gb-me": 0,
    "4g.96gb": 4, "4g.96gb+gfx": 4,
}  # fmt: skip

# Device level: NVML name, arch, CUDA CC, packed PCI id, total MiB (as nvidia-smi prints it),
# SMs, memory slices, compute slices, NVLink links.
DEVICES: dict[str, tuple[str, str, tuple[int, int], int, int, int, int, int, int]] = {
    "A100-SXM4-40GB": ("NVIDIA A100-SXM4-40GB", "ampere", (8, 0), 0x20B010DE, 40960, 108, 8, 7, 12),
    "A100-SXM4-80GB": ("NVIDIA A100-SXM4-80GB", "ampere", (8, 0), 0x20B210DE, 81920, 108, 8, 7, 12),
    "A30": ("NVIDIA A30", "ampere", (8, 0), 0x20B710DE, 24576, 56, 4, 4, 0),
    "H100-SXM5-80GB": ("NVIDIA H100 80GB HBM3", "hopper", (9, 0), 0x233010DE, 81559, 132, 8, 7, 18),
    "H100-NVL-94GB": ("NVIDIA H100 NVL", "hopper", (9, 0), 0x232110DE, 95830, 132, 8, 7, 12),
    "H200-SXM-141GB": ("NVIDIA H200", "hopper", (9, 0), 0x233510DE, 143771, 132, 8, 7, 18),
    "GH200-96GB": ("NVIDIA GH200 480GB", "hopper", (9, 0), 0x234210DE, 97871, 132, 8, 7, 18),
    "H20": ("NVIDIA H20", "hopper", (9, 0), 0x232910DE, 97871, 78, 8, 7, 18),
    "GH200-144GB": ("NVIDIA GH200 144G HBM3e", "hopper", (9, 0), 0x234810DE, 147008, 132, 8, 7, 18),
    "B200": ("NVIDIA B200", "blackwell", (10, 0), 0x290110DE, 183359, 148, 8, 7, 18),
    "RTX-PRO-6000-96GB": (
        "NVIDIA RTX PRO 6000 Blackwell Server Edition", "blackwell", (12, 0), 0x2BB510DE, 97887,
        188, 4, 4, 0,
    ),
}
# fmt: on

EIGHT_SLICE = [k for k, d in DEVICES.items() if d[6] == 8]
PROFILE_ROWS = [(key, row) for key, rows in PROFILES.items() for row in rows]


def _gi(model: GpuModel, constant_name: str) -> GiProfileSpec:
    gi = model.gi_profile_by_constant(GI_CONSTANTS[constant_name])
    assert gi is not None, f"{model.key} lacks {constant_name}"
    return gi


def test_every_model_is_pinned() -> None:
    assert set(MODELS) == set(PROFILES) == set(DEVICES)
    assert all(key == m.key for key, m in MODELS.items())


@pytest.mark.parametrize("name, value", GI_CONSTANTS.items())
def test_gi_constants_match_pynvml(name: str, value: int) -> None:
    assert getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{name}") == value


@pytest.mark.parametrize("slices, value", CI_CONSTANTS.items())
def test_ci_constants_match_pynvml(slices: int, value: int) -> None:
    assert getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE") == value


@pytest.mark.parametrize("key", PROFILES)
def test_model_has_exactly_the_reference_profiles(key: str) -> None:
    model = MODELS[key]
    want = sorted((GI_CONSTANTS[r[1]], r[2]) for r in PROFILES[key])
    assert sorted((p.constant, p.id) for p in model.gi_profiles) == want


@pytest.mark.parametrize("key, row", PROFILE_ROWS, ids=[f"{k}-{r[0]}" for k, r in PROFILE_ROWS])
def test_gi_profile_matches_reference(key: str, row: Row) -> None:
    name, const, pid, c, m, count, mib, sm, ce, dec, jpg, ofa, starts = row
    model = MODELS[key]
    gi = _gi(model, const)
    assert model.gi_profile_by_id(pid) is gi
    got = (
        gi.id, gi.slice_count, gi.memory_slices, gi.instance_count, gi.memory_mb,
        gi.multiprocessor_count, gi.copy_engines, gi.decoders, gi.jpegs, gi.ofas, gi.starts,
    )  # fmt: skip
    assert got == (pid, c, m, count, mib, sm, ce, dec, jpg, ofa, starts)
    assert gi.encoders == (RTX_PRO_NVENC[name] if key == "RTX-PRO-6000-96GB" else 0)
    assert gi.attrs == name[name.index("gb") + 2 :]
    assert profile_name(model, gi) == name


@pytest.mark.parametrize("key", DEVICES)
def test_device_matches_reference(key: str) -> None:
    name, arch, cc, pci, mib, sm, mem_slices, compute_slices, links = DEVICES[key]
    model = MODELS[key]
    got = (
        model.name, model.architecture, model.cuda_capability, model.pci_device_id,
        model.memory_total_bytes, model.multiprocessor_count, model.memory_slices,
        model.compute_slices, model.nvlink_links,
    )  # fmt: skip
    assert got == (name, arch, cc, pci, mib * MIB, sm, mem_slices, compute_slices, links)
    assert model.pci_device_id & 0xFFFF == 0x10DE
    assert model.pci_subsystem_id & 0xFFFF == 0x10DE


@pytest.mark.parametrize("key", MODELS)
def test_profiles_fit_the_grid(key: str) -> None:
    model = MODELS[key]
    assert max(p.memory_slices for p in model.gi_profiles) == model.memory_slices
    assert max(p.slice_count for p in model.gi_profiles) == model.compute_slices
    for gi in model.gi_profiles:
        assert all(s + gi.memory_slices <= model.memory_slices for s in gi.starts)
        assert gi.multiprocessor_count <= model.multiprocessor_count
        assert gi.memory_mb * MIB <= model.memory_total_bytes


@pytest.mark.parametrize("key", MODELS)
def test_names_match_go_nvlib_float_algorithm(key: str) -> None:
    """Integer arithmetic agrees with go-nvlib's float64 getMigMemorySizeGB (mig.md §1.7)."""
    model = MODELS[key]
    total = model.memory_total_bytes
    for gi in model.gi_profiles:
        fraction = math.ceil(gi.memory_mb * MIB / total * 8) / 8
        gb = math.floor(fraction * float((total + GIB - 1) // GIB) + 0.5)
        assert profile_name(model, gi).split(".")[1].split("+")[0].split("-")[0] == f"{gb}gb"


def test_name_rounds_half_up() -> None:
    h200 = MODELS["H200-SXM-141GB"]
    three_g = _gi(h200, "3_SLICE")
    # 4/8 of ceil(140.4 GiB) = 70.5: Go's math.Round gives 71, Python's round() 70.
    assert round(4 / 8 * 141) == 70
    assert profile_name(h200, three_g) == "3g.71gb"


def test_name_changes_with_board_memory() -> None:
    """mig.md §1.7: one profile can be named differently on boards with other totals."""
    a100 = MODELS["A100-SXM4-80GB"]
    seven_g = _gi(a100, "7_SLICE")
    # A board reporting 79 GiB total (ceil) names the same 7g profile 7g.79gb.
    board = replace(a100, memory_total_bytes=80800 * MIB)
    assert profile_name(board, seven_g) == "7g.79gb"


# mig.md §1.6: CI profiles per GI size G as {C: count}.
CI_TABLE = {
    1: {1: 1},
    2: {1: 2, 2: 1},
    3: {1: 3, 2: 1, 3: 1},
    4: {1: 4, 2: 2, 4: 1},
    7: {1: 7, 2: 3, 3: 2, 4: 1, 7: 1},
}
GI_ROWS = [(key, gi) for key, m in MODELS.items() for gi in m.gi_profiles]


@pytest.mark.parametrize(
    "key, gi", GI_ROWS, ids=[f"{k}-{profile_name(MODELS[k], g)}" for k, g in GI_ROWS]
)
def test_ci_profiles_match_reference(key: str, gi: GiProfileSpec) -> None:
    model = MODELS[key]
    cis = model.ci_profiles(gi)
    assert {ci.slice_count: ci.instance_count for ci in cis} == CI_TABLE[gi.slice_count]
    for ci in cis:
        assert ci.constant == ci.id == CI_CONSTANTS[ci.slice_count]
        assert ci.starts == tuple(range(0, gi.slice_count - ci.slice_count + 1, ci.slice_count))
        assert len(ci.starts) == ci.instance_count
        if ci.slice_count == gi.slice_count:
            assert ci.multiprocessor_count == gi.multiprocessor_count
        else:
            assert ci.multiprocessor_count * ci.instance_count <= gi.multiprocessor_count


@pytest.mark.parametrize(
    "key, const, ci_slices, name",
    [
        ("A100-SXM4-40GB", "3_SLICE", 1, "1c.3g.20gb"),
        ("A100-SXM4-40GB", "3_SLICE", 3, "3g.20gb"),
        ("A100-SXM4-40GB", "2_SLICE", 1, "1c.2g.10gb"),
        ("A100-SXM4-80GB", "7_SLICE", 4, "4c.7g.80gb"),
        ("A30", "4_SLICE", 2, "2c.4g.24gb"),
        ("A30", "2_SLICE_REV1", 1, "1c.2g.12gb+me"),
        ("H100-SXM5-80GB", "7_SLICE", 1, "1c.7g.80gb"),
        ("H100-NVL-94GB", "4_SLICE", 2, "2c.4g.47gb"),
        ("H200-SXM-141GB", "3_SLICE", 2, "2c.3g.71gb"),
        ("H200-SXM-141GB", "7_SLICE", 7, "7g.141gb"),
    ],
)
def test_ci_sub_profile_names(key: str, const: str, ci_slices: int, name: str) -> None:
    model = MODELS[key]
    assert profile_name(model, _gi(model, const), ci_slices) == name


def test_a100_ci_multiprocessors_are_per_slice() -> None:
    a100 = MODELS["A100-SXM4-40GB"]
    sms = {ci.slice_count: ci.multiprocessor_count for ci in a100.ci_profiles(_gi(a100, "7_SLICE"))}
    assert sms == {1: 14, 2: 28, 3: 42, 4: 56, 7: 98}


def test_gpm_and_arch_code_follow_architecture() -> None:
    """GPM from Hopper on; the arch code is the one nvmlDeviceGetArchitecture returns."""
    codes = {
        "ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
        "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
        "blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL,
    }
    for m in MODELS.values():
        assert m.arch_code == codes[m.architecture]
        assert m.gpm_supported == (m.arch_code >= pynvml.NVML_DEVICE_ARCH_HOPPER)


# mig.md §1.5, "Maximal geometries that use all 7 compute slices": example placement and the
# memory slices used. "1g@0..3" means 1g at 0, 1, 2 and 3.
GEOMETRIES = [
    ("7g@0", 8),
    ("4g@0, 3g@4", 8),
    ("2g@0, 2g@2, 3g@4", 8),
    ("1g@0, 1g@1, 2g@2, 3g@4", 8),
    ("1g@0..3, 3g@4", 8),
    ("4g@0, 2g@4, 1g2@6", 8),
    ("4g@0, 1g@4, 1g@5, 1g2@6", 8),
    ("2g@0, 2g@2, 2g@4, 1g2@6", 8),
    ("2g@0, 1g@2, 1g@3, 2g@4, 1g2@6", 8),
    ("1g@0..3, 2g@4, 1g2@6", 8),
    ("1g@0..5, 1g2@6", 8),
    ("1g@0..6", 7),
    ("1g@0, 1g@1, 2g@2, 1g@4..6", 7),
    ("2g@0, 2g@2, 1g@4..6", 7),
    ("2g@0, 2g@2, 2g@4, 1g@6", 7),
    ("4g@0, 2g@4, 1g@6", 7),
    ("4g@0, 1g@4..6", 7),
]
# mig.md §1.5 A30 maximal geometries, with placements on the §1.4 A30 grid (compute 4/4).
A30_GEOMETRIES = [
    ("1g@0..3", 4),
    ("2g@0, 1g@2, 1g@3", 4),
    ("2g@0, 2g@2", 4),
    ("4g@0", 4),
]
CLASS_CONSTANT = {
    "1g": "1_SLICE",
    "1g2": "1_SLICE_REV2",
    "2g": "2_SLICE",
    "3g": "3_SLICE",
    "4g": "4_SLICE",
    "7g": "7_SLICE",
}


def _placements(geometry: str) -> list[tuple[str, int]]:
    out = []
    for part in geometry.split(", "):
        cls, at = part.split("@")
        first, _, last = at.partition("..")
        out += [(cls, s) for s in range(int(first), int(last or first) + 1)]
    return out


def _check_geometry(model: GpuModel, geometry: str, memory_used: int) -> None:
    used: set[int] = set()
    compute = 0
    counts: dict[int, int] = {}
    for cls, start in _placements(geometry):
        gi = _gi(model, CLASS_CONSTANT[cls])
        assert start in gi.starts, f"{cls}@{start} is not a valid start"
        span = set(range(start, start + gi.memory_slices))
        assert not used & span, f"{cls}@{start} overlaps"
        used |= span
        compute += gi.slice_count
        counts[gi.id] = counts.get(gi.id, 0) + 1
        assert counts[gi.id] <= gi.instance_count
    assert compute == model.compute_slices
    assert len(used) == memory_used


@pytest.mark.parametrize("key", EIGHT_SLICE)
@pytest.mark.parametrize("geometry, memory_used", GEOMETRIES)
def test_maximal_geometry_is_placeable(key: str, geometry: str, memory_used: int) -> None:
    _check_geometry(MODELS[key], geometry, memory_used)


@pytest.mark.parametrize("key", ["A30", "RTX-PRO-6000-96GB"])
@pytest.mark.parametrize("geometry, memory_used", A30_GEOMETRIES)
def test_four_slice_geometry_is_placeable(key: str, geometry: str, memory_used: int) -> None:
    _check_geometry(MODELS[key], geometry, memory_used)


PRESET_GPUS = {
    "dgx-a100": {"A100-SXM4-40GB": 8},
    "dgx-a100-80": {"A100-SXM4-80GB": 8},
    "a30-node": {"A30": 4},
    "dgx-h100": {"H100-SXM5-80GB": 8},
    "h100-nvl": {"H100-NVL-94GB": 2},
    "hgx-h200": {"H200-SXM-141GB": 8},
    "mixed": {"A100-SXM4-80GB": 4, "H100-SXM5-80GB": 4},
    "gh200": {"GH200-96GB": 4},
    "gh200-144": {"GH200-144GB": 4},
    "hgx-h20": {"H20": 8},
    "dgx-b200": {"B200": 8},
    "rtx-pro-6000": {"RTX-PRO-6000-96GB": 8},
}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


@pytest.mark.parametrize("name", PRESET_GPUS)
def test_preset_resolves_to_models(name: str) -> None:
    preset = get_preset(name)
    assert preset is PRESETS[name] and preset.name == name
    counts: dict[str, int] = {}
    for key in preset.gpus:
        counts[key] = counts.get(key, 0) + 1
    assert counts == PRESET_GPUS[name]
    models = [MODELS[key] for key in preset.gpus]
    assert all(_version(preset.driver_version) >= _version(m.min_driver_version) for m in models)
    assert preset.cuda_driver_version == generations.cuda_driver_version(preset.driver_version)


def test_every_preset_is_pinned() -> None:
    assert set(PRESETS) == set(PRESET_GPUS)


def test_get_preset_unknown_names_the_allowed_ones() -> None:
    with pytest.raises(InvalidSpec) as err:
        get_preset("dgx-gb300")
    message = str(err.value)
    assert "dgx-gb300" in message
    assert all(name in message for name in PRESETS)
    assert [v.field for v in err.value.violations] == ["preset"]
