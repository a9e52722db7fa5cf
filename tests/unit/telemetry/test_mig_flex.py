"""No double counting on MIG: by default (dcgm-exporter's flex mode, ``telemetry.devices: f``)
a GPU with MIG instances renders its framebuffer and DCP fields per instance only, so a sum
over the GPU is the GPU's figure; ``devices: g`` renders whole-GPU rows only."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from agent.config import TelemetrySettings
from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from agent.telemetry.gpm import MIN_WINDOW_S
from agent.telemetry.service import build_telemetry

_MIB = 2048


def _node(state: Path) -> None:
    driver = open_driver("dgx-h100", state)
    uuid = driver.gpus()[0].uuid
    driver.set_mig_mode(uuid, True)
    profile = next(p for p in driver.gi_profiles(uuid) if p.name == "3g.40gb")
    gis = [driver.create_gpu_instance(uuid, profile.id, where) for where in profile.placements]
    for gi in gis:
        driver.create_compute_instance(uuid, gi.id, driver.ci_profiles(uuid, gi.id)[-1].id)
    SimControl(state).start_process(
        4242, 0, used_memory_mib=_MIB, gpu_instance=gis[1].id, compute_instance=0
    )
    SimControl(state).set_workload(0, gpu_instance=gis[0].id, tensor_active=0.5)
    driver.close()


def _scrape(state: Path, devices: str) -> str:
    driver = open_driver("dgx-h100", state)
    settings = TelemetrySettings(kubelet_socket=state / "absent.sock", devices=devices)
    service = build_telemetry(driver, settings, hostname="n", attribute_pods=False)
    service.sampler.tick()  # seeds GPM (the DCP fields): a rate needs two samples
    time.sleep(MIN_WINDOW_S)  # at least NVML's refresh apart, or the window has no value
    service.sampler.tick()
    body, _ = service.exporter.render("text/plain")
    driver.close()
    return body.decode()


def _rows(text: str, name: str, gpu: str) -> list[tuple[str, float]]:
    """(GPU_I_ID or "" for the whole GPU, value) of each row of ``name`` on ``gpu``."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") and f'gpu="{gpu}"' in line:
            gi = re.search(r'GPU_I_ID="(\d+)"', line)
            out.append((gi.group(1) if gi else "", float(line.rsplit(" ", 1)[1])))
    return out


def test_flex_sums_over_a_mig_gpu_equal_the_memory_in_use(tmp_path: Path) -> None:
    _node(tmp_path)
    text = _scrape(tmp_path, "f")
    used = _rows(text, "DCGM_FI_DEV_FB_USED", "0")
    assert all(gi for gi, _ in used) and len(used) == 2  # instances only: no whole-GPU row
    assert sum(v for _, v in used) == _MIB
    tensor = _rows(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0")
    assert len(tensor) == 2 and all(gi for gi, _ in tensor), tensor  # per instance, as FB_USED
    assert sorted(v for _, v in tensor) == [0.0, 0.5]  # the one busy instance's own activity
    # GPU-level fields stay on the GPU, once.
    assert [gi for gi, _ in _rows(text, "DCGM_FI_DEV_POWER_USAGE", "0")] == [""]
    # A GPU without MIG keeps its whole-GPU rows.
    assert [gi for gi, _ in _rows(text, "DCGM_FI_DEV_FB_USED", "1")] == [""]


@pytest.mark.parametrize("name", ["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"])
def test_devices_g_renders_whole_gpu_rows_only(tmp_path: Path, name: str) -> None:
    _node(tmp_path)
    rows = _rows(_scrape(tmp_path, "g"), name, "0")
    assert [gi for gi, _ in rows] == [""]
