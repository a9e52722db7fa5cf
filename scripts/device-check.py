#!/usr/bin/env python3
"""Compare the simulator's model of this machine's GPU with what the real NVML answers.

READ-ONLY: it calls only NVML getters (names, memory, MIG mode, GI profile infos for every
constant, possible placements per profile, GPM support). It never changes MIG mode, never creates
or destroys an instance, never touches a clock or any setting.

Prints one JSON document: the real facts, the simulator's facts for the same model (matched by PCI
device id), and every difference. Exit 0 when they agree, 1 when they differ, 2 when no GPU.

    python3 scripts/device-check.py [--gpu INDEX]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.errors import AgentError
from agent.gpu.nvml import GpuDriver


def facts(driver: GpuDriver, index: int) -> dict[str, Any]:
    """The read-only MIG facts of one GPU, through the same facade the agent uses."""
    info = driver.gpus()[index]
    profiles = driver.gi_profiles(info.uuid)
    nvml = driver.nvml  # the one gateway: counted, version fallbacks
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    try:
        gpm = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except nvml.NVMLError as exc:
        gpm = f"error: {exc}"
    return {
        "name": info.name,
        "pci_device_id": f"0x{info.pci_device_id:08X}",
        "memory_total_bytes": info.memory_total_bytes,
        "mig_capable": info.mig_capable,
        "gpm_supported": gpm,
        "gi_profiles": {
            str(p.constant): {
                "id": p.id,
                "name": p.name,
                "slice_count": p.slice_count,
                "memory_slices": p.memory_slices,
                "instance_count": p.instance_count,
                "memory_mb": p.memory_mb,
                "multiprocessor_count": p.multiprocessor_count,
                "engines": [p.copy_engines, p.decoders, p.encoders, p.jpegs, p.ofas],
                "placements": [f"{pl.start}:{pl.size}" for pl in p.placements],
            }
            for p in profiles
        },
    }


def simulated_facts(pci_device_id: int) -> dict[str, Any] | None:
    """The same facts read from a throwaway simulated node holding the same model."""
    from agent.gpu.models import MODELS
    from agent.gpu.sim import open_simulator
    from agent.gpu.sim.presets import PRESETS

    model = next((m for m in MODELS.values() if m.pci_device_id == pci_device_id), None)
    if model is None:
        return None
    preset = next(p for p in PRESETS.values() if model.key in p.gpus)
    with tempfile.TemporaryDirectory() as state:
        driver = GpuDriver(open_simulator(Path(state), preset.name)).open()
        try:
            return facts(driver, preset.gpus.index(model.key))
        finally:
            driver.close()


def differences(real: Any, sim: Any, path: str = "") -> list[str]:
    if isinstance(real, dict) and isinstance(sim, dict):
        out: list[str] = []
        for key in sorted(set(real) | set(sim)):
            where = f"{path}.{key}" if path else key
            if key not in sim:
                out.append(f"{where}: only on the real GPU ({real[key]!r})")
            elif key not in real:
                out.append(f"{where}: only in the simulator ({sim[key]!r})")
            else:
                out.extend(differences(real[key], sim[key], where))
        return out
    return [] if real == sim else [f"{path}: real {real!r} != simulated {sim!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", type=int, default=0, help="GPU index to check (default 0)")
    args = parser.parse_args()
    import pynvml

    driver = GpuDriver(pynvml)
    try:
        driver.open()
    except AgentError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    try:
        real = facts(driver, args.gpu)
        real["driver_version"] = driver.driver_version()
    finally:
        driver.close()
    sim = simulated_facts(int(real["pci_device_id"], 16))
    report: dict[str, Any] = {"real": real, "simulated": sim}
    if sim is None:
        report["differences"] = [f"no simulator model has PCI device id {real['pci_device_id']}"]
    else:
        report["differences"] = differences(
            {k: v for k, v in real.items() if k != "driver_version"}, sim
        )
    print(json.dumps(report, indent=2))
    return 1 if report["differences"] else 0


if __name__ == "__main__":
    sys.exit(main())
