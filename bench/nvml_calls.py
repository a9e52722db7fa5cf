"""NVML calls per second on one node: the telemetry sampler's snapshot, and what the API's
inventory adds on top of it.

The node: a simulated DGX H100 (8 GPUs), every GPU cut ``all-balanced`` (2x 1g.10gb, 1x 2g.20gb,
1x 3g.40gb, each with its full compute instance) and running one process per instance. The
count is exact, not sampled: every NVML call goes through the agent's one gateway
(``GpuDriver.calls``). The sampler collects once a second, so calls per tick = calls/s; the
sampler re-reads every layout in full every ``FULL_LAYOUT_EVERY`` ticks, so the run covers whole
cycles of it. "Before" replays what the inventory did until issue 15: ``layout()`` of every GPU
each second, beside the sampler.

Usage (from the repository root):  .venv/bin/python -m bench.nvml_calls [--ticks N]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from agent.api.events import EventBus
from agent.api.inventory import NodeInventory
from agent.config import TelemetrySettings
from agent.gpu import GpuDriver, open_driver
from agent.gpu.readings import FULL_LAYOUT_EVERY
from agent.gpu.sim import SimControl
from agent.gpu.types import Placement
from agent.telemetry.service import build_telemetry

PRESET = "dgx-h100"
BALANCED = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")


def build_node(driver: GpuDriver, control: SimControl) -> None:
    pid = 1000
    for gpu in driver.gpus():
        driver.set_mig_mode(gpu.uuid, True)
        used: list[Placement] = []
        for name in BALANCED:
            profile = next(p for p in driver.gi_profiles(gpu.uuid) if p.name == name)
            # 3g.40gb at 4:4 leaves 0:4 for the rest (1g.10gb cannot sit on slice 7).
            candidates = profile.placements[::-1] if name == "3g.40gb" else profile.placements
            where = next(p for p in candidates if not any(p.overlaps(u) for u in used))
            used.append(where)
            gi = driver.create_gpu_instance(gpu.uuid, profile.id, where)
            ci = driver.ci_profiles(gpu.uuid, gi.id)[-1]
            driver.create_compute_instance(gpu.uuid, gi.id, ci.id)
        for gi in driver.gpu_instances(gpu.uuid):
            pid += 1
            control.start_process(pid, gpu.index, used_memory_mib=512, gpu_instance=gi.id)


def measure(ticks: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        driver = open_driver(PRESET, state)
        build_node(driver, SimControl(state))
        settings = TelemetrySettings(kubelet_socket=state / "absent.sock")
        telemetry = build_telemetry(
            driver, settings, hostname="bench", proc_root=state, attribute_pods=False
        )
        inventory = NodeInventory(
            EventBus(),
            node_name="bench",
            simulated_preset=PRESET,
            telemetry=telemetry.sampler.latest,
        )
        telemetry.sampler.subscribe(inventory.refresh_gpus)
        for _ in range(3):  # warm-up: first GPM windows, caches of identities and profiles
            telemetry.sampler.tick()
        start = sum(driver.calls.values())
        inventory_calls = 0
        for _ in range(ticks):
            telemetry.sampler.tick()
            before = sum(driver.calls.values())
            inventory.refresh_gpus()  # the inventory's own 1 s refresh, beside the snapshot's
            inventory_calls += sum(driver.calls.values()) - before
        sampler = (sum(driver.calls.values()) - start - inventory_calls) / ticks
        before = sum(driver.calls.values())
        for g in driver.gpus():
            driver.layout(g.uuid)
        old_inventory = sum(driver.calls.values()) - before
        gpus = len(inventory.response().node.gpus)
        driver.close()
    return {
        "gpus": gpus,
        "sampler": sampler,
        "inventory": inventory_calls / ticks,
        "old_inventory": float(old_inventory),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=4 * FULL_LAYOUT_EVERY)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the unsupported-field notes are not the result
    r = measure(args.ticks)
    print(f"{PRESET} all-balanced, {r['gpus']} GPUs, {args.ticks} ticks at 1 s")
    print(f"  sampler snapshot (readings, layouts, processes): {r['sampler']:.0f} NVML calls/s")
    print(f"  inventory on top of it:                         {r['inventory']:.0f} NVML calls/s")
    print(
        f"  before (inventory re-reading every layout):     {r['old_inventory']:.0f} NVML calls/s"
    )


if __name__ == "__main__":
    main()
