"""A GPU lost before the agent started: one ``gpu_agent_gpu_up`` series, stable while it stays
lost, labelled only by what NVML answered of it.

GpuAgentGpuLost (deploy/prometheus/gpu-agent.rules.yaml) keys its alert by the series' whole
label set: a lost GPU whose labels change while it stays lost resolves the alert and pends it
anew. The faults are the simulator's ("fail the Nth call of F on GPU N with E").
"""

from __future__ import annotations

from pathlib import Path

import pynvml
from prometheus_client.parser import text_string_to_metric_families as parse

from agent.config import TelemetrySettings
from agent.gpu import GpuDriver, open_driver
from agent.gpu.sim import SimControl
from agent.telemetry.service import TelemetryService, build_telemetry

_LOST = pynvml.NVML_ERROR_GPU_IS_LOST


def _service(tmp_path: Path, driver: GpuDriver, native: bool = False) -> TelemetryService:
    csv = tmp_path / "c.csv"
    csv.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, temperature\n")
    settings = TelemetrySettings(
        kubelet_socket=tmp_path / "absent.sock",
        collectors=csv,
        metric_names="native" if native else "dcgm",
    )
    return build_telemetry(driver, settings, hostname="n", attribute_pods=False)


def _up_series(service: TelemetryService, gpu: str) -> list[tuple[dict[str, str], float]]:
    """GPU ``gpu``'s gpu_agent_gpu_up samples: (labels, value)."""
    service.sampler.tick()
    text = service.exporter.render("text/plain")[0].decode()
    return [
        (dict(s.labels), s.value)
        for family in parse(text)
        if family.name == "gpu_agent_gpu_up"
        for s in family.samples
        if s.labels["gpu"] == gpu
    ]


def test_a_gpu_lost_from_the_start_keeps_one_series_while_more_of_it_answers(
    tmp_path: Path,
) -> None:
    """GPU 3's handle cannot be opened at start; from the second tick its handle and identity
    answer while its other calls still say GPU_IS_LOST. Its series is the same one, value 0,
    every tick, with no empty or guessed label, until it answers again."""
    state = tmp_path / "state"
    driver = open_driver("dgx-h100", state)
    control = SimControl(state)
    control.inject_fault("nvmlDeviceGetHandleByIndex", _LOST, gpu=3)
    control.inject_fault("nvmlDeviceGetMigMode", _LOST, gpu=3, count=1000)
    service = _service(tmp_path, driver)
    try:
        ticks = [_up_series(service, "3") for _ in range(3)]
        (first,) = ticks[0]
        assert first == ({"gpu": "3", "Hostname": "n"}, 0.0)
        assert ticks[1] == ticks[2] == [first], "the lost GPU's labels changed while it was lost"

        control.clear_faults()
        ((back, value),) = _up_series(service, "3")
    finally:
        driver.close()
    assert value == 1.0 and back["UUID"].startswith("GPU-") and back["device"] == "nvidia3"


def test_a_gpu_lost_at_start_is_labelled_by_the_bus_id_and_uuid_nvml_still_answers(
    tmp_path: Path,
) -> None:
    """Its handle opens and the PCI bus id and UUID answer, then its name says GPU_IS_LOST:
    the series names the GPU by those two, in both naming schemes, and leaves out the model
    and /dev/nvidia<N> it could not read."""
    for native in (False, True):
        state = tmp_path / f"state-{native}"
        driver = open_driver("dgx-h100", state)
        uuid, bus_id = driver.gpus()[3].uuid, driver.gpus()[3].pci_bus_id
        SimControl(state).inject_fault("nvmlDeviceGetName", _LOST, gpu=3, count=1000)
        service = _service(tmp_path, driver, native=native)
        try:
            ticks = [_up_series(service, "3") for _ in range(2)]
        finally:
            driver.close()
        want = (
            {"gpu": "3", "uuid": uuid}
            if native
            else {"gpu": "3", "UUID": uuid, "pci_bus_id": bus_id, "Hostname": "n"}
        )
        assert ticks == [[(want, 0.0)]] * 2
