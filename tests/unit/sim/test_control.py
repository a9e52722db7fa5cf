"""SimControl: the node as tests and ``gpu-agent sim`` see and change it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.errors import Conflict, InvalidSpec, NotFound
from agent.gpu.sim import SimControl

from .conftest import Opener, create_at, enable_mig


def test_describe_is_json_and_shows_the_whole_node(node: Opener) -> None:
    nvml, control = node("dgx-a100")
    handle = enable_mig(nvml, 0)
    gi = create_at(nvml, handle, 9, 4, 4)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    control.set_workload(0, gpu_instance=2, sm_active=0.5)
    control.start_process(10, 0, gpu_instance=2, used_memory_mib=100, cgroup="0::/pod")
    control.add_holder(1, "dcgm")
    control.inject_fault("nvmlGpuInstanceDestroy", "InUse")
    view = json.loads(json.dumps(control.describe()))
    assert view["preset"] == "dgx-a100"
    gpu0 = view["gpus"][0]
    assert gpu0["mig"] == {"current": True, "pending": True}
    (instance,) = gpu0["gpu_instances"]
    assert (instance["id"], instance["profile"], instance["placement"]) == (
        2,
        "3g.20gb",
        {"start": 4, "size": 4},
    )
    assert instance["workload"] == {"sm_active": 0.5}
    assert instance["compute_instances"][0]["profile"] == "1c.3g.20gb"
    assert instance["compute_instances"][0]["uuid"].startswith("MIG-")
    assert view["gpus"][1]["holders"] == ["dcgm"]
    assert view["processes"][0]["pid"] == 10
    assert view["faults"][0]["error"] == "NVMLError_InUse"


def test_control_needs_an_existing_node(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="--simulate PRESET"):
        SimControl(tmp_path)


def test_unknown_gpu_instance_or_pid(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    enable_mig(nvml, 0)
    with pytest.raises(NotFound):
        control.set_workload(0, gpu_instance=1, sm_active=0.1)
    with pytest.raises(NotFound):
        control.stop_process(1)
    with pytest.raises(NotFound):
        control.set_workload(8)
    with pytest.raises(NotFound):
        control.remove_holder(0, "dcgm")


def test_a_pid_runs_once_per_node(node: Opener) -> None:
    _, control = node("dgx-h100")
    control.start_process(5, 0, used_memory_mib=1)
    with pytest.raises(Conflict):
        control.start_process(5, 1, used_memory_mib=1)


def test_workload_on_a_gi_without_compute_instance_is_refused(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    create_at(nvml, enable_mig(nvml, 0), 0, 0, 8)
    with pytest.raises(InvalidSpec, match="compute instance"):
        control.set_workload(0, gpu_instance=0, sm_active=0.2)


def test_rejected_input_changes_nothing(node: Opener) -> None:
    _, control = node("dgx-h100")
    before = control.describe()
    with pytest.raises(InvalidSpec):
        control.set_workload(0, sm_active=0.5, tensor_active=2.0)
    with pytest.raises(InvalidSpec):
        control.inject_fault("nvmlDeviceGetCount", "InUse", nth=0)
    with pytest.raises(InvalidSpec):
        control.raise_xid(0, 0)
    assert control.describe() == before


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda c: c.raise_xid(0, 99_999_999_999), "xid"),
        (lambda c: c.start_process(2**32, 0, used_memory_mib=1), "pid"),
        (lambda c: c.memory_errors(0, dbe=2**64), "dbe"),
        (lambda c: c.memory_errors(0, sbe=2**64), "sbe"),
        (lambda c: c.memory_errors(0, dbe=2**32), "dbe"),
    ],
    ids=["xid", "pid", "dbe-ecc", "sbe-ecc", "dbe-remap"],
)
def test_a_number_no_driver_reports_is_refused_naming_it(
    node: Opener, change: Callable[[SimControl], None], field: str
) -> None:
    """`sim xid 0 99999999999` was queued, and the running agent's inventory then failed to
    put it in the API's 32-bit XidEvent and stopped the whole agent; `sim process start
    99999999999` ran a process that `status` showed as pid 1215752191 (NVML's pid is 32-bit);
    `sim ecc 0 --dbe 18446744073709551616` wrapped NVML's 64-bit ECC counter (and the 32-bit
    remapped-row count) to 0, so the GPU stayed healthy with no word said. No such number
    exists on a real node (the XID and NVML's pid are 32-bit, the counters wrap): each is
    refused naming the field, and nothing changes. A pid above the kernel's pid_max stays
    allowed: a simulated-only process no host tool finds."""
    _, control = node("dgx-h100")
    before = control.describe()
    with pytest.raises(InvalidSpec) as raised:
        change(control)
    assert [v.field for v in raised.value.violations] == [field]
    assert control.describe() == before


def test_remapped_rows_applied_by_resets_count_toward_the_32_bit_limit(node: Opener) -> None:
    """A reset turns pending rows into the uncorrectable count NVML reports; the room was
    counted from the pending ones alone, so errors then a reset, then errors again, passed
    the 32-bit count."""
    _, control = node("dgx-h100")
    control.memory_errors(0, dbe=2**32 - 2)
    control.reset_gpu(0)
    with pytest.raises(InvalidSpec, match="at most 1 more"):
        control.memory_errors(0, dbe=2)
    control.memory_errors(0, dbe=1)


def test_a_pid_above_any_kernels_pid_max_runs_as_a_simulated_only_process(node: Opener) -> None:
    """A pid past Linux's largest pid_max (2^22) is what tests use for a process no host tool
    finds; NVML carries it (32-bit), so the simulator takes it."""
    _, control = node("dgx-h100")
    control.start_process((1 << 22) + 4242, 0, used_memory_mib=1)
    assert [p["pid"] for p in control.describe()["processes"]] == [(1 << 22) + 4242]


def test_a_held_function_blocks_its_calls_until_released_and_others_go_on(node: Opener) -> None:
    nvml, control = node("dgx-a100")
    control.hold("nvmlDeviceGetTemperature")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    done = threading.Event()
    read: list[int] = []

    def reader() -> None:
        read.append(nvml.nvmlDeviceGetTemperature(handle, 0))
        done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert nvml.nvmlDeviceGetName(handle)  # another function answers meanwhile
    assert not done.wait(0.3)  # held: a bounded look, the assertion after release is the proof
    control.release("nvmlDeviceGetTemperature")
    assert done.wait(30) and read and read[0] > 0
    thread.join(30)


def test_holding_a_name_that_is_no_nvml_function_is_refused(node: Opener) -> None:
    _, control = node("dgx-a100")
    with pytest.raises(InvalidSpec, match="nvmlDeviceGetTemprature"):
        control.hold("nvmlDeviceGetTemprature")
