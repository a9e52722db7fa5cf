"""The driver link runs the parts that registered with it, in order, one transition at a time,
and none after the agent's stop; a task's pass runs on its period and at once when woken."""

from __future__ import annotations

import asyncio
import contextlib

from agent.gpu.attach import DriverLink, DriverState
from agent.loops import every


class _Driver:
    def __init__(self, calls: list[str]) -> None:
        self._calls = calls

    def close(self) -> None:
        self._calls.append("nvml closed")


def _link(calls: list[str]) -> DriverLink:
    link = DriverLink(_Driver(calls), simulated=True)  # type: ignore[arg-type]
    link.register(attach=lambda again: calls.append(f"mig again={again}"))
    link.register(attach=lambda _: calls.append("power"))
    link.register(
        attach=lambda _: calls.append("sampler"),
        detach=lambda _: calls.append("sampler off"),
        stop=lambda: calls.append("sampler stopped"),
    )
    return link


def test_parts_attach_in_order_and_detach_before_nvml_closes() -> None:
    calls: list[str] = []
    link = _link(calls)
    link.attach(again=True, count=lambda: 8)
    assert calls == ["mig again=True", "power", "sampler"]
    assert link.is_attached and link.state.gpus == 8
    calls.clear()
    link.detach(DriverState(False, "driver_not_loaded", "gone", 0.0))
    assert calls == ["sampler off", "nvml closed"]
    assert not link.is_attached


def test_an_attach_after_the_stop_starts_nothing() -> None:
    calls: list[str] = []
    link = _link(calls)
    link.stop()
    link.attach(again=False, count=lambda: 8)
    assert calls == ["sampler stopped"]
    assert not link.is_attached


def test_a_pass_that_needs_the_driver_waits_for_the_attach() -> None:
    calls: list[str] = []
    link = _link([])
    run = link.passes(lambda: calls.append("pass"))
    run()
    assert calls == []
    link.attach(again=False, count=lambda: 1)
    run()
    assert calls == ["pass"]


def test_a_woken_task_runs_at_once_not_a_period_later() -> None:
    async def main() -> int:
        passes: list[int] = []
        wake = asyncio.Event()
        task = asyncio.create_task(every("t", 3600, lambda: passes.append(1), wake))
        while not passes:
            await asyncio.sleep(0.01)
        wake.set()
        for _ in range(500):
            if len(passes) == 2:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return len(passes)

    assert asyncio.run(main()) == 2
