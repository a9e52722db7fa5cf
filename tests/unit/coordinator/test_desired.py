"""The desired-state file of `coordinator serve`, and the loop's health and metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.coordinator.desired import parse_desired
from agent.coordinator.discovery import StaticDiscovery
from agent.coordinator.fleet import Fleet
from agent.coordinator.reconcile import Reconciler
from agent.errors import InvalidSpec

FULL = """\
version: v1
rollout: {max_unavailable: 10%, max_failures: 2, node_timeout_s: 600}
mig:
  - selector: model=*H100*
    config: |
      version: v1
      mig-configs:
        all-1g: [{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 7}}]
sharing:
  - selector: pool=inference
    strategy: mps
    replicas: 3
prewarm:
  - concurrency: 5
    files: [{url: "https://models.example/a.bin", sha256: "", name: a}]
    images: [{ref: "registry.example/app:1", name: app}]
"""


def test_a_full_desired_state_parses() -> None:
    desired = parse_desired(FULL)
    assert desired.rollout.max_unavailable == "10%" and desired.rollout.max_failures == 2
    (mig,) = desired.mig
    assert mig.config_name == "all-1g" and str(mig.selector) == "model=*H100*"
    (share,) = desired.sharing
    assert share.request["spec"]["strategy"] == "SHARING_STRATEGY_MPS"
    (warm,) = desired.prewarm
    assert warm.names == ("a", "app") and warm.concurrency == 5


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("version: v2", "version"),
        ("version: v1\nextra: 1", "extra"),
        ("version: v1\nrollout: {max_unavailable: 0}", "rollout.max_unavailable"),
        ("version: v1\nsharing: [{strategy: magic, replicas: 2}]", "sharing[0].strategy"),
        ("version: v1\nsharing: [{strategy: mps, replicas: 1}]", "sharing[0].replicas"),
        ("version: v1\nmig: [{config: 'version: v1'}]", "mig[0].config"),
        ("version: v1\nmig: [{selector: 'model', config: 'x'}]", "mig[0].selector"),
        ("version: v1\nprewarm: [{files: [{url: 'https://x/a'}]}]", "prewarm[0].files[0].name"),
        ("version: v1\nprewarm: [{concurrency: 0, files: []}]", "prewarm[0].concurrency"),
    ],
)
def test_a_bad_desired_state_names_the_field(text: str, field: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_desired(text)
    assert field in [v.field for v in caught.value.violations], caught.value.violations


async def _serve_without_agents(tmp_path: Path) -> None:
    now = [1000.0]
    fleet = Fleet(StaticDiscovery([f"unix:{tmp_path / 'none.sock'}"]), None, timeout_s=0.5)
    desired = tmp_path / "desired.yaml"
    reconciler = Reconciler(fleet, desired, interval_s=10, clock=lambda: now[0])
    try:
        assert reconciler.healthy() == (True, "ok")
        await reconciler.pass_once()  # no desired file: it only watches
        assert reconciler.stats.nodes["unreachable"] == 1
        desired.write_text("version: v9")
        await reconciler.pass_once()  # a bad file: kept out, and said so
        text = (await reconciler.metrics(None)).body.decode()  # type: ignore[arg-type]
        assert 'gpu_agent_coordinator_reconcile_passes_total{result="ok"} 2.0' in text
        assert "gpu_agent_coordinator_desired_state_valid 0.0" in text
        now[0] += 61
        healthy, why = reconciler.healthy()
        assert not healthy and "the reconcile loop made no progress for 61 s" in why
    finally:
        await fleet.close()


def test_the_loop_is_healthy_while_passes_end_and_reports_a_bad_desired_file(
    tmp_path: Path,
) -> None:
    asyncio.run(_serve_without_agents(tmp_path))
