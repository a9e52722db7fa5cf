"""Right-sizing: pods whose observed peaks fit a smaller MIG profile, with headroom."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from agent._proto.gpuagent.v1 import telemetry_pb2, telemetry_pb2_grpc
from agent.api.auth import Policy
from agent.api.interceptor import ApiInterceptor
from agent.api.telemetry import TelemetryServicer
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import StaticDiscovery, Target
from agent.coordinator.fleet.inventory import NodeView
from agent.coordinator.flows import Selection, observe
from agent.coordinator.planning.catalog import Catalog
from agent.coordinator.planning.demand import DemandEntry, demand_yaml, parse_demand
from agent.coordinator.planning.rightsize import Window, rightsized_demand, suggest
from agent.gpu.readings import GpuIdentity
from agent.gpu.types import GpuLayout
from agent.telemetry.snapshot import (
    Entity,
    EntitySample,
    InstanceIdentity,
    PodRef,
    PodUsage,
    Snapshot,
)
from agent.wire.telemetry import telemetry_from
from tests.unit.coordinator.fleets import A100_80, H100, gpu

H100_NAME = "NVIDIA H100 80GB HBM3"


def snapshot(
    *samples: tuple[str, int, str, str, dict[int, float]],
) -> telemetry_pb2.TelemetrySnapshot:
    """(GPU uuid, GI id, profile, pod name or "", {field id: value}) per MIG instance."""
    msg = telemetry_pb2.TelemetrySnapshot()
    for uuid, gi, profile, pod, values in samples:
        entry = msg.entities.add()
        entry.entity.gpu_uuid, entry.entity.gpu_instance_id, entry.entity.profile = (
            uuid,
            gi,
            profile,
        )
        for field_id, value in values.items():
            entry.values.add(field_id=field_id, value=value)
        if pod:
            entry.pod.namespace, entry.pod.name, entry.pod.container = "ml", pod, "main"
    return msg


def layouts() -> dict[str, GpuLayout]:
    h100 = gpu("n1", 0, H100, [("3g.40gb", 0), ("3g.40gb", 4)])
    a100 = gpu("n1", 1, A100_80, [("3g.40gb", 0)])
    return {g.gpu.uuid: g for g in (h100, a100)}


def test_the_peak_over_the_window_decides_and_the_smallest_fit_is_named() -> None:
    window = Window()
    # small: 6 GiB and 20% of a 3g at most -> fits a 1g.10gb (0.2 x 3 x 1.2 = 0.72 slices).
    # big: one sample at 30 GiB -> needs a 3g (1g.20gb has 20 GiB).
    # media-less over time: activity peaks at 60% -> 2.16 slices -> needs a 3g still.
    for small_mem, small_act, big_mem, busy_act in (
        (4000, 0.1, 9000, 0.3),
        (6000, 0.2, 30000, 0.6),
    ):
        window.add(
            "n1",
            telemetry_from(
                snapshot(
                    (
                        "GPU-n1-0",
                        1,
                        "3g.40gb",
                        "small",
                        {252: small_mem, 250: 40000, 1001: small_act},
                    ),
                    ("GPU-n1-0", 2, "3g.40gb", "big", {252: big_mem, 250: 40000, 1001: busy_act}),
                    ("GPU-n1-1", 1, "3g.40gb", "no-gpm", {252: 1000, 250: 40000}),
                    ("GPU-n1-0", 3, "1g.10gb", "", {252: 500}),
                )
            ),
        )
    by_pod = {s.observation.pod: s for s in suggest(window, layouts(), headroom=0.2)}
    small, big, no_gpm = by_pod["small"], by_pod["big"], by_pod["no-gpm"]
    assert (small.fits, small.saves_slices, small.observation.samples) == ("1g.10gb", 3, 2)
    assert small.observation.peak_memory_mib == 6000 and small.observation.peak_activity == 0.2
    assert big.fits is None and "needs 36000 MiB and 3 compute slice(s)" in big.reason
    # No GPM (A100): activity is unknown, not 0: nothing is suggested.
    assert no_gpm.fits is None and no_gpm.reason.startswith("activity unknown")
    assert window.unattributed == {"n1": 2}  # a busy device with no single pod, twice

    demand = rightsized_demand(by_pod.values())
    assert demand.entries == (
        DemandEntry("1g.10gb", 1, H100_NAME),
        DemandEntry("3g.40gb", 1, "NVIDIA A100-SXM4-80GB"),
        DemandEntry("3g.40gb", 1, H100_NAME),
    )
    # The demand file reads back as the same demand.
    assert parse_demand(demand_yaml(demand, "from rightsize")).entries == demand.entries


def test_more_headroom_asks_for_more() -> None:
    window = Window()
    window.add(
        "n1", telemetry_from(snapshot(("GPU-n1-0", 1, "3g.40gb", "p", {252: 9000, 1001: 0.3})))
    )
    (tight,) = suggest(window, layouts(), headroom=0.0)
    (loose,) = suggest(window, layouts(), headroom=0.5)
    assert tight.fits == "1g.10gb"  # 9000 MiB, 0.9 slices
    assert loose.fits == "2g.20gb"  # 13500 MiB and 1.35 slices: 1g.20gb has one slice only


def test_the_window_is_read_over_the_agents_telemetry_api(tmp_path: Path) -> None:
    """Real gRPC: the agent's TelemetryServicer and interceptor, the coordinator's client and
    sweep; the peak of three ticks is kept, per-container rows of a shared GPU arrive, and an
    agent without a sample yet is noted."""
    ticks = iter([3000.0, 7000.0, 5000.0])

    def source() -> Snapshot:
        gpu0 = GpuIdentity(0, "GPU-n1-0", H100_NAME, "00000000:01:00.0", 0)
        sample = EntitySample(
            Entity(gpu0, InstanceIdentity(1, "3g.40gb")),
            {252: next(ticks), 1001: 0.1},
            PodRef("ml", "small", "main"),
        )
        light = PodUsage(Entity(gpu0), PodRef("ml", "light", "main"), 2.0 * (1 << 30), 0.25)
        return Snapshot(0.0, "n1", "550", "12", (), (sample,), pods=(light,))

    async def run() -> Window:
        servers = []
        for name, src in (("n1", source), ("n2", lambda: None)):
            server = grpc.aio.server(interceptors=[ApiInterceptor(Policy.of({}))])
            telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(
                TelemetryServicer(src, lambda _feature: None), server
            )
            server.add_insecure_port(f"unix:{tmp_path / name}.sock")
            await server.start()
            servers.append(server)
        targets = {n: Target(f"unix:{tmp_path / n}.sock", n) for n in ("n1", "n2")}
        views = tuple(NodeView(n, t.address) for n, t in targets.items())
        fleet = Fleet(StaticDiscovery([t.address for t in targets.values()]), None)

        async def no_wait(seconds: float) -> None:
            return None

        try:
            return await observe(
                fleet, Selection(views, targets), samples=3, every_s=30, sleep=no_wait
            )
        finally:
            await fleet.close()
            for server in servers:
                await server.stop(None)

    window = asyncio.run(run())
    small, light = sorted(window.observations.values(), key=lambda o: o.pod, reverse=True)
    assert (small.node, small.pod, small.samples, small.peak_memory_mib) == ("n1", "small", 3, 7000)
    # A container's own use of a shared GPU comes over the wire too.
    assert (light.pod, light.shared, light.gpu_instance_id) == ("light", True, None)
    assert (light.peak_memory_mib, light.peak_activity) == (2048.0, 0.25)
    assert "no telemetry sample yet" in window.failed["n2"]


def shared(
    msg: telemetry_pb2.TelemetrySnapshot,
    uuid: str,
    gi: int | None,
    pod: str,
    memory_mib: float | None,
    sm: float | None,
    profile: str = "",
) -> None:
    """A per-container row of the snapshot: one container's own use of a shared device."""
    row = msg.pods.add()
    row.entity.gpu_uuid = uuid
    if gi is not None:
        row.entity.gpu_instance_id, row.entity.profile = gi, profile
    row.pod.namespace, row.pod.name, row.pod.container = "ml", pod, "main"
    if memory_mib is not None:
        row.memory_used_bytes = memory_mib * (1 << 20)
    if sm is not None:
        row.sm_utilization = sm


def test_containers_on_a_shared_gpu_are_sized_against_the_models_mig_profiles() -> None:
    """A time-sliced H100 (MIG off): 6000 MiB at 10% SM fits a 1g.10gb; 60 GiB at 50% needs
    the whole GPU. On a time-sliced MIG instance NVML has no per-process utilisation: the
    memory fit is shown, nothing is suggested."""
    whole = gpu("n1", 2, H100, mig=(False, False))
    split = gpu("n1", 3, H100, [("3g.40gb", 0)])
    catalog = Catalog([whole, split])
    window = Window()
    msg = snapshot(("GPU-n1-3", 1, "3g.40gb", "", {252: 9000}))
    shared(msg, "GPU-n1-2", None, "light", 6000, 0.1)
    shared(msg, "GPU-n1-2", None, "heavy", 60_000, 0.5)
    shared(msg, "GPU-n1-3", 1, "mig-shared", 4000, None, "3g.40gb")
    window.add("n1", telemetry_from(msg))
    assert not window.unattributed  # the shared instance's containers are told apart
    found = suggest(window, {g.gpu.uuid: catalog.complete(g) for g in (whole, split)}, 0.2)
    by_pod = {s.observation.pod: s for s in found}
    assert by_pod["light"].fits == "1g.10gb" and by_pod["light"].observation.shared
    assert by_pod["heavy"].fits is None and by_pod["heavy"].reason == "its work needs the whole GPU"
    assert by_pod["mig-shared"].fits is None
    assert by_pod["mig-shared"].reason.endswith("memory alone fits 1g.10gb")
    assert rightsized_demand(found).entries == (
        DemandEntry("1g.10gb", 1, H100_NAME),
        DemandEntry("3g.40gb", 1, H100_NAME),
    )
