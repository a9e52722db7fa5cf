"""The XID classification the health marks use (agent/health/xids.tsv) and the signals the
driver's readings make (agent/health/signals.py)."""

from __future__ import annotations

from importlib import resources

import pytest

from agent.gpu.reading_calls import Reading
from agent.health.machine import State
from agent.health.signals import reading_signals, xid_signal
from agent.health.xids import XidClass, classify, table


def _catalog() -> set[int]:
    text = resources.files("dcgm").joinpath("xid-messages.tsv").read_text(encoding="utf-8")
    return {int(line.split("\t")[0]) for line in text.splitlines() if line[:1].isdigit()}


def test_every_xid_of_the_catalog_but_0_is_classified() -> None:
    assert _catalog() - {0} <= set(table())


@pytest.mark.parametrize(
    ("xid", "cls", "action"),
    [
        (48, XidClass.RESET, "reset-gpu"),  # double-bit ECC
        (74, XidClass.RESET, "reset-gpu"),  # NVLink
        (79, XidClass.REBOOT, "reboot-node"),  # fallen off the bus
        (95, XidClass.RESET, "reset-gpu"),  # uncontained ECC
        (119, XidClass.RESET, "reset-gpu"),  # GSP RPC timeout
        (120, XidClass.RESET, "reset-gpu"),  # GSP error
        (140, XidClass.RESET, "reset-gpu"),  # unrecovered ECC
        (13, XidClass.APPLICATION, "restart-application"),
        (31, XidClass.APPLICATION, "restart-application"),
        (45, XidClass.APPLICATION, "restart-application"),
        (94, XidClass.APPLICATION, "restart-application"),  # contained: NVIDIA says RESTART_APP
        (43, XidClass.IGNORE, "none"),
        (63, XidClass.IGNORE, "none"),  # a row-remap recording event
    ],
)
def test_nvidia_catalog_buckets_become_classes(xid: int, cls: XidClass, action: str) -> None:
    rule = classify(xid)
    assert rule.cls is cls and rule.action == action


def test_an_xid_the_table_does_not_list_is_unexpected() -> None:
    assert classify(999).cls is XidClass.UNEXPECTED
    assert classify(999).bucket == "UNLISTED"


def test_xid_signals_by_class() -> None:
    fatal = xid_signal(79, 5.0)
    assert fatal is not None and fatal.severity is State.FAILED
    assert fatal.reason == "XID 79 (GPU has fallen off the bus): needs reboot-node"
    app = xid_signal(13, 5.0)
    assert app is not None and app.severity is State.DEGRADED
    assert xid_signal(43, 5.0) is None


def test_reading_signals() -> None:
    assert reading_signals({}, 1.0) == []
    assert reading_signals({Reading.ECC_DBE_VOLATILE: 0, Reading.CLOCK_EVENT_REASONS: 0x1}, 1) == []
    # a software power cap is the agent's own doing (power caps), not a fault
    assert reading_signals({Reading.CLOCK_EVENT_REASONS: 0x4}, 1.0) == []
    (dbe,) = reading_signals({Reading.ECC_DBE_VOLATILE: 2}, 1.0)
    assert dbe.severity is State.FAILED and dbe.action == "reset-gpu"
    assert dbe.reason == "2 uncorrectable ECC error(s) since the driver loaded"
    (failure,) = reading_signals({Reading.ROW_REMAP_FAILURE: 1}, 1.0)
    assert failure.severity is State.FAILED
    (pending,) = reading_signals({Reading.ROW_REMAP_PENDING: 1}, 1.0)
    assert pending.severity is State.DEGRADED and pending.action == "reset-gpu"
    (held,) = reading_signals({Reading.CLOCK_EVENT_REASONS: 0x40 | 0x80 | 0x4}, 1.0)
    assert held.severity is State.DEGRADED
    assert held.reason == "clocks held down: hw_thermal, hw_power_brake"
