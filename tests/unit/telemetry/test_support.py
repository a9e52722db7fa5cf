"""Which selected fields a GPU cannot provide: logged once per field, reason and GPU model,
one line per reason and set of fields; the gauge's rows keep every GPU's fact."""

from __future__ import annotations

import logging

import pytest

from agent.gpu.readings import GpuIdentity
from agent.telemetry.support import SupportBook
from dcgm.fields import BY_NAME

VGPU = BY_NAME["DCGM_FI_DEV_VGPU_LICENSE_STATUS"]
POWER = BY_NAME["DCGM_FI_DEV_POWER_USAGE"]
UTIL = BY_NAME["DCGM_FI_DEV_GPU_UTIL"]


def test_a_field_with_no_source_by_design_is_said_at_info_not_as_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """dcgm-exporter's default counters select the vGPU license state, which no host GPU has:
    a warning at every start would teach operators to read past warnings. A field that a GPU
    refuses is still a warning, and each is said once."""
    book = SupportBook([VGPU, POWER])
    with caplog.at_level(logging.INFO, logger="agent.telemetry.support"):
        book.note([(0, VGPU.id, "no vGPU"), (1, VGPU.id, "no vGPU"), (1, POWER.id, "refused")])
        book.report()
        book.note([(0, VGPU.id, "no vGPU")])
        book.report()
    said = [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == "agent.telemetry.support"
    ]
    assert said == [
        ("WARNING", "DCGM_FI_DEV_POWER_USAGE is not supported on GPU 1: refused"),
        ("INFO", "DCGM_FI_DEV_VGPU_LICENSE_STATUS is not supported on GPUs 0, 1: no vGPU"),
    ]


def test_gpus_of_one_model_finding_the_same_ticks_apart_say_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Eight GPUs entering MIG one tick after the other each find the same fields refused:
    one line for the model, naming the fields found together, not one per GPU and field;
    another model is news. Every GPU's row still says what it cannot read."""
    h100, h200 = ("NVIDIA H100 80GB HBM3", "MIG on"), ("NVIDIA H200", "MIG on")
    kinds = {0: h100, 1: h100, 2: h100, 3: h200}
    book = SupportBook([POWER, UTIL])
    with caplog.at_level(logging.INFO, logger="agent.telemetry.support"):
        for gpu in range(4):
            book.note([(gpu, POWER.id, "Not Supported"), (gpu, UTIL.id, "Not Supported")])
            book.report(kinds)
    fields = "DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_POWER_USAGE are not supported on GPU"
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"{fields} 0 (NVIDIA H100 80GB HBM3, MIG on): Not Supported"),
        ("WARNING", f"{fields} 3 (NVIDIA H200, MIG on): Not Supported"),
    ]
    gpus = tuple(GpuIdentity(i, f"GPU-{i}", kinds[i][0], "", i) for i in range(4))
    refused = [(r.gpu.index, r.field_id) for r in book.rows(gpus) if not r.supported]
    assert refused == [(i, f) for i in range(4) for f in (POWER.id, UTIL.id)]
