"""A watch thread's change wakes the agent's loop, and a change that arrives after the loop
closed (during shutdown: `Informer.stop` does not wait for the watch in flight) is dropped,
not an exception in the watch thread (pytest's PytestUnhandledThreadExceptionWarning in
tests/integration/test_dra_allocation.py showed it)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from agent.loops import call_soon_from_thread


def test_a_change_from_another_thread_wakes_the_loop() -> None:
    async def main() -> bool:
        changed = asyncio.Event()
        loop = asyncio.get_running_loop()
        threading.Thread(target=call_soon_from_thread, args=(loop, changed.set)).start()
        await asyncio.wait_for(changed.wait(), 5)
        return changed.is_set()

    assert asyncio.run(main())


def test_a_change_after_the_loop_closed_is_dropped_without_an_error() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    errors: list[BaseException] = []

    def late() -> None:
        try:
            call_soon_from_thread(loop, lambda: None)
        except BaseException as exc:  # what the watch thread would have died of
            errors.append(exc)

    thread = threading.Thread(target=late)
    thread.start()
    thread.join()
    assert errors == []


def test_an_attach_that_runs_after_the_shutdown_stopped_the_gpu_parts_starts_nothing(
    tmp_path: Path,
) -> None:
    """The driver-follow task is cancelled at shutdown, but its attach may already be queued on
    a worker thread; run after the driver link's `stop`, it must not start the sampler, which
    would then read a closed driver ("collection failed ...: ... Uninitialized")."""
    from agent.config import load_config
    from agent.node import Node, build_services

    config = load_config(
        None, env={}, flags={"simulate": "dgx-h100", "state_dir": tmp_path / "state"}
    )
    node = Node(build_services(config))
    started: list[str] = []
    node.services.telemetry.start = lambda: started.append("sampler")  # type: ignore[method-assign]
    try:
        node.services.driver.stop()
        node.services.driver.attach(again=False, count=node.services.gpus)
        assert started == []
    finally:
        node.services.driver.close()
        node.services.state.close()
