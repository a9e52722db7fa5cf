"""`gpu-agent coordinator serve` against two agents on simulated nodes, over mTLS: one pass
brings the fleet to the desired state; the serving loop then finds no drift and says so on
/metrics; /healthz answers; `fleet status --coordinator` gets the sweep from it; SIGTERM stops
it; a model of the desired file warmed on every node, then left alone."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.prewarm_fixtures import hub
from tests.integration.prewarm_fixtures.origin import Origin
from tests.unit.api.support import REPO, Pki, wait_for
from tests.unit.coordinator.agents import AgentFleet
from tests.unit.mig.layouts import MIG_HALVES

pytestmark = pytest.mark.integration

DESIRED = f"""\
version: v1
rollout: {{max_unavailable: 1, max_failures: 1}}
mig:
  - selector: model=*H100*
    config_name: halves
    config: |
{textwrap.indent(MIG_HALVES, " " * 6)}\
sharing:
  - strategy: time-slicing
    replicas: 2
"""


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentFleet]:
    root = tmp_path_factory.mktemp("fleet")
    with AgentFleet(root, Pki(root / "pki"), {"h100": "dgx-h100", "a30": "a30-node"}) as fleet:
        yield fleet


def test_one_pass_brings_the_fleet_to_the_desired_state(agents: AgentFleet) -> None:
    desired = agents.root / "desired.yaml"
    desired.write_text(DESIRED)
    result = agents.coordinator("serve", "--once", "--desired", str(desired))
    assert result.exit_code == 0, result.output

    def converged() -> bool:
        out = agents.fleet("status", "--nodes", "-o", "json")
        rows = {n["name"]: n for n in json.loads(out.output)["nodes"]}
        return (
            rows["h100"]["gpus"][0]["devices"] == {"3g.40gb": 2}
            and rows["a30"]["gpus"][0]["slices"] == "-"  # the MIG rule selects H100 nodes only
            # reload none, no plugin on a simulated node: written, and said not loaded
            and {r["sharing"] for r in rows.values()}
            == {"time-slicing nvidia.com/gpu x2 (not loaded)"}
        )

    wait_for(converged, "the fleet at the desired state", timeout=30, every=1.0)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_serving_reports_no_drift_on_metrics_and_stops_on_sigterm(agents: AgentFleet) -> None:
    desired = agents.root / "desired.yaml"
    desired.write_text(DESIRED)
    log = agents.root / "coordinator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-c",
                "from agent.cli.coordinator import coordinator; coordinator()",
                "serve", "--desired", str(desired), "--interval", "1",
                "--listen", "127.0.0.1:0", *agents.args(),
            ],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        match = wait_for(
            lambda: re.search(r"/fleet/status on 127\.0\.0\.1:(\d+)", log.read_text()),
            "the coordinator to serve",
        )
        base = f"http://127.0.0.1:{match.group(1)}"
        assert _get(base + "/healthz") == (200, "ok\n")

        def passed() -> str | None:
            status, text = _get(base + "/metrics")
            ok = re.search(
                r'gpu_agent_coordinator_reconcile_passes_total\{result="ok"\} (\S+)', text
            )
            return text if status == 200 and ok and float(ok.group(1)) >= 2 else None

        metrics = wait_for(passed, "two reconcile passes", timeout=60, every=0.5)
        assert 'gpu_agent_coordinator_drift_nodes{kind="mig"} 0.0' in metrics
        assert 'gpu_agent_coordinator_nodes{state="answering"} 2.0' in metrics
        assert "gpu_agent_coordinator_desired_state_valid 1.0" in metrics
        _status_through_the_coordinator_is_the_direct_sweep(agents, base)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _status_through_the_coordinator_is_the_direct_sweep(agents: AgentFleet, base: str) -> None:
    def rows(out: str) -> dict[str, tuple[object, ...]]:
        return {
            n["name"]: (n["health"], n["models"], [g["slices"] for g in n["gpus"]], n["sharing"])
            for n in json.loads(out)["nodes"]
        }

    direct = agents.fleet("status", "--nodes", "-o", "json")
    served = agents.fleet("status", "--coordinator", base, "--nodes", "-o", "json")
    assert served.exit_code == 0, served.output
    assert rows(served.output) == rows(direct.output)
    assert set(rows(served.output)) == {"h100", "a30"}
    only = agents.fleet("status", "--coordinator", base, "-l", "name=a30", "--nodes", "-o", "json")
    assert set(rows(only.output)) == {"a30"}
    table = agents.fleet("status", "--coordinator", base, "--nodes")
    assert "MIG SLICES" in table.output and "2 node(s), 2 answering" in table.output
    status, body = _get(base + "/fleet/status?selector=nonsense")
    assert status == 400 and "key=value" in json.loads(body)["error"]
    bad = agents.fleet("status", "--coordinator", base, "--idle-after", "soon")
    assert bad.exit_code == 2 and "'soon' is not a duration" in bad.output
    gone = agents.fleet("status", "--coordinator", "http://127.0.0.1:9")
    # A coordinator that does not answer exits as an agent that does not (9), not 1.
    assert gone.exit_code == 9 and "cannot reach the coordinator" in gone.output


def test_a_desired_model_is_warmed_on_every_node_and_then_left_alone(
    agents: AgentFleet, tmp_path: Path
) -> None:
    """A `models:` entry of the desired file: one pass warms the repo snapshot (from a local
    Hugging Face style origin) as one ready item on every node, labelled under its name; once
    the nodes report it warm, the next pass starts no prewarm."""
    root = tmp_path / "hub"
    root.mkdir()
    files = hub.tiny_model()
    with Origin(root) as origin:
        endpoint, commit = hub.publish(origin, "org-a/Tiny-Llama", files)
        desired = tmp_path / "desired.yaml"
        desired.write_text(
            "version: v1\n"
            "prewarm:\n"
            "  - concurrency: 2\n"
            f"    models: [{{repo: org-a/Tiny-Llama, endpoint: '{endpoint}', name: tiny}}]\n"
        )
        first = agents.coordinator("serve", "--once", "--desired", str(desired))
        assert first.exit_code == 0, first.output
        for name in agents.agents:
            item = hub.ready_model(agents.cache(name), "tiny")
            assert item is not None, (name, agents.cache(name))
            assert (item.size_bytes, item.options["commit"]) == (
                sum(len(d) for d in files.values()),
                commit,
            )
        ops = {n: len(agents.operations(n, "prewarm")) for n in agents.agents}
        assert ops == dict.fromkeys(agents.agents, 1)

        def warm() -> bool:  # GetNode's cache is re-read every few seconds
            rows = json.loads(agents.fleet("status", "--nodes", "-o", "json").output)["nodes"]
            return {r["name"]: r["warm"] for r in rows} == dict.fromkeys(agents.agents, 1)

        wait_for(warm, "the model warm in every node's answer", timeout=30, every=1.0)
        again = agents.coordinator("serve", "--once", "--desired", str(desired))
        assert again.exit_code == 0, again.output
        assert {n: len(agents.operations(n, "prewarm")) for n in agents.agents} == ops
