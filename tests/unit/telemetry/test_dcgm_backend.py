"""The DCGM profiling backend: absent bindings mean no backend; DCGM's values are re-keyed."""

from __future__ import annotations

import logging

import pytest

from agent.telemetry.dcgm_backend import entity_values, load_dcgm_backend


def test_without_the_bindings_there_is_no_backend_and_one_line_says_how_to_add_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def importer(name: str) -> object:
        raise ImportError(f"No module named {name!r}")

    with caplog.at_level(logging.INFO, logger="agent.telemetry.dcgm_backend"):
        assert load_dcgm_backend([1004], 1.0, importer=importer) is None
    (record,) = caplog.records
    assert "datacenter-gpu-manager-4/bindings/python3" in record.getMessage()


def test_installed_but_unusable_dcgm_is_no_backend(caplog: pytest.LogCaptureFixture) -> None:
    """E.g. nv-hostengine not running: the connect fails inside DcgmReader."""

    class Reader:
        def __init__(self, **kwargs: object) -> None:
            raise ConnectionError("Host engine connection invalid/disconnected")

    modules = {"DcgmReader": type("M", (), {"DcgmReader": Reader})}

    def importer(name: str) -> object:
        return modules.get(name, object())

    with caplog.at_level(logging.WARNING, logger="agent.telemetry.dcgm_backend"):
        assert load_dcgm_backend([1004], 1.0, importer=importer) is None
    assert "unusable" in caplog.records[0].getMessage()


def test_values_are_keyed_by_gpu_uuid_and_nvml_instance_id() -> None:
    latest = {
        1: {0: {1004: 0.5, 1005: 0.25}, 1: {1004: 0.0}},  # DCGM_FE_GPU by DCGM gpu id
        4: {7: {1004: 0.75}, 9: {1004: 0.1}},  # DCGM_FE_GPU_I by DCGM entity id
        5: {3: {1004: 0.2}},  # compute instances are not exported on their own
    }
    values = entity_values(
        latest,
        gpu_uuids={0: "GPU-a", 1: "GPU-b"},
        instances={7: ("GPU-b", 2)},
    )
    assert values == {
        ("GPU-a", None): {1004: 0.5, 1005: 0.25},
        ("GPU-b", None): {1004: 0.0},
        ("GPU-b", 2): {1004: 0.75},
    }
