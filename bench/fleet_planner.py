#!/usr/bin/env python3
"""The fleet MIG planner: time on 1,000 nodes x 8 GPUs, and disruption against the optimum.

* scale: 1,000 nodes of four presets (DGX H100, DGX A100-80GB, HGX H200, DGX A100), each GPU
  in one of five layouts (MIG off, 7 x 1g, 2 x 3g, 1g+1g+2g+3g, 7g) with 40% of instances busy,
  asked for a demand shift (fewer 1g, more 3g and 7g); then 1,000 idle DGX H100 asked for
  7 x 1g on every GPU. Median wall time of ``plan_fleet`` over ``--repeat`` cold runs.
* optimality: ``--fleets`` random small fleets (1-3 nodes x 1-4 GPUs of A100-40GB, A30, H100;
  random layouts, busy instances and demand). Instances destroyed and devices short, summed,
  for this planner (each plan proven optimal by HiGHS) and for the greedy planner it replaced,
  loaded from git (``--greedy-ref``); the ratio is destroyed over the optimum's destroyed.

    .venv/bin/python bench/fleet_planner.py
    .venv/bin/python bench/fleet_planner.py --repeat 5 --fleets 60 --greedy-ref ed261d0
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.coordinator.planning.catalog import preset_layouts  # noqa: E402
from agent.coordinator.planning.demand import Demand, DemandEntry  # noqa: E402
from agent.coordinator.planning.options import clear_cache  # noqa: E402
from agent.coordinator.planning.planner import NodeLayouts, plan_fleet  # noqa: E402
from agent.gpu.types import (  # noqa: E402
    ComputeInstance,
    GpuInstance,
    GpuLayout,
    MigMode,
    Placement,
    Process,
)
from agent.mig.desired import Desired, current_counts  # noqa: E402
from agent.mig.plan import plan_gpu  # noqa: E402

PRESETS = ("dgx-h100", "dgx-a100-80", "hgx-h200", "dgx-a100")
TEMPLATES: tuple[dict[int, int] | None, ...] = (None, {1: 7}, {3: 2}, {1: 2, 2: 1, 3: 1}, {7: 1})
SMALL_PRESETS = ("dgx-a100", "dgx-h100")


def with_instances(
    layout: GpuLayout, slices: dict[int, int] | None, rng: random.Random, busy: float
) -> GpuLayout:
    """``layout`` in MIG mode holding instances by compute-slice count, some of them busy."""
    if slices is None:
        return layout
    names = {
        p.slice_count: p.name
        for p in reversed(layout.profiles)
        if "+me" not in p.name and (p.slice_count > 1 or p.memory_slices == 1)
    }
    desired = Desired(True, tuple((names[g], n) for g, n in slices.items() if g in names))
    on = dataclasses.replace(layout.gpu, mig_mode=MigMode(True, True))
    target = plan_gpu(GpuLayout(on, layout.profiles, (), ()), desired).target
    assert target is not None
    instances = tuple(
        GpuInstance(
            i + 1,
            gi.profile_id,
            gi.profile_name,
            gi.placement,
            tuple(ComputeInstance(0, ci.slices, Placement(0, ci.slices), None) for ci in gi.cis),
        )
        for i, gi in enumerate(target.instances)
    )
    procs = tuple(
        Process(10_000 + gi.id, 1 << 30, gi.id, 0) for gi in instances if rng.random() < busy
    )
    return GpuLayout(on, layout.profiles, instances, procs)


def scale_fleet(count: int, seed: int) -> list[NodeLayouts]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        name = f"node-{i:04}"
        gpus = preset_layouts(PRESETS[i % len(PRESETS)], name)
        out.append(
            NodeLayouts(
                name, tuple(with_instances(g, rng.choice(TEMPLATES), rng, 0.4) for g in gpus)
            )
        )
    return out


def shifted(fleet: list[NodeLayouts]) -> Demand:
    """Fewer 1g, more 3g and 7g than the fleet holds now."""
    factors = {"1g": 0.8, "2g": 1.0, "3g": 1.3, "4g": 1.0, "7g": 1.5}
    now: Counter[str] = Counter()
    for n in fleet:
        for g in n.gpus:
            if g.gpu.mig_mode and g.gpu.mig_mode.current:
                now.update(current_counts(g))
    return Demand(
        tuple(
            DemandEntry(p, round(n * factors.get(p.split(".")[0], 1.0)))
            for p, n in sorted(now.items())
        )
    )


def timed(fn: Any, repeat: int) -> tuple[float, float, Any]:
    """Median wall and CPU seconds of ``fn``, each run cold (the options caches emptied)."""
    times, cpu, result = [], [], None
    for _ in range(repeat):
        clear_cache()
        started, used = time.perf_counter(), time.process_time()
        result = fn()
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
    return statistics.median(times), statistics.median(cpu), result


def small_fleet(rng: random.Random) -> tuple[list[NodeLayouts], Demand]:
    nodes = []
    for i in range(rng.randint(1, 3)):
        name = f"n{i}"
        base = preset_layouts(rng.choice(SMALL_PRESETS), name)[: rng.randint(1, 4)]
        gpus = []
        for g in base:
            if rng.random() < 0.2:
                gpus.append(g)  # MIG off
                continue
            on = dataclasses.replace(g.gpu, mig_mode=MigMode(True, True))
            names = [p.name for p in g.profiles]
            counts = {rng.choice(names): rng.randint(1, 3) for _ in range(rng.randint(1, 3))}
            target = plan_gpu(
                GpuLayout(on, g.profiles, (), ()), Desired(True, tuple(sorted(counts.items())))
            ).target
            placed = () if target is None else target.instances
            instances = tuple(
                GpuInstance(
                    k + 1,
                    gi.profile_id,
                    gi.profile_name,
                    gi.placement,
                    (ComputeInstance(0, gi.cis[0].slices, Placement(0, gi.cis[0].slices), None),),
                )
                for k, gi in enumerate(placed)
            )
            procs = tuple(
                Process(900 + gi.id, 1 << 30, gi.id, 0) for gi in instances if rng.random() < 0.3
            )
            gpus.append(GpuLayout(on, g.profiles, instances, procs))
        nodes.append(NodeLayouts(name, tuple(gpus)))
    offered = sorted({p.name for n in nodes for g in n.gpus for p in g.profiles})
    chosen = {rng.choice(offered): rng.randint(1, 6) for _ in range(rng.randint(1, 4))}
    return nodes, Demand(tuple(DemandEntry(p, n) for p, n in sorted(chosen.items())))


def greedy_module(ref: str) -> ModuleType:
    """The planner as it was at ``ref``, loaded beside the current one."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{ref}:agent/coordinator/planning/planner.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "greedy_planner.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("greedy_planner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["greedy_planner"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fleets", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--greedy-ref", default="ed261d0", help="git revision of the greedy planner"
    )
    args = parser.parse_args()
    print(f"Command: `{shlex.join(['.venv/bin/python', 'bench/fleet_planner.py', *sys.argv[1:]])}`")
    print()

    fleet = scale_fleet(args.nodes, args.seed)
    demand = shifted(fleet)
    gpus = sum(len(n.gpus) for n in fleet)
    shift_s, shift_cpu, plan = timed(lambda: plan_fleet(fleet, demand), args.repeat)
    idle = [
        NodeLayouts(f"i{i:04}", preset_layouts("dgx-h100", f"i{i:04}")) for i in range(args.nodes)
    ]
    full = Demand((DemandEntry("1g.10gb", 7 * 8 * args.nodes),))
    idle_s, idle_cpu, idle_plan = timed(lambda: plan_fleet(idle, full), args.repeat)
    print("| plan | GPUs | wall s (median) | CPU s | result | goal |")
    print("|---|---:|---:|---:|---|---|")
    print(
        f"| demand shift on the partitioned fleet | {gpus} | {shift_s:.2f} | {shift_cpu:.2f} | "
        f"{len(plan.changes)} "
        f"GPUs change, {plan.created} created, {plan.destroyed} destroyed, "
        f"{sum(u.missing for u in plan.unmet)} short, optimal {plan.optimal} | <= 5 s |"
    )
    print(
        f"| every idle DGX H100 GPU into 7 x 1g | {8 * args.nodes} | {idle_s:.2f} | "
        f"{idle_cpu:.2f} | "
        f"{len(idle_plan.changes)} GPUs change, {idle_plan.created} created, optimal "
        f"{idle_plan.optimal} | <= 5 s |"
    )
    print()

    greedy = greedy_module(args.greedy_ref)
    rng = random.Random(args.seed)
    ours_d = ours_u = greedy_d = greedy_u = proven = 0
    worse = 0
    for _ in range(args.fleets):
        nodes, want = small_fleet(rng)
        ours = plan_fleet(nodes, want)
        old = greedy.plan_fleet(nodes, want)
        proven += ours.optimal
        ours_d += ours.destroyed
        ours_u += sum(u.missing for u in ours.unmet)
        greedy_d += old.destroyed
        greedy_u += sum(u.missing for u in old.unmet)
        worse += old.destroyed > ours.destroyed
    print(f"{args.fleets} random fleets (seed {args.seed}); optimum proven by HiGHS on {proven}:")
    print()
    print("| planner | instances destroyed | devices short | ratio to the optimum (destroyed) |")
    print("|---|---:|---:|---:|")
    print(f"| exact (this) | {ours_d} | {ours_u} | 1.00 |")
    ratio = greedy_d / ours_d if ours_d else float("nan")
    print(f"| greedy ({args.greedy_ref}) | {greedy_d} | {greedy_u} | {ratio:.2f} |")
    print()
    print(f"The greedy plan destroyed more than the optimum on {worse} of {args.fleets} fleets.")


if __name__ == "__main__":
    main()
