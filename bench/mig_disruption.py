#!/usr/bin/env python3
"""MIG reconfiguration: instances disrupted by our plan vs mig-parted, and plan time on 8 GPUs.

For each transition a simulated DGX A100 (8 GPUs) is brought to the "from" layout on every GPU,
with the listed workloads running, and asked for the "to" layout:

* ours: ``MigService.plan`` then ``apply`` on the simulated driver with its NVML latency model
  (agent/gpu/sim/latency.py; mutation costs there are estimates). Disrupted = instances the plan
  destroys; instances with running processes are never destroyed: the plan is refused instead.
* mig-parted, as reference/mig.md §3.3 documents its apply: a GPU whose counts per profile differ
  is cleared (every CI, then every GI) and rebuilt; a GPU whose counts match is left alone.
  Computed from the same layouts, not run (it is a Go binary that needs a real driver); with a
  process on any instance of a changed GPU its clear fails with IN_USE. Its mutation time is
  the same latency model applied to its NVML calls.
* plan time: the median over ``--repeat`` runs of planning the whole node, with the NVML reads
  (``MigService.plan``) and without them (8 x ``plan_gpu`` on layouts already read).

    .venv/bin/python bench/mig_disruption.py            # prints a markdown table
    .venv/bin/python bench/mig_disruption.py --repeat 50
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.errors import Busy  # noqa: E402
from agent.gpu import open_driver  # noqa: E402
from agent.gpu.sim import SimControl  # noqa: E402
from agent.gpu.sim.latency import seconds  # noqa: E402
from agent.gpu.types import GpuLayout  # noqa: E402
from agent.mig.desired import Desired, counts_of, current_counts, resolve  # noqa: E402
from agent.mig.lock import PartitionLock  # noqa: E402
from agent.mig.plan import mig_parted_destroys, plan_gpu  # noqa: E402
from agent.mig.reset import simulated_reset  # noqa: E402
from agent.mig.service import MigService  # noqa: E402
from agent.mig.spec import MigSpec, parse_spec  # noqa: E402
from agent.state import StateStore  # noqa: E402

PRESET = "dgx-a100"
BALANCED = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}


@dataclass(frozen=True)
class Transition:
    name: str
    before: dict[str, int]
    after: dict[str, int]
    #: (profile, start) of the instances with a running process, on every GPU
    busy: tuple[tuple[str, int], ...] = field(default=())


TRANSITIONS = (
    Transition("all-balanced -> 3g + 4x1g", BALANCED, {"3g.20gb": 1, "1g.5gb": 4}),
    Transition(
        "all-1g -> all-balanced, 1g at slices 0-1 busy",
        {"1g.5gb": 7},
        BALANCED,
        (("1g.5gb", 0), ("1g.5gb", 1)),
    ),
    Transition(
        "all-1g -> all-balanced, 1g at slices 5-6 busy",
        {"1g.5gb": 7},
        BALANCED,
        (("1g.5gb", 5), ("1g.5gb", 6)),
    ),
    Transition("7g -> 4g + 3g", {"7g.40gb": 1}, {"4g.20gb": 1, "3g.20gb": 1}),
    Transition(
        "3g + 2g + 1g -> add one 1g",
        {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1},
        {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2},
    ),
    Transition("3g + 3g -> 3g + 3x1g", {"3g.20gb": 2}, {"3g.20gb": 1, "1g.5gb": 3}),
    Transition(
        "2x2g + 3x1g -> 3x2g + 1g", {"2g.10gb": 2, "1g.5gb": 3}, {"2g.10gb": 3, "1g.5gb": 1}
    ),
    Transition("3g + 4x1g -> 3g (shrink)", {"3g.20gb": 1, "1g.5gb": 4}, {"3g.20gb": 1}),
    Transition("all-1g -> 2x3g (nothing can stay)", {"1g.5gb": 7}, {"3g.20gb": 2}),
)


def spec_of(before: dict[str, int], after: dict[str, int]) -> MigSpec:
    def entry(counts: dict[str, int]) -> str:
        body = ", ".join(f"{k}: {v}" for k, v in counts.items())
        return f"[{{devices: all, mig-enabled: true, mig-devices: {{{body}}}}}]"

    return parse_spec(f"version: v1\nmig-configs:\n  from: {entry(before)}\n  to: {entry(after)}\n")


def service(state_dir: Path, *, latency: bool) -> MigService:
    driver = open_driver(PRESET, state_dir, latency=latency)
    store = StateStore(state_dir / "agent.db")
    return MigService(driver, store, PartitionLock(state_dir), simulated_reset(state_dir))


# The NVML function behind each of our plan's steps, for the latency model.
STEP_CALLS = {
    "destroy-ci": "nvmlComputeInstanceDestroy",
    "destroy-gi": "nvmlGpuInstanceDestroy",
    "set-mode": "nvmlDeviceSetMigMode",
    "create-gi": "nvmlDeviceCreateGpuInstanceWithPlacement",
    "create-ci": "nvmlGpuInstanceCreateComputeInstance",
}


def mig_parted_cost(layout: GpuLayout, desired: Desired) -> tuple[int, float]:
    """NVML mutations mig-parted's apply makes on one GPU, and their modelled seconds."""
    shapes = resolve(desired, layout)
    if current_counts(layout) == counts_of(shapes):
        return 0, 0.0
    calls = [
        ("nvmlComputeInstanceDestroy", sum(len(gi.compute_instances) for gi in layout.instances)),
        ("nvmlGpuInstanceDestroy", len(layout.instances)),
        ("nvmlDeviceCreateGpuInstance", len(shapes)),
        ("nvmlGpuInstanceCreateComputeInstance", sum(len(s.cis) for s in shapes)),
    ]
    return sum(n for _, n in calls), sum(n * seconds(fn) for fn, n in calls)


@dataclass
class Row:
    name: str
    before: int
    ours_destroyed: int
    ours_kept: int
    ours_mutations: int
    ours_model_s: float
    ours_apply_s: float | None  # measured wall time; None: refused (blocked)
    ours_note: str
    parted_destroyed: int
    parted_mutations: int
    parted_model_s: float
    parted_note: str
    plan_ms: float
    pure_plan_ms: float


def measure(t: Transition, repeat: int) -> Row:
    with tempfile.TemporaryDirectory() as tmp:
        state_dir = Path(tmp)
        spec = spec_of(t.before, t.after)
        setup = service(state_dir, latency=False)
        setup.apply(spec, "from")
        control = SimControl(state_dir)
        pid = 1000
        for layout in setup.layouts():
            for gi in layout.instances:
                if (gi.profile_name, gi.placement.start) in t.busy:
                    pid += 1
                    control.start_process(
                        pid, layout.gpu.index, used_memory_mib=256, gpu_instance=gi.id
                    )
        ours = service(state_dir, latency=True)
        layouts = ours.layouts()
        desired = Desired(True, tuple(t.after.items()))
        plan_times, pure_times = [], []
        for _ in range(repeat):
            start = time.perf_counter()
            plan = ours.plan(spec, "to")
            plan_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            for layout in layouts:
                plan_gpu(layout, desired)
            pure_times.append(time.perf_counter() - start)
        parted = [mig_parted_cost(layout, desired) for layout in layouts]
        model_s = sum(seconds(STEP_CALLS[step.action]) for p in plan.gpus for step in p.steps)
        busy_gpus = sum(
            1 for layout in layouts if layout.processes and mig_parted_destroys(layout, desired)
        )
        start = time.perf_counter()
        try:
            result = ours.apply(spec, "to")
            apply_s: float | None = time.perf_counter() - start
            mutations, note = result.mutations, ""
        except Busy as exc:
            apply_s, mutations = None, 0
            note = f"refused before any change: {len(exc.blockers)} busy instances would go"
        return Row(
            t.name,
            sum(len(layout.instances) for layout in layouts),
            sum(len(p.destroy) for p in plan.gpus) if apply_s is not None else 0,
            sum(len(p.keep) for p in plan.gpus),
            mutations,
            model_s if apply_s is not None else 0.0,
            apply_s,
            note,
            sum(mig_parted_destroys(layout, desired) for layout in layouts),
            sum(n for n, _ in parted),
            sum(s for _, s in parted),
            f"clear fails with IN_USE on {busy_gpus} GPUs" if busy_gpus else "",
            statistics.median(plan_times) * 1000,
            statistics.median(pure_times) * 1000,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="plan timings per transition")
    args = parser.parse_args()
    rows = [measure(t, args.repeat) for t in TRANSITIONS]
    print(
        f"Command: `{shlex.join(['.venv/bin/python', 'bench/mig_disruption.py', *sys.argv[1:]])}`"
    )
    print()
    print(f"Node: simulated {PRESET} (8x A100-SXM4-40GB); every GPU makes the same transition.")
    print()
    print(
        "| transition (per GPU) | instances before | ours: destroyed / kept "
        "| mig-parted: destroyed | NVML mutations ours / mig-parted "
        "| mutation s (model) ours / mig-parted | ours apply s (wall) "
        "| plan ms, 8 GPUs: with reads / planner only |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        refused = r.ours_apply_s is None
        ours = "0 (refused)" if refused else f"{r.ours_destroyed} / {r.ours_kept}"
        parted = f"{r.parted_destroyed}" + (f" ({r.parted_note})" if r.parted_note else "")
        wall = "-" if r.ours_apply_s is None else f"{r.ours_apply_s:.1f}"
        print(
            f"| {r.name} | {r.before} | {ours} | {parted} "
            f"| {r.ours_mutations} / {r.parted_mutations} "
            f"| {r.ours_model_s:.1f} / {r.parted_model_s:.1f} | {wall} "
            f"| {r.plan_ms:.0f} / {r.pure_plan_ms:.1f} |"
        )
    total_ours = sum(r.ours_destroyed for r in rows)
    total_parted = sum(r.parted_destroyed for r in rows)
    print()
    print(
        f"Instances destroyed over all transitions: ours {total_ours}, mig-parted {total_parted}."
    )
    for r in rows:
        if r.ours_note:
            print(f"- {r.name}: ours {r.ours_note}.")


if __name__ == "__main__":
    main()
