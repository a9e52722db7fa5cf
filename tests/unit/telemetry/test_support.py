"""Which selected fields a GPU cannot provide: logged once per field, reason and GPU."""

from __future__ import annotations

import logging

import pytest

from agent.telemetry.support import SupportBook
from dcgm.fields import BY_NAME

VGPU = BY_NAME["DCGM_FI_DEV_VGPU_LICENSE_STATUS"]
POWER = BY_NAME["DCGM_FI_DEV_POWER_USAGE"]


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
