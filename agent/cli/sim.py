"""``gpu-agent sim …``: drive the simulated GPU driver from a shell (workloads, processes, faults).

These commands work on the simulator's state file under --state-dir, so they act on the same
simulated node whether or not an agent is running against it.
"""

from __future__ import annotations

from typing import Any

import click

from agent.cli.context import CliContext
from agent.cli.errors import AgentGroup
from agent.cli.options import finite_number
from agent.cli.render import emit, format_table, output_option
from agent.errors import FieldViolation, InvalidSpec


def _control(obj: CliContext) -> Any:
    from agent.gpu.sim import SimControl, open_simulator

    cfg = obj.config
    if not cfg.simulate:
        raise InvalidSpec(
            "`gpu-agent sim` needs a simulated node: pass --simulate PRESET (or GPU_AGENT_SIMULATE)"
        )
    open_simulator(cfg.state_dir, cfg.simulate)  # creates the node from the preset, or checks it
    return SimControl(cfg.state_dir)


@click.group(cls=AgentGroup)
def sim() -> None:
    """Drive the simulated GPU node: workloads, processes, faults, reset, reboot.

    \b
    Example:
      export GPU_AGENT_SIMULATE=dgx-h100 GPU_AGENT_STATE_DIR=/tmp/node
      gpu-agent sim workload 0 --tensor 0.6 --dram 0.4
      gpu-agent sim process start 4242 --gpu 0 --memory-mib 2048
    """


@sim.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("program")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def exec_(obj: CliContext, program: str, args: tuple[str, ...]) -> None:
    """Run PROGRAM unmodified on the simulated node: its Python processes import the simulator
    as pynvml (nvitop, gpustat, nvidia-ml-py's examples, your own code).

    PROGRAM replaces this process, so the exit code is PROGRAM's; 127 when it is not found and
    126 when it cannot run, as with env(1). Python programs must run on the interpreter
    gpu-node-agent is installed in (the simulator is loaded through a sitecustomize on
    PYTHONPATH); other programs see GPU_AGENT_SIMULATE and GPU_AGENT_STATE_DIR.

    \b
    Example:
      gpu-agent --simulate dgx-h100 --state-dir /tmp/node sim exec -- nvitop -1
    """
    import os

    from agent.gpu.sim.launch import exec_environment

    _control(obj)  # the node exists (created from the preset) before the program looks
    cfg = obj.config
    assert cfg.simulate  # _control refused otherwise
    env = exec_environment(os.environ, cfg.simulate, cfg.state_dir)
    try:
        os.execvpe(program, [program, *args], env)
    except OSError as exc:
        # As env(1) and shells: 127 not found, 126 found but not runnable; never 1, which
        # PROGRAM itself may exit with.
        click.echo(f"error: cannot run {program!r}: {exc.strerror or exc}", err=True)
        raise SystemExit(127 if isinstance(exc, FileNotFoundError) else 126) from exc


@sim.command("presets")
@output_option
def presets(output: str) -> None:
    """List the simulated node presets.

    \b
    Example:
      gpu-agent sim presets
    """
    from agent.gpu.sim.presets import PRESETS

    rows = [
        {
            "name": p.name,
            "gpus": len(p.gpus),
            "models": sorted(set(p.gpus)),
            "driver": p.driver_version,
            "description": p.description,
        }
        for p in PRESETS.values()
    ]
    emit(
        rows,
        output,
        lambda r: format_table(
            ["PRESET", "GPUS", "MODELS", "DRIVER", "DESCRIPTION"],
            [
                [x["name"], x["gpus"], ",".join(x["models"]), x["driver"], x["description"]]
                for x in r
            ],
        ),
    )


@sim.command("show")
@output_option
@click.pass_obj
def show(obj: CliContext, output: str) -> None:
    """Show the simulator's whole state (instances, workloads, processes, faults).

    \b
    Example:
      gpu-agent --simulate dgx-a100 --state-dir /tmp/node sim show -o json
    """
    emit(_control(obj).describe(), output)


_WORKLOAD_FIELDS = {
    "sm": "sm_active",
    "occupancy": "sm_occupancy",
    "tensor": "tensor_active",
    "fp64": "fp64_active",
    "fp32": "fp32_active",
    "fp16": "fp16_active",
    "dram": "dram_active",
}


@sim.command("workload")
@click.argument("gpu", type=int)
@click.option(
    "--gpu-instance", "-g", type=int, default=None, help="MIG GPU instance id (default: whole GPU)."
)
@click.option("--sm", type=float, default=0.0, help="SM active ratio 0..1.")
@click.option("--occupancy", type=float, default=0.0, help="SM occupancy ratio 0..1.")
@click.option("--tensor", type=float, default=0.0, help="Tensor pipe active ratio 0..1.")
@click.option("--fp64", type=float, default=0.0, help="FP64 pipe active ratio 0..1.")
@click.option("--fp32", type=float, default=0.0, help="FP32 pipe active ratio 0..1.")
@click.option("--fp16", type=float, default=0.0, help="FP16 pipe active ratio 0..1.")
@click.option("--dram", type=float, default=0.0, help="DRAM interface active ratio 0..1.")
@click.option("--pcie-tx", type=float, default=0.0, help="PCIe TX bytes/s.")
@click.option("--pcie-rx", type=float, default=0.0, help="PCIe RX bytes/s.")
@click.option("--nvlink-tx", type=float, default=0.0, help="NVLink TX bytes/s.")
@click.option("--nvlink-rx", type=float, default=0.0, help="NVLink RX bytes/s.")
@click.option("--clear", is_flag=True, help="Remove the workload instead.")
@click.pass_obj
def workload(
    obj: CliContext, gpu: int, gpu_instance: int | None, clear: bool, **values: float
) -> None:
    """Start (or --clear) a workload on a GPU or one of its MIG instances.

    \b
    Example:
      gpu-agent sim workload 0 -g 1 --tensor 0.7 --dram 0.5 --pcie-tx 2e9
    """
    control = _control(obj)
    if clear:
        control.clear_workload(gpu, gpu_instance=gpu_instance)
        return
    kwargs: dict[str, float] = {
        _WORKLOAD_FIELDS[k]: v for k, v in values.items() if k in _WORKLOAD_FIELDS
    }
    kwargs.update(
        pcie_tx_bytes_per_s=values["pcie_tx"],
        pcie_rx_bytes_per_s=values["pcie_rx"],
        nvlink_tx_bytes_per_s=values["nvlink_tx"],
        nvlink_rx_bytes_per_s=values["nvlink_rx"],
    )
    control.set_workload(gpu, gpu_instance=gpu_instance, **kwargs)


@sim.group("process", cls=AgentGroup)
def process() -> None:
    """Start or stop a simulated GPU process."""


@process.command("start")
@click.argument("pid", type=int)
@click.option("--gpu", type=int, required=True, help="GPU index.")
@click.option("--memory-mib", type=int, default=1024, show_default=True, help="GPU memory used.")
@click.option("--gpu-instance", "-g", type=int, default=None, help="MIG GPU instance id.")
@click.option("--compute-instance", "-c", type=int, default=None, help="MIG compute instance id.")
@click.option("--cgroup", default=None, help="Text of /proc/<pid>/cgroup (for pod attribution).")
@click.option("--name", default="python", show_default=True, help="Process name.")
@click.pass_obj
def process_start(
    obj: CliContext,
    pid: int,
    gpu: int,
    memory_mib: int,
    gpu_instance: int | None,
    compute_instance: int | None,
    cgroup: str | None,
    name: str,
) -> None:
    """Start a process on a GPU (or MIG instance).

    \b
    Example:
      gpu-agent sim process start 4242 --gpu 0 -g 1 -c 0 --memory-mib 4096 \\
        --cgroup '0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abcd.scope'
    """
    _control(obj).start_process(
        pid,
        gpu,
        used_memory_mib=memory_mib,
        gpu_instance=gpu_instance,
        compute_instance=compute_instance,
        cgroup=cgroup,
        name=name,
    )


@process.command("stop")
@click.argument("pid", type=int)
@click.pass_obj
def process_stop(obj: CliContext, pid: int) -> None:
    """Stop a simulated process.

    \b
    Example:
      gpu-agent sim process stop 4242
    """
    _control(obj).stop_process(pid)


# agent/gpu/sim/faults.py's MAX_CALLS, which it checks again; not imported from there, which
# would load the whole simulator for `sim --help`.
_MAX_CALLS = 2**31 - 1


@sim.command("fault")
@click.argument("function")
@click.argument("error")
@click.option(
    "--nth",
    type=click.IntRange(1, _MAX_CALLS),
    default=1,
    show_default=True,
    help="Fail the Nth call from now (up to 2**31-1).",
)
@click.option(
    "--count",
    type=click.IntRange(1, _MAX_CALLS),
    default=1,
    show_default=True,
    help="How many calls fail from the Nth on (up to 2**31-1).",
)
@click.option("--gpu", type=int, default=None, help="Only calls on this GPU.")
@click.option(
    "--clear", is_flag=True, help="Remove every injected fault instead (FUNCTION ERROR ignored)."
)
@click.pass_obj
def fault(
    obj: CliContext, function: str, error: str, nth: int, count: int, gpu: int | None, clear: bool
) -> None:
    """Make the Nth call of an NVML function fail with a named NVML error.

    \b
    Example:
      gpu-agent sim fault nvmlDeviceCreateGpuInstanceWithPlacement InsufficientResources --nth 2
      gpu-agent sim fault - - --clear
    """
    control = _control(obj)
    if clear:
        control.clear_faults()
    else:
        control.inject_fault(function, error, nth=nth, gpu=gpu, count=count)


@sim.command("lost")
@click.argument("gpu", type=int)
@click.pass_obj
def lost(obj: CliContext, gpu: int) -> None:
    """Mark a GPU as fallen off the bus (every call on it fails with GPU_IS_LOST).

    \b
    Example:
      gpu-agent sim lost 3
    """
    _control(obj).mark_lost(gpu)


@sim.command("xid")
@click.argument("gpu", type=int)
@click.argument("xid", type=int)
@click.option("--gpu-instance", "-g", type=int, default=None, help="MIG GPU instance it concerns.")
@click.pass_obj
def xid(obj: CliContext, gpu: int, xid: int, gpu_instance: int | None) -> None:
    """Raise an XID error event on a GPU (or attributed to one of its MIG instances).

    \b
    Example:
      gpu-agent sim xid 0 79
      gpu-agent sim xid 1 13 -g 2
    """
    _control(obj).raise_xid(gpu, xid, gpu_instance=gpu_instance)


@sim.command("ecc")
@click.argument("gpu", type=int)
@click.option("--sbe", type=int, default=0, help="Corrected (single-bit) errors to add.")
@click.option(
    "--dbe",
    type=int,
    default=0,
    help="Uncorrected (double-bit) errors to add; each leaves a row remap pending until the "
    "next reset.",
)
@click.option("--remap-failure", is_flag=True, help="A row remap found no spare row.")
@click.pass_obj
def ecc(obj: CliContext, gpu: int, sbe: int, dbe: int, remap_failure: bool) -> None:
    """Add ECC memory errors to a GPU (a reset or reboot clears the volatile counts).

    \b
    Example:
      gpu-agent sim ecc 0 --dbe 1
    """
    _control(obj).memory_errors(gpu, sbe=sbe, dbe=dbe, remap_failure=remap_failure)


@sim.command("clocks")
@click.argument("gpu", type=int)
@click.argument("reasons", nargs=-1)
@click.pass_obj
def clocks(obj: CliContext, gpu: int, reasons: tuple[str, ...]) -> None:
    """Hold a GPU's clocks down for REASONS (sw_power_cap, hw_slowdown, sync_boost,
    sw_thermal, hw_thermal, hw_power_brake); none: clocks run free again.

    \b
    Example:
      gpu-agent sim clocks 0 hw_thermal
      gpu-agent sim clocks 0
    """
    _control(obj).hold_clocks(gpu, reasons)


@sim.command("power-writer")
@click.argument("gpu", type=int)
@click.argument("watts", type=finite_number(0, low_open=True), required=False)
@click.pass_obj
def power_writer(obj: CliContext, gpu: int, watts: float | None) -> None:
    """Have another writer of a GPU's power limit (a site power manager, a loop of
    `nvidia-smi -pl`) set WATTS now and right after every set; no WATTS: it stops.

    \b
    Example:
      gpu-agent sim power-writer 0 400
      gpu-agent sim power-writer 0
    """
    _control(obj).write_power_limit(gpu, watts)


@sim.command("holder")
@click.argument("gpu", type=int)
@click.argument("name")
@click.option("--remove", is_flag=True, help="Release the GPU instead.")
@click.pass_obj
def holder(obj: CliContext, gpu: int, name: str, remove: bool) -> None:
    """Have a daemon (nvidia-persistenced, dcgm) hold a GPU open, which blocks a reset.

    \b
    Example:
      gpu-agent sim holder 0 nvidia-persistenced
    """
    control = _control(obj)
    (control.remove_holder if remove else control.add_holder)(gpu, name)


@sim.command("passthrough")
@click.argument("enabled", type=bool)
@click.pass_obj
def passthrough(obj: CliContext, enabled: bool) -> None:
    """Run the node as a passthrough VM (Ampere MIG mode changes then need a reboot).

    \b
    Example:
      gpu-agent sim passthrough true
    """
    _control(obj).set_passthrough_vm(enabled)


@sim.command("reset")
@click.argument("gpu", type=int)
@click.pass_obj
def reset(obj: CliContext, gpu: int) -> None:
    """Reset a GPU as `nvidia-smi -r` would (fails while processes or daemons hold it).

    \b
    Example:
      gpu-agent sim reset 0
    """
    _control(obj).reset_gpu(gpu)


@sim.command("driver")
@click.argument("version")
@click.pass_obj
def driver(obj: CliContext, version: str) -> None:
    """Install another driver version and reboot the node; it decides which NVML calls exist.

    Older generations lack newer symbols (nvmlDeviceGetComputeRunningProcesses_v3 before R510
    and on 535.98, nvmlDeviceGetMemoryInfo_v2 before R510, GPM before R525, ...): pynvml raises
    NVMLError_FunctionNotFound for them, as on a real node. Restart the agent afterwards.

    \b
    Example:
      gpu-agent sim driver 470.256.02
    """
    _control(obj).install_driver(version)


@sim.command("driver-absent")
@click.option(
    "--for",
    "duration",
    default=None,
    metavar="DURATION",
    help="How long, e.g. 30s, 2m or 45 (seconds); default: until `sim driver-present`.",
)
@click.pass_obj
def driver_absent(obj: CliContext, duration: str | None) -> None:
    """Unload the simulated driver, as on a GPU Operator node before its driver container
    arrives or during a driver upgrade: NVML is not found (or answers DRIVER_NOT_LOADED) until
    the time is up or `sim driver-present`. A running agent detaches and attaches again.

    \b
    Example:
      gpu-agent sim driver-absent --for 30s
    """
    _control(obj).driver_absent(None if duration is None else _seconds(duration))


@sim.command("driver-present")
@click.pass_obj
def driver_present(obj: CliContext) -> None:
    """Load the simulated driver again (ends `sim driver-absent`).

    \b
    Example:
      gpu-agent sim driver-present
    """
    _control(obj).driver_present()


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(text: str) -> float:
    value = text.strip()
    scale = _UNITS.get(value[-1:])
    number = value[:-1] if scale is not None else value
    try:
        seconds = float(number) * (scale or 1.0)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise InvalidSpec(
            f"--for must be a duration > 0 such as 30s, 2m or 45, got {text!r}",
            [FieldViolation("for", "a number of seconds > 0, optionally with s, m or h")],
        )
    return seconds


@sim.command("reboot")
@click.pass_obj
def reboot(obj: CliContext) -> None:
    """Reboot the simulated node: MIG instances and processes vanish, MIG mode persists.

    The node gets a new boot id. A running `serve` goes on as if it outlived the reboot;
    restart it, as a real reboot would, to see what an agent starting after a reboot does
    (e.g. a reboot-node health mark ends: docs/health.md).

    \b
    Example:
      gpu-agent sim reboot
    """
    _control(obj).reboot()
