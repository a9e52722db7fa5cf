"""What the driver reports, turned into the machine's signals. Pure: the caller hands in the
XID, or the GPU's readings from the telemetry snapshot.

- XIDs by class (``xids.tsv``): reset and reboot ones fail, application and unexpected ones
  degrade (through the machine's window), ignored ones do nothing;
- a lost GPU fails (reboot-node: NVIDIA's action for XID 79, fallen off the bus);
- uncorrectable (double-bit) volatile ECC errors fail until a reset clears the count;
- a failed row remap fails; a pending one degrades (it takes effect at the next reset);
- clocks held down by heat or a power brake degrade. A software power cap is not a fault: the
  agent's own power caps (docs/power.md) set it on purpose.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.gpu.reading_calls import Reading
from agent.health.machine import Signal, State
from agent.health.xids import XidClass, classify
from agent.telemetry.xid import xid_message

__all__ = ["THROTTLE_REASONS", "lost_signal", "reading_signals", "xid_signal"]

#: nvmlClocksEventReason* bits that mean the GPU is held down by heat or power delivery
THROTTLE_REASONS = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
_FAILING = {XidClass.RESET, XidClass.REBOOT}
_DEGRADING = {XidClass.APPLICATION, XidClass.UNEXPECTED}


def xid_signal(xid: int, at: float) -> Signal | None:
    rule = classify(xid)
    reason = f"XID {xid} ({xid_message(xid)})"
    if rule.cls in _FAILING:
        return Signal(State.FAILED, f"{reason}: needs {rule.action}", rule.action, at)
    if rule.cls in _DEGRADING:
        return Signal(State.DEGRADED, reason, rule.action, at)
    return None


def lost_signal(detail: str, at: float) -> Signal:
    return Signal(State.FAILED, f"GPU lost: {detail or 'it does not answer'}", "reboot-node", at)


def reading_signals(values: Mapping[Reading, float], at: float) -> list[Signal]:
    """Signals from one tick's readings; a reading that is absent says nothing."""
    out = []
    dbe = values.get(Reading.ECC_DBE_VOLATILE)
    if dbe:
        out.append(
            Signal(
                State.FAILED,
                f"{int(dbe)} uncorrectable ECC error(s) since the driver loaded",
                "reset-gpu",
                at,
            )
        )
    if values.get(Reading.ROW_REMAP_FAILURE):
        out.append(Signal(State.FAILED, "row remapping failed", "reset-gpu", at))
    if values.get(Reading.ROW_REMAP_PENDING):
        out.append(
            Signal(State.DEGRADED, "row remap pending until the next GPU reset", "reset-gpu", at)
        )
    mask = int(values.get(Reading.CLOCK_EVENT_REASONS) or 0)
    held = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    if held:
        out.append(Signal(State.DEGRADED, f"clocks held down: {', '.join(held)}", "none", at))
    return out
