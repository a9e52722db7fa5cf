#!/usr/bin/env python3
"""Hold a real GPU against the simulator, and the agent against the real GPU (issue 39).

READ-ONLY: no MIG mode, instance, power limit, clock or reset is changed. Three parts, about
one to two minutes on one GPU (at most 8):

1. **record**: every NVML answer the agent's read paths use (agent.doctor.gpu_record: identity,
   memory, power range, which readings answer, MIG mode, GI profiles and placements, GPM
   metrics, event types), for the real GPU and for the simulator's model with the same PCI
   device id, diffed field by field.
2. **agent**: the real agent (`gpu-agent serve`, a throwaway state dir, no Kubernetes) on this
   GPU for an idle phase and a load phase: a bf16 matmul with host<->device copies when torch
   is present, idle otherwise. The exported tensor-active, DRAM-active, SM-active, PCIe and
   power series (dcgm-exporter's names) must be there and must move with the load.
3. **doctor**: `gpu-agent doctor -o json` against that agent.

Prints one JSON document. Exit 0 when everything agrees, 1 when anything differs or a series
is missing or did not move, 2 when there is no GPU.

    python3 scripts/device-check.py [--gpu INDEX] [--phase-s 20] [--load auto|matmul|none]

``--sim-preset``/``--sim-state`` run the agent and its load on the simulator instead (the
suite's CPU-side run: tests/integration/test_device_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.doctor.gpu_record import differences, record_gpu  # noqa: E402
from agent.errors import AgentError  # noqa: E402
from agent.gpu.nvml import GpuDriver  # noqa: E402

#: The series a load must move, under dcgm-exporter's names.
MOVING_SERIES = (
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_DEV_POWER_USAGE",
)
_SERVING = re.compile(r"agent serving: metrics [^ ]*:(\d+)")
_SAMPLE = re.compile(r"^([A-Z_]+)\{([^}]*)\} ([-+0-9.eEinfa]+)$", re.M)

#: A bf16 matmul loop with pinned host<->device copies (PCIe), for ``phase_s`` seconds.
_MATMUL = """
import sys, time, torch
gpu, seconds = int(sys.argv[1]), float(sys.argv[2])
dev = torch.device("cuda", gpu)
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
host = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
end = time.time() + seconds
while time.time() < end:
    for _ in range(8):
        a = (a @ a).clamp_(-1, 1)
    back = host.to(dev, non_blocking=True).cpu()
    torch.cuda.synchronize(dev)
"""


def simulated_record(pci_device_id: int) -> dict[str, Any] | None:
    """The same record read from a throwaway simulated node holding the same model."""
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
            return record_gpu(driver, preset.gpus.index(model.key))
        finally:
            driver.close()


def record_part(gpu: int) -> tuple[dict[str, Any] | None, int]:
    """Part 1: (the report's record section, or None and exit 2 without a GPU)."""
    import pynvml

    driver = GpuDriver(pynvml)
    try:
        driver.open()
    except AgentError as exc:
        return {"error": str(exc)}, 2
    try:
        real = record_gpu(driver, gpu)
    finally:
        driver.close()
    sim = simulated_record(int(real["facts"]["pci_device_id"], 16))
    if sim is None:
        found = [f"no simulator model has PCI device id {real['facts']['pci_device_id']}"]
    else:
        found = differences(real["facts"], sim["facts"])
    return {"real": real, "simulated": sim, "differences": found}, 0


# -- part 2: the agent on this GPU -------------------------------------------------------------


class Agent:
    """`gpu-agent serve` on a throwaway state dir, its metrics port read from its log."""

    def __init__(self, work: Path, sim: tuple[str, Path] | None) -> None:
        self.work = work
        self.config = work / "config.yaml"
        self.config.write_text(
            json.dumps(
                {
                    "state_dir": str(sim[1] if sim else work / "state"),
                    "socket_path": str(work / "agent.sock"),
                    "metrics_listen": "127.0.0.1:0",
                    "grpc_listen": "127.0.0.1:0",
                    "sharing": {"config_path": str(work / "plugin.yaml"), "reload": "none"},
                    "prewarm": {"cache_dir": str(work / "cache")},
                    "telemetry": {"interval_s": 0.5, "kubelet_socket": str(work / "no.sock")},
                }
            )
        )
        self.argv = [sys.executable, "-m", "agent.cli.main", "--config", str(self.config)]
        if sim is not None:
            self.argv += ["--simulate", sim[0]]
        self.log = work / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self, timeout_s: float = 60.0) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*self.argv, "serve"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = _SERVING.search(self.log.read_text(errors="replace"))
            if found:
                self.port = int(found.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the agent did not start: {self.log.read_text()[-2000:]}")

    def scrape(self) -> str:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()

    def cli(self, *args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.argv, *args], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT
        )

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def series_of(text: str, gpu: int) -> dict[str, float]:
    """The moving series of GPU ``gpu`` (the whole-GPU series, not its MIG instances)."""
    out: dict[str, float] = {}
    for name, labels, value in _SAMPLE.findall(text):
        if name in MOVING_SERIES and f'gpu="{gpu}"' in labels and "GPU_I_ID" not in labels:
            out[name] = float(value)
    return out


def observe(agent: Agent, gpu: int, seconds: float) -> dict[str, list[float]]:
    """Each moving series' values, scraped every second for ``seconds``."""
    seen: dict[str, list[float]] = {name: [] for name in MOVING_SERIES}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, value in series_of(agent.scrape(), gpu).items():
            seen[name].append(value)
        time.sleep(1.0)
    return seen


def verdicts(
    idle: dict[str, list[float]], busy: dict[str, list[float]], loaded: bool
) -> dict[str, dict[str, Any]]:
    """Per series: missing, present (no load ran), moved, or did not move."""
    out: dict[str, dict[str, Any]] = {}
    for name in MOVING_SERIES:
        a, b = idle[name], busy[name]
        if not a or not b:
            out[name] = {"state": "missing", "idle": a, "load": b}
            continue
        quiet, loud = statistics.fmean(a), statistics.fmean(b)
        if not loaded:
            state = "present"
        else:
            state = "moved" if loud > quiet * 1.2 + 1e-3 else "did not move"
        out[name] = {"state": state, "idle_mean": quiet, "load_mean": loud}
    return out


def start_load(kind: str, gpu: int, seconds: float, sim: tuple[str, Path] | None) -> Any:
    """The load of the load phase: a handle whose end is `end_load`; None for no load."""
    if sim is not None:
        from agent.gpu.sim import SimControl

        control = SimControl(sim[1])
        control.set_workload(
            gpu, sm_active=0.9, tensor_active=0.7, dram_active=0.6,
            pcie_tx_bytes_per_s=4e9, pcie_rx_bytes_per_s=4e9,
        )  # fmt: skip
        return control
    if kind == "none":
        return None
    try:
        import torch  # noqa: F401
    except ImportError:
        if kind == "matmul":
            raise
        return None
    return subprocess.Popen([sys.executable, "-c", _MATMUL, str(gpu), str(seconds + 5)])


def end_load(load: Any, gpu: int) -> None:
    if isinstance(load, subprocess.Popen):
        load.terminate()
        load.wait(timeout=30)
    elif load is not None:
        load.clear_workload(gpu)


def agent_part(args: argparse.Namespace) -> dict[str, Any]:
    """Parts 2 and 3: the agent's series idle and under load, then its doctor."""
    sim = (args.sim_preset, Path(args.sim_state)) if args.sim_preset else None
    with tempfile.TemporaryDirectory() as work:
        agent = Agent(Path(work), sim)
        agent.start()
        try:
            time.sleep(2 * 0.5 + 1)  # two sampler ticks: GPM rates need a previous sample
            idle = observe(agent, args.gpu, args.phase_s)
            load = start_load(args.load, args.gpu, args.phase_s, sim)
            try:
                time.sleep(2.0)  # let the load ramp up and the sampler see it
                busy = observe(agent, args.gpu, args.phase_s)
            finally:
                end_load(load, args.gpu)
            doctor = agent.cli("doctor", "-o", "json")
        finally:
            exit_code = agent.stop()
    try:
        checks = json.loads(doctor.stdout)
    except json.JSONDecodeError:
        checks = {"error": (doctor.stderr or doctor.stdout)[-2000:]}
    return {
        "load": "none" if load is None else ("simulated" if sim else "bf16 matmul"),
        "series": verdicts(idle, busy, load is not None),
        "agent_exit": exit_code,
        "doctor": {"exit": doctor.returncode, **checks},
    }


def failures(report: dict[str, Any]) -> list[str]:
    found = list(report["record"].get("differences", []))
    agent = report.get("agent")
    if agent is not None:
        found += [
            f"{name}: {v['state']}"
            for name, v in agent["series"].items()
            if v["state"] in ("missing", "did not move")
        ]
        if agent["agent_exit"] != 0:
            found.append(f"the agent exited {agent['agent_exit']} on SIGTERM")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", type=int, default=0, help="GPU index to check (default 0)")
    parser.add_argument("--phase-s", type=float, default=20.0, help="idle and load phase length")
    parser.add_argument("--load", choices=("auto", "matmul", "none"), default="auto")
    parser.add_argument("--skip-agent", action="store_true", help="part 1 only")
    parser.add_argument("--sim-preset", help=argparse.SUPPRESS)
    parser.add_argument("--sim-state", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    record, code = record_part(args.gpu)
    report: dict[str, Any] = {"record": record}
    if code == 0 and not args.skip_agent:
        report["agent"] = agent_part(args)
    if code == 0:
        report["failures"] = failures(report)
        code = 1 if report["failures"] else 0
    print(json.dumps(report, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
