"""Power management limits: read the range, the default, the limit set and the enforced one; set
a limit.

The range and the default come from the model (``models.py``); a limit set lives in the node
state (``Gpu.power_limit_mw``) until a reboot or a driver reload puts the default back
(``lifecycle.reboot``). The power draw is held at the enforced limit (``activity.refresh``).
A limit outside the range is INVALID_ARGUMENT, as on the real driver; NO_PERMISSION (not root)
and NOT_SUPPORTED (a board without power management) are injected as faults like any other. A
limit inside it holds exactly; another writer of the limit on the host
(``SimControl.write_power_limit``) sets its own value right after each set, which the getters
then report, as they would on a real node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pynvml

from agent.gpu.sim import activity
from agent.gpu.sim.abi import fail, set_value, symbol, to_int

if TYPE_CHECKING:
    from agent.gpu.sim.driver import SimDriver


@symbol("nvmlDeviceGetPowerManagementLimitConstraints")
def limit_constraints(drv: SimDriver, handle: Any, min_ref: Any, max_ref: Any) -> None:
    model = drv.physical(handle).model
    set_value(min_ref, model.min_power_limit_w * 1000)
    set_value(max_ref, model.power_limit_w * 1000)


@symbol("nvmlDeviceGetPowerManagementDefaultLimit")
def default_limit(drv: SimDriver, handle: Any, ref: Any) -> None:
    set_value(ref, drv.physical(handle).model.power_limit_w * 1000)


@symbol("nvmlDeviceGetPowerManagementLimit")
def management_limit(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.physical(handle)
    set_value(ref, activity.power_limit_mw(t.gpu, t.model))


@symbol("nvmlDeviceGetEnforcedPowerLimit")
def enforced_limit(drv: SimDriver, handle: Any, ref: Any) -> None:
    t = drv.physical(handle)
    set_value(ref, activity.power_limit_mw(t.gpu, t.model))


@symbol("nvmlDeviceSetPowerManagementLimit")
def set_management_limit(drv: SimDriver, handle: Any, limit: Any) -> None:
    milliwatts = to_int(limit)
    with drv.mutate() as node:
        t = drv.physical(handle, node)
        if not t.model.min_power_limit_w * 1000 <= milliwatts <= t.model.power_limit_w * 1000:
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        activity.refresh(t.gpu, t.model, drv.now())  # energy so far at the old limit
        # A limit inside the range holds exactly, unless another writer sets its own after it.
        held = milliwatts if t.gpu.power_limit_writer_mw is None else t.gpu.power_limit_writer_mw
        activity.set_power_limit(t.gpu, t.model, held)
        activity.refresh(t.gpu, t.model, drv.now())
