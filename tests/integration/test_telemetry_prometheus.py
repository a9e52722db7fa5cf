"""A real Prometheus scrapes the agent: every query of NVIDIA's Grafana dashboard 12239 returns the
series a dcgm-exporter (default flex mode) returns on the same MIG node, sums over a MIG GPU
equal the memory in use, and promtool finds nothing wrong with the native names.

One deliberate difference: on a MIG GPU dcgm-exporter repeats the physical-GPU fields (power,
temperature, clocks) on every GPU instance's series (its issue #353), so sum(POWER_USAGE) counts
such a GPU once per instance. The agent renders them once per GPU (docs/metrics.md, "Fields").

Needs the Debian ``prometheus`` package (``apt-get update && apt-get install -y prometheus``;
scripts/test installs it). Without the binaries these tests skip and say how to install them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import TelemetrySettings
from agent.telemetry.service import TelemetryService, build_telemetry
from tests.ports import launch_listening, stop
from tests.unit.telemetry.httpd import scrape, serve_metrics
from tests.unit.telemetry.simnode import SimNode, sim_node

pytestmark = pytest.mark.integration

_INSTALL = "install it with: apt-get update -qq && apt-get install -y prometheus"
_DEADLINE_S = 30.0

#: Dashboard 12239 ("NVIDIA DCGM Exporter Dashboard", reference/telemetry.md §6): panel -> query,
#: with the dashboard's $instance / $gpu template variables set to "all".
DASHBOARD_12239 = {
    "GPU Temperature": 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Avg. Temp": 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})',
    "GPU Power Usage": 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Power Total": 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})',
    "GPU SM Clocks": 'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    "GPU Utilization": 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Framebuffer Mem Used": 'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
    "Tensor Core Utilization": (
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}'
    ),
}
#: The dashboard's template variables: label_values(DCGM_FI_DEV_GPU_TEMP, <label>).
DASHBOARD_VARIABLES = ("instance", "gpu")

# Simulated node: 8x H100, GPU 1 in MIG mode with two 1g.10gb instances (their GPU_I_IDs are
# read at run time). Expected series per panel, as (gpu, GPU_I_ID):
# dcgm-exporter's flex mode watches the instances of a MIG GPU and the other GPUs whole, so the
# per-instance fields (framebuffer, tensor activity) come per instance on GPU 1 and per GPU
# elsewhere; GPU_UTIL is not available on a MIG GPU; physical-GPU fields once per GPU (see the
# module doc); aggregations are one series.
WHOLE = "whole"  # every GPU, once
FLEX = "flex"  # the instances of GPU 1, every other GPU whole
NOT_MIG = "not-mig"  # every GPU but the MIG one
ONE = "one"
EXPECTED_SERIES = {
    "GPU Temperature": WHOLE,
    "GPU Avg. Temp": ONE,
    "GPU Power Usage": WHOLE,
    "GPU Power Total": ONE,
    "GPU SM Clocks": WHOLE,
    "GPU Utilization": NOT_MIG,
    "GPU Framebuffer Mem Used": FLEX,
    "Tensor Core Utilization": FLEX,
}
#: GPU memory used by the processes on GPU 1's two instances, MiB
MIG_PROCESS_MIB = (1536, 512)


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed; {_INSTALL}")
    return path


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _node(tmp_path: Path) -> SimNode:
    node = sim_node(tmp_path / "state")
    for gpu in range(8):
        if gpu != 1:
            node.control.set_workload(gpu, sm_active=0.5, tensor_active=0.1 * gpu / 2)
    for slot, tensor in ((0, 0.25), (1, 0.75)):
        gi = node.create_instance(1, "1g.10gb", slot=slot)
        node.control.set_workload(1, gpu_instance=gi.id, sm_active=0.5, tensor_active=tensor)
        node.control.start_process(
            700 + slot,
            1,
            used_memory_mib=MIG_PROCESS_MIB[slot],
            gpu_instance=gi.id,
            compute_instance=0,
        )
    node.control.set_workload(0, sm_active=0.9, tensor_active=0.42)
    return node


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[TelemetryService, int]]:
    node = _node(tmp_path)
    settings = TelemetrySettings(interval_s=0.5, kubelet_socket=tmp_path / "absent.sock")
    service = build_telemetry(
        node.driver, settings, hostname="node-1", proc_root=node.control.proc_root
    )
    service.start()
    with serve_metrics(service.exporter) as port:
        try:
            yield service, port
        finally:
            service.stop()


@pytest.fixture
def prometheus(tmp_path: Path, agent: tuple[TelemetryService, int]) -> Iterator[str]:
    binary = _binary("prometheus")
    _, agent_port = agent
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpu-agent\n"
        "    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{agent_port}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("w")

    def launch(port: int) -> list[subprocess.Popen[bytes]]:
        return [
            subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        ]

    port, procs = launch_listening(launch)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: _query(url, 'up{job="gpu-agent"} == 1'), "the agent's target to be up")
        yield url
    finally:
        stop(procs, 30)
        log.close()


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    answer = _get_json(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def _wait_for(probe: Any, what: str) -> Any:
    deadline = time.monotonic() + _DEADLINE_S
    while True:
        try:
            result = probe()
        except OSError:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def _dashboard_query(template: str) -> str:
    return template.replace("$instance", ".*").replace("$gpu", ".*")


def _series(result: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(r["metric"].get("gpu", ""), r["metric"].get("GPU_I_ID", "")) for r in result}


def test_every_dashboard_12239_query_returns_dcgm_exporters_series(prometheus: str) -> None:
    instances = _wait_for(
        lambda: _query(prometheus, 'DCGM_FI_DEV_FB_USED{gpu="1", GPU_I_ID!=""}'),
        "GPU 1's instances",
    )
    mig = {("1", r["metric"]["GPU_I_ID"]) for r in instances}
    assert len(mig) == 2
    whole = {(str(g), "") for g in range(8)}
    expected = {
        WHOLE: whole,
        FLEX: (whole - {("1", "")}) | mig,
        NOT_MIG: whole - {("1", "")},
        ONE: {("", "")},
    }
    for panel, template in DASHBOARD_12239.items():
        query = _dashboard_query(template)
        want = expected[EXPECTED_SERIES[panel]]
        result = _wait_for(
            lambda q=query, w=want: (r := _query(prometheus, q)) and _series(r) == w and r,
            f"{panel}: {query} to return the series {sorted(want)}",
        )
        assert _series(result) == want, panel


def test_sums_over_a_mig_gpu_equal_the_memory_in_use(prometheus: str) -> None:
    """No double counting: the framebuffer rows of a MIG GPU add up to its processes' memory."""
    total = sum(MIG_PROCESS_MIB)
    result = _wait_for(
        lambda: (
            (r := _query(prometheus, 'sum(DCGM_FI_DEV_FB_USED{gpu="1"})'))
            and float(r[0]["value"][1]) == total
            and r
        ),
        f"sum(DCGM_FI_DEV_FB_USED{{gpu='1'}}) == {total}",
    )
    assert float(result[0]["value"][1]) == total
    by_instance = _query(prometheus, 'DCGM_FI_DEV_FB_USED{gpu="1"}')
    assert sorted(float(r["value"][1]) for r in by_instance) == sorted(MIG_PROCESS_MIB)


def test_dashboard_values_and_units(prometheus: str) -> None:
    tensor = _wait_for(
        lambda: _query(prometheus, 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0"}'), "tensor activity"
    )
    assert float(tensor[0]["value"][1]) == pytest.approx(0.42, rel=0.01)  # ratio, percentunit
    per_instance = _query(prometheus, 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="1", GPU_I_ID!=""}')
    assert sorted(round(float(r["value"][1]), 2) for r in per_instance) == [0.25, 0.75]
    clocks = _query(prometheus, _dashboard_query(DASHBOARD_12239["GPU SM Clocks"]))
    assert {r["metric"]["gpu"] for r in clocks} == {str(g) for g in range(8)}, clocks
    assert all(1e8 < float(r["value"][1]) < 3e9 for r in clocks), "hertz after * 1000000"
    power = _query(prometheus, 'DCGM_FI_DEV_POWER_USAGE{gpu="0"}')
    assert 10 < float(power[0]["value"][1]) < 1000, "watts"


def test_dashboard_variables_list_every_gpu(prometheus: str) -> None:
    values = {}
    for label in DASHBOARD_VARIABLES:
        query = urllib.parse.urlencode({"match[]": "DCGM_FI_DEV_GPU_TEMP"})
        values[label] = _get_json(f"{prometheus}/api/v1/label/{label}/values?{query}")["data"]
    assert values["gpu"] == [str(i) for i in range(8)]
    assert len(values["instance"]) == 1


def test_promtool_finds_no_problem_with_native_names(tmp_path: Path) -> None:
    promtool = _binary("promtool")
    node = _node(tmp_path)
    settings = TelemetrySettings(metric_names="native", kubelet_socket=tmp_path / "absent.sock")
    service = build_telemetry(
        node.driver, settings, hostname="node-1", proc_root=node.control.proc_root
    )
    service.start()
    try:
        time.sleep(0.2)
        service.sampler.tick()
        with serve_metrics(service.exporter) as port:
            # promtool lints the classic text format (it cannot parse OpenMetrics).
            _, body = scrape(port, "text/plain")
        check = subprocess.run(
            [promtool, "check", "metrics"], input=body, capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
        assert check.stdout + check.stderr == ""
    finally:
        service.stop()
