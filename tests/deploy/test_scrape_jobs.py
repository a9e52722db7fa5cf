"""Every query of the rules and the dashboard selects the scrape job of the series it reads.

The GPU Operator's dcgm-exporter exports the same DCGM_FI_* names as the agent. A selector
without the job read both: an alert fired for a GPU only dcgm-exporter saw (with no node), and
every dashboard sum counted a GPU twice where both exporters are scraped. The jobs are those the
manifests give the series (prometheus-operator names a job after the Service it scrapes) and
those docs/install.md's scrape config for a Prometheus without the operator names.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import REPO, find, render
from tests.deploy.test_grafana import _queries, constants
from tests.deploy.test_prometheus_rules import _groups

AGENT_JOB = "gpu-agent"
COORDINATOR_JOB = "gpu-agent-coordinator"
INSTALL = REPO / "docs" / "install.md"

#: a selector of an exported series (or `up`), with its matchers when it has any
_SELECTOR = re.compile(r"\b(DCGM_FI_[A-Z0-9_]+|gpu_agent_[a-z0-9_]+|up)\b(\s*\{[^}]*\})?")
_JOB = re.compile(r'(?<![\w!])job\s*=\s*"([^"]*)"')


def _jobs(expr: str) -> list[tuple[str, str | None]]:
    """(series, the job its selector matches exactly, or None) for each selector in ``expr``."""
    out = []
    for match in _SELECTOR.finditer(expr):
        job = _JOB.search(match.group(2) or "")
        out.append((match.group(1), job.group(1) if job else None))
    return out


def _expected(series: str, agent: str) -> set[str]:
    if series.startswith("gpu_agent_coordinator_"):
        return {COORDINATOR_JOB}
    if series == "up":
        return {agent, COORDINATOR_JOB}
    return {agent}


def _rule_exprs() -> list[tuple[str, str]]:
    return [
        (str(r.get("alert") or r.get("record")), r["expr"]) for g in _groups() for r in g["rules"]
    ]


def test_jobs_finds_a_selector_without_its_job() -> None:
    """The check below cannot pass vacuously: it sees bare and labelled selectors alike."""
    expr = 'DCGM_FI_DEV_FB_USED / (up{job!="x"} + gpu_agent_gpu_up{pool="a", job="gpu-agent"})'
    assert _jobs(expr) == [
        ("DCGM_FI_DEV_FB_USED", None),
        ("up", None),
        ("gpu_agent_gpu_up", "gpu-agent"),
    ]
    assert _jobs("gpu_agent:gpu_busy:ratio > 0") == []


@pytest.mark.parametrize(("where", "expr"), _rule_exprs(), ids=[w for w, _ in _rule_exprs()])
def test_every_rule_selects_the_job_of_the_series_it_reads(where: str, expr: str) -> None:
    found = _jobs(expr)
    wrong = [(s, j) for s, j in found if j not in _expected(s, AGENT_JOB)]
    assert not wrong, f"{where}: selectors without their scrape job: {wrong}"


def test_every_dashboard_query_selects_the_agents_job() -> None:
    """Every selector of the dashboard names job="$job", a constant whose value is the agents'
    job (one place to change when the job is renamed)."""
    assert constants().get("job") == AGENT_JOB
    wrong = [
        (where, series, job)
        for where, expr in _queries()
        for series, job in _jobs(expr)
        if job != "$job"
    ]
    assert not wrong, f'selectors without job="$job": {wrong}'
    assert any(_jobs(expr) for _, expr in _queries())


def _selected(objs: list[dict[str, Any]], monitor: dict[str, Any]) -> list[dict[str, Any]]:
    spec = monitor["spec"]
    return [
        s
        for s in objs
        if s["kind"] == "Service"
        and s["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]
        and spec["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]


@pytest.mark.parametrize(
    ("monitor", "job", "component"),
    [("gpu-agent", AGENT_JOB, "agent"), ("gpu-agent-coordinator", COORDINATOR_JOB, "coordinator")],
)
def test_each_servicemonitor_gives_its_series_the_job_the_queries_select(
    monitor: str, job: str, component: str
) -> None:
    """prometheus-operator's job is the Service's name (no jobLabel, no relabelling of job):
    the agents' Service is gpu-agent, the coordinator's gpu-agent-coordinator, and each is
    scraped on a port its Service has, at /metrics."""
    objs = render("default")
    sm = find(objs, "ServiceMonitor", monitor)
    assert "jobLabel" not in sm["spec"]
    (service,) = _selected(objs, sm)
    assert service["metadata"]["name"] == job
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == component
    ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in sm["spec"]["endpoints"]:
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        relabels = endpoint.get("relabelings", []) + endpoint.get("metricRelabelings", [])
        assert all(r.get("targetLabel") != "job" for r in relabels), endpoint


def test_the_scrape_config_without_the_operator_names_the_same_jobs() -> None:
    """docs/install.md's scrape config for a Prometheus without the operator scrapes the agents
    and the coordinator as the jobs the rules select."""
    text = INSTALL.read_text(encoding="utf-8")
    section = text.split("## Prometheus without the operator", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    configs = [c for b in blocks for c in yaml.safe_load(b).get("scrape_configs", [])]
    components = {
        c["job_name"]: {
            r["regex"]
            for r in c["relabel_configs"]
            if r.get("action") == "keep"
            and r["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]
        }
        for c in configs
    }
    assert components == {AGENT_JOB: {"agent"}, COORDINATOR_JOB: {"coordinator"}}
