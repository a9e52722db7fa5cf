"""Whether this node's GPUs are attached: one state, owned by the running node, read by every
GPU feature through one guard.

No driver yet (a GPU Operator node boots minutes before its driver container), driver present,
and driver going away (an upgrade unloads it) are states of one running agent, not reasons to
exit (ARCHITECTURE.md, "Driver lifecycle"). :class:`DriverLink` holds that state over the one
:class:`~agent.gpu.nvml.GpuDriver`:

* :meth:`DriverLink.probe` loads and initialises NVML and lists the GPUs; the node attaches
  (starts what reads the GPUs, then :meth:`DriverLink.attached`) only once at least one GPU
  answers. The node retries with a capped back-off (agent/node.py).
* :meth:`DriverLink.check`, while attached: NVML answering DRIVER_NOT_LOADED or
  LIBRARY_NOT_FOUND means the driver went away; the node stops what reads the GPUs and
  :meth:`DriverLink.detached` shuts NVML down, then probes again.
* :meth:`DriverLink.attach` and :meth:`DriverLink.detach` run the parts that registered
  (:meth:`DriverLink.register`: MIG recovery, power, telemetry, the inventory), one transition
  at a time; :meth:`DriverLink.stop` at the agent's stop lets no later attach start a part.
* :meth:`DriverLink.require` is the guard: a GPU feature asked for while detached raises
  :class:`~agent.errors.DriverNotReady` naming the cause (FAILED_PRECONDITION on the API).

:class:`DriverCollector` exports the state as ``gpu_agent_driver_ready``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent.errors import AgentError, DriverNotReady, DriverUnavailable
from agent.gpu.nvml import GpuDriver

log = logging.getLogger(__name__)

__all__ = ["DriverCollector", "DriverLink", "DriverState"]

#: Why the GPUs are not attached (the ``reason`` label of gpu_agent_driver_ready).
STARTING = "starting"
LIBRARY_NOT_FOUND = "library_not_found"
DRIVER_NOT_LOADED = "driver_not_loaded"
NO_GPUS = "no_gpus"
NVML_ERROR = "nvml_error"

#: First wait before the driver is probed again; it doubles up to the retry cap.
FIRST_RETRY_S = 0.25

_NVML_LIBRARY_NOT_FOUND = 12  # nvml.h; the rest of DriverUnavailable is DRIVER_NOT_LOADED


@dataclass(frozen=True, slots=True)
class DriverState:
    """The driver as the agent last found it."""

    attached: bool
    #: "" when attached, else one of the reasons above
    cause: str
    #: one line saying what is missing ("" when attached)
    reason: str
    #: Unix time of the last change of state
    since: float
    #: GPUs that answered when it attached
    gpus: int = 0


class DriverLink:
    """The attach state of one GpuDriver; thread-safe. Blocking methods call NVML."""

    def __init__(
        self,
        driver: GpuDriver,
        *,
        simulated: bool,
        env: Mapping[str, str] = os.environ,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._driver = driver
        self._simulated = simulated
        self._env = env
        self._clock = clock
        self._lock = threading.Lock()
        self._state = DriverState(
            False, STARTING, "the agent has not reached the driver yet", clock()
        )
        self._logged: tuple[str, str] | None = None
        self._listeners: list[Callable[[], None]] = []
        self._attach_hooks: list[Callable[[bool], object]] = []
        self._detach_hooks: list[Callable[[DriverState], object]] = []
        self._stop_hooks: list[Callable[[], object]] = []
        #: Attaching and detaching run on worker threads, one at a time (and never beside the
        #: stop of the parts).
        self._parts = threading.Lock()
        #: Set by `stop`: an attach whose thread starts after it (its task was cancelled, the
        #: thread already queued) starts nothing, so no sampler outlives the driver.
        self._stopped = False

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each attach and detach (on that thread; it must not block)."""
        self._listeners.append(listener)

    def register(
        self,
        *,
        attach: Callable[[bool], object] | None = None,
        detach: Callable[[DriverState], object] | None = None,
        stop: Callable[[], object] | None = None,
    ) -> None:
        """A GPU part's transitions, run in the order registered: ``attach(again)`` before GPU
        features are let in (``again`` is False at the start's attach, whose MIG recovery the
        start runs itself), ``detach(gone)`` once the driver went away (before NVML shuts
        down), ``stop()`` at the agent's stop."""
        if attach is not None:
            self._attach_hooks.append(attach)
        if detach is not None:
            self._detach_hooks.append(detach)
        if stop is not None:
            self._stop_hooks.append(stop)

    def attach(self, *, again: bool, count: Callable[[], int]) -> None:
        """With NVML open (a probe found GPUs): run the parts' attach, then let GPU features in
        with the ``count()`` of GPUs they found."""
        with self._parts:
            if self._stopped:
                return  # the agent is stopping: the sampler must not outlive the driver
            for hook in self._attach_hooks:
                hook(again)
            gpus = count()
            self.attached(gpus)
        log.info("NVIDIA driver attached: %d GPU(s); GPU features are available", gpus)

    async def follow(
        self, *, attached: bool, check_s: float, retry_max_s: float, count: Callable[[], int]
    ) -> None:
        """Probe a missing driver with a capped back-off and attach when it answers; while
        attached, check every ``check_s`` that it stays, and detach when it went away."""
        delay = FIRST_RETRY_S
        while True:
            if not attached:
                await asyncio.sleep(min(delay, retry_max_s))
                delay = min(delay * 2, retry_max_s)
                if await asyncio.to_thread(self.probe) is not None:
                    continue
                await asyncio.to_thread(lambda: self.attach(again=True, count=count))
                attached, delay = True, FIRST_RETRY_S
                continue
            await asyncio.sleep(check_s)
            gone = await asyncio.to_thread(self.check)
            if gone is not None:
                await asyncio.to_thread(self.detach, gone)
                attached = False

    def passes(self, work: Callable[[], object]) -> Callable[[], None]:
        """``work`` as a task's pass that runs only while the GPUs are attached."""

        def run() -> None:
            if self.is_attached:
                work()

        return run

    def while_attached(self, work: Callable[[], None]) -> None:
        """Run ``work`` now if the GPUs are attached, with no attach or detach beside it."""
        with self._parts:
            if self.is_attached:
                work()

    def detach(self, gone: DriverState) -> None:
        with self._parts:
            for hook in self._detach_hooks:
                hook(gone)
            self.detached(gone)

    def stop(self) -> None:
        with self._parts:
            self._stopped = True
            for hook in self._stop_hooks:
                hook()

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    @property
    def driver(self) -> GpuDriver:
        return self._driver

    @property
    def state(self) -> DriverState:
        return self._state

    @property
    def is_attached(self) -> bool:
        return self._state.attached

    def require(self, feature: str) -> None:
        """The guard of every GPU feature: DriverNotReady naming the cause while detached."""
        state = self._state
        if not state.attached:
            raise DriverNotReady(
                f"{feature} needs the NVIDIA driver, which is not ready ({state.cause}): "
                f"{state.reason}"
            )

    # -- transitions (the node calls these, from worker threads) --------------------------------

    def probe(self) -> DriverState | None:
        """Load and initialise NVML and list the GPUs. None when at least one GPU answers (NVML
        stays open for the node to start its GPU parts, then call :meth:`attached`); otherwise
        the not-ready state, which is also logged once per distinct reason."""
        try:
            self._driver.open()
            scan = self._driver.scan()
        except DriverUnavailable as exc:
            missing = self._not_ready(_cause(exc), self._explain(exc))
        except AgentError as exc:  # e.g. a library that does not match the loaded module
            missing = self._not_ready(NVML_ERROR, f"NVML does not answer: {exc}")
        else:
            if scan.gpus:
                # A GPU unread (one needing a reset) keeps no other from its features: the node
                # attaches, and its status names that GPU and the failing call.
                for bad in scan.unread:
                    log.warning(
                        "GPU %d cannot be read, attached without it: %s", bad.index, bad.detail
                    )
                return None
            lost = f" ({len(scan.lost)} lost)" if scan.lost else ""
            unread = "".join(f"; GPU {g.index} cannot be read: {g.detail}" for g in scan.unread)
            missing = self._not_ready(
                NO_GPUS, f"the driver lists no GPU that answers{lost}{unread}"
            )
        self._close_quietly()
        with self._lock:
            self._state = missing if self._state.cause != missing.cause else self._state
            state = self._state
        if self._logged != (state.cause, state.reason):
            self._logged = (state.cause, state.reason)
            log.warning(
                "GPU features are unavailable until the driver is ready (the agent attaches "
                "when it is, without a restart): %s",
                state.reason,
            )
        return state

    def attached(self, gpus: int) -> None:
        with self._lock:
            self._state = DriverState(True, "", "", self._clock(), gpus)
        self._logged = None
        self._changed()

    def check(self) -> DriverState | None:
        """While attached: None while NVML answers; the not-ready state when the driver went
        away (the caller detaches). Other NVML errors are a GPU's business (the sampler marks
        a lost GPU), not the driver's."""
        try:
            self._driver.call(self._driver.nvml.nvmlDeviceGetCount)
        except DriverUnavailable as exc:
            return self._not_ready(_cause(exc), f"the driver went away: {self._explain(exc)}")
        except AgentError:
            return None
        return None

    def detached(self, state: DriverState) -> None:
        """Record ``state`` (GPU features refuse from now on) and shut NVML down."""
        with self._lock:
            self._state = state
        log.warning("GPU features detached: %s", state.reason)
        self._logged = (state.cause, state.reason)
        self._changed()
        self._close_quietly()

    def close(self) -> None:
        """At the agent's stop."""
        if self._state.attached:
            self._close_quietly()

    # -- helpers ---------------------------------------------------------------------------------

    def _not_ready(self, cause: str, reason: str) -> DriverState:
        return DriverState(False, cause, reason, self._clock())

    def _explain(self, exc: DriverUnavailable) -> str:
        from agent.gpu import explain

        return explain(exc, simulated=self._simulated, env=self._env)

    def _close_quietly(self) -> None:
        try:
            self._driver.close()
        except AgentError as exc:  # the driver is gone: nothing left to shut down
            log.debug("nvmlShutdown failed: %s", exc)


def _cause(exc: DriverUnavailable) -> str:
    code = getattr(exc, "nvml_code", None)
    return LIBRARY_NOT_FOUND if code == _NVML_LIBRARY_NOT_FOUND else DRIVER_NOT_LOADED


class DriverCollector(Collector):
    """``gpu_agent_driver_ready``: 1 while the GPUs are attached; 0 with the reason otherwise."""

    def __init__(self, link: DriverLink) -> None:
        self._link = link

    def collect(self) -> Iterator[Metric]:
        state = self._link.state
        ready = GaugeMetricFamily(
            "gpu_agent_driver_ready",
            "1 while the NVIDIA driver is attached (NVML initialised, GPUs listed); 0 while "
            "GPU features wait for it, with the reason.",
            labels=["reason"],
        )
        ready.add_metric([state.cause], 1.0 if state.attached else 0.0)
        since = GaugeMetricFamily(
            "gpu_agent_driver_state_since_timestamp_seconds",
            "When gpu_agent_driver_ready last changed (Unix time).",
        )
        since.add_metric([], state.since)
        yield ready
        yield since
