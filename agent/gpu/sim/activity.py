"""Injected workloads and what they look like through the driver's counters.

A workload is a set of constant rates (activity ratios in [0, 1], traffic in bytes/s) on a GPU or
on one GPU instance. Each GPU and GI keeps an ``Activity``: the rates in force plus their
integrals, folded whenever the rates change, so counters (energy, GPM) integrate real elapsed
time without writing state on reads.

GPU-level rule with MIG on (documented for consumers of the simulator):
* compute ratios (sm_active, sm_occupancy, tensor_active, fp64/fp32/fp16_active) are the
  slice-weighted sum of the GIs' ratios, each GI weighted by its compute slices / the GPU's
  compute slices (7, or 4 on A30);
* dram_active is weighted by memory slices / the GPU's memory slices (8, or 4);
* PCIe and NVLink traffic are physical-GPU properties: the GPU-level workload's traffic plus the
  traffic of every GI's workload;
* a GPU-level workload on a MIG-enabled GPU may carry traffic only (``control.py`` enforces it).

Device-level figures derived from the rates (power, temperature, clocks) are illustrative.
"""

from __future__ import annotations

import math

from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.models import GpuModel
from agent.gpu.sim.state import Activity, Gpu

COMPUTE_RATIOS = (
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "fp64_active",
    "fp32_active",
    "fp16_active",
)
MEMORY_RATIOS = ("dram_active",)
RATIOS = COMPUTE_RATIOS + MEMORY_RATIOS
TRAFFIC = (
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
)
FIELDS = RATIOS + TRAFFIC

#: Extra rate on a GPU's activity: board power in mW, so its total is the energy in mJ.
POWER_MW = "power_mw"

_IDLE_SM_CLOCK_MHZ = 210  # illustrative idle clock


def validate(values: dict[str, float]) -> dict[str, float]:
    """Check a workload; keep only non-zero fields. Raises InvalidSpec naming the bad field."""
    violations = []
    numbers: dict[str, float] = {}
    for name, value in values.items():
        try:
            v = numbers[name] = float(value)
        except (TypeError, ValueError):
            violations.append(FieldViolation(name, f"must be a number, got {value!r}"))
            continue
        if name in RATIOS and not (0.0 <= v <= 1.0):
            violations.append(FieldViolation(name, f"must be a ratio in [0, 1], got {value!r}"))
        elif name in TRAFFIC and not (math.isfinite(v) and v >= 0.0):
            violations.append(FieldViolation(name, f"must be bytes/s >= 0, got {value!r}"))
    if violations:
        raise InvalidSpec(
            "invalid workload: " + "; ".join(f"{v.field} {v.description}" for v in violations),
            violations,
        )
    return {k: v for k, v in numbers.items() if v != 0.0}


def fold(activity: Activity, now: float) -> None:
    """Bring the totals up to ``now`` under the rates in force."""
    dt = max(0.0, now - activity.since)  # a host reboot restarts CLOCK_MONOTONIC
    for name, rate in activity.rates.items():
        activity.totals[name] = activity.totals.get(name, 0.0) + rate * dt
    activity.since = now


def totals_at(activity: Activity, now: float) -> dict[str, float]:
    dt = max(0.0, now - activity.since)
    names = activity.totals.keys() | activity.rates.keys()
    return {n: activity.totals.get(n, 0.0) + activity.rates.get(n, 0.0) * dt for n in sorted(names)}


def gpu_rates(gpu: Gpu, model: GpuModel) -> dict[str, float]:
    """The GPU's effective workload: its own, or with MIG on the aggregate rule above."""
    if not gpu.mig_current:
        return dict(gpu.workload)
    rates = {n: v for n, v in gpu.workload.items() if n in TRAFFIC}
    for gi in gpu.gpu_instances:
        spec = model.gi_profile_by_id(gi.profile_id)
        if spec is None:
            continue
        for name, value in gi.workload.items():
            if name in COMPUTE_RATIOS:
                weight = spec.slice_count / model.compute_slices
            elif name in MEMORY_RATIOS:
                weight = spec.memory_slices / model.memory_slices
            else:
                weight = 1.0
            rates[name] = rates.get(name, 0.0) + value * weight
    return {n: v for n, v in rates.items() if v != 0.0}


def refresh(gpu: Gpu, model: GpuModel, now: float) -> None:
    """Fold every counter of ``gpu`` at ``now``, then put its current workloads in force.

    Call after any change to the GPU's workloads, instances or MIG mode.
    """
    fold(gpu.activity, now)
    for gi in gpu.gpu_instances:
        fold(gi.activity, now)
        gi.activity.rates = dict(gi.workload)
    rates = gpu_rates(gpu, model)
    # The board holds its draw at the enforced limit (clocks come down instead).
    rates[POWER_MW] = min(power_w(model, rates) * 1000.0, float(power_limit_mw(gpu, model)))
    gpu.activity.rates = rates


def set_power_limit(gpu: Gpu, model: GpuModel, milliwatts: int) -> None:
    """Hold ``milliwatts`` as the GPU's power management limit (the default is kept as None)."""
    gpu.power_limit_mw = None if milliwatts == model.power_limit_w * 1000 else milliwatts


def power_limit_mw(gpu: Gpu, model: GpuModel) -> int:
    """The limit in force: the one set, else the model's default."""
    return model.power_limit_w * 1000 if gpu.power_limit_mw is None else gpu.power_limit_mw


def load(rates: dict[str, float]) -> float:
    """How busy the board is, 0..1 (drives power, temperature and clocks)."""
    value = (
        0.5 * rates.get("sm_active", 0.0)
        + 0.3 * rates.get("tensor_active", 0.0)
        + 0.2 * rates.get("dram_active", 0.0)
    )
    return min(1.0, value)


def power_w(model: GpuModel, rates: dict[str, float]) -> float:
    return model.idle_power_w + (model.power_limit_w - model.idle_power_w) * load(rates)


def temperature_c(rates: dict[str, float]) -> int:
    return round_half_up(32 + 43 * load(rates))


def sm_clock_mhz(model: GpuModel, rates: dict[str, float]) -> int:
    return model.max_sm_clock_mhz if rates.get("sm_active", 0.0) > 0 else _IDLE_SM_CLOCK_MHZ


def percent(ratio: float) -> int:
    return round_half_up(100 * ratio)


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)
