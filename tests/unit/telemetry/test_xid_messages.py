"""err_msg on DCGM_FI_DEV_XID_ERRORS is dcgm-exporter's: NVIDIA's XID catalog names, 0-172."""

from __future__ import annotations

import pytest

from agent.telemetry.xid import UNKNOWN_XID, xid_message


@pytest.mark.parametrize(
    ("xid", "message"),
    [
        (0, "No Error"),
        (13, "Graphics Engine Exception"),
        (31, "GPU memory page fault"),
        (48, "Double Bit ECC Error"),
        (79, "GPU has fallen off the bus"),
        (119, "GSP RPC Timeout"),
        (172, "Uncorrectable SRAM Error"),
    ],
)
def test_catalog_names(xid: int, message: str) -> None:
    assert xid_message(xid) == message


def test_the_table_covers_every_xid_dcgm_exporter_knows() -> None:
    assert all(xid_message(x) != UNKNOWN_XID for x in range(173))
    assert xid_message(173) == UNKNOWN_XID and xid_message(-1) == UNKNOWN_XID
