"""The alert rules: promtool accepts them, the promtool tests make every alert fire where it
should and stay quiet where it should not, the tiers are consistent, every alert has a runbook,
and the PrometheusRule object carries exactly the tested rules."""

from __future__ import annotations

import re
import sys
import warnings
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, REPO, find, render, run, tool
from tests.deploy.series import PENDING, unknown_series, used_series

RULES = DEPLOY / "prometheus" / "gpu-agent.rules.yaml"
TESTS = DEPLOY / "prometheus" / "tests" / "gpu-agent.rules.test.yaml"
OPERATIONS = REPO / "docs" / "operations.md"
TIERS = {"critical": "page", "warning": "ticket"}


def _groups() -> list[dict[str, Any]]:
    return list(yaml.safe_load(RULES.read_text())["groups"])


def _alerts() -> list[dict[str, Any]]:
    return [r for g in _groups() for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules() -> None:
    result = run([tool("promtool"), "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    result = run([tool("promtool"), "test", "rules", str(TESTS)], cwd=TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    """Each alert has a test where it fires (for each of its tiers) and one where it stays
    quiet, so a broken expression cannot pass by never firing or always firing."""
    cases = [
        c for t in yaml.safe_load(TESTS.read_text())["tests"] for c in t.get("alert_rule_test", [])
    ]
    for name in sorted({a["alert"] for a in _alerts()}):
        mine = [c for c in cases if c["alertname"] == name]
        fired = {e["exp_labels"]["severity"] for c in mine for e in c["exp_alerts"]}
        tiers = {a["labels"]["severity"] for a in _alerts() if a["alert"] == name}
        assert fired == tiers, f"{name}: tests fire {fired or 'nothing'}, the rules have {tiers}"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: no test where it stays quiet"


def test_tiers_page_inference_pools_and_ticket_the_rest() -> None:
    """severity critical means response page and applies to pool="inference" only; the ticket
    twin of a paging alert is the same expression for every other pool."""
    by_name: dict[str, dict[str, dict[str, Any]]] = {}
    for alert in _alerts():
        severity = alert["labels"]["severity"]
        assert alert["labels"]["response"] == TIERS[severity], alert["alert"]
        assert severity not in by_name.setdefault(alert["alert"], {}), f"{alert['alert']} twice"
        by_name[alert["alert"]][severity] = alert
        if severity == "critical":
            assert 'pool="inference"' in alert["expr"], alert["alert"]
    for name, tiers in by_name.items():
        if len(tiers) == 2:
            page, ticket = tiers["critical"], tiers["warning"]
            assert ticket["expr"] == page["expr"].replace('pool="inference"', 'pool!="inference"')
            assert ticket["annotations"] == page["annotations"], name


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of a Markdown page."""
    anchors = set()
    for line in markdown.splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            text = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_every_alert_has_a_runbook() -> None:
    """summary, description and a runbook_url whose anchor is a heading of docs/operations.md."""
    anchors = _anchors(OPERATIONS.read_text())
    bases = set()
    for alert in _alerts():
        notes = alert["annotations"]
        assert notes["summary"] and notes["description"], alert["alert"]
        base, _, anchor = notes["runbook_url"].partition("#")
        bases.add(base)
        assert anchor == alert["alert"].lower(), alert["alert"]
        assert anchor in anchors, f"docs/operations.md has no heading for {alert['alert']}"
    assert bases == {
        "https://github.com/gpu-node-agent/gpu-node-agent/blob/main/docs/operations.md"
    }


def test_prometheusrule_is_the_tested_rules() -> None:
    """deploy/prometheus/sync-prometheusrule has been run: the PrometheusRule the kustomization
    applies holds exactly the groups of the rules file."""
    sync = DEPLOY / "prometheus" / "sync-prometheusrule"
    result = run([sys.executable, str(sync), "--check"])
    assert result.returncode == 0, result.stderr
    rule = find(render("default"), "PrometheusRule", "gpu-agent")
    assert rule["spec"]["groups"] == _groups()


def test_rules_use_only_series_the_agent_exports() -> None:
    names = {n for g in _groups() for r in g["rules"] for n in used_series(r["expr"])}
    unknown, landed = unknown_series(names)
    assert not unknown, f"not exported by default by the agent: {unknown}"
    assert not landed, f"now exported: remove from tests/deploy/series.py PENDING: {landed}"
    pending = sorted(names & PENDING.keys())
    if pending:
        warnings.warn(f"rules use series not exported yet: {pending}", stacklevel=1)


@pytest.mark.parametrize("alert", sorted({a["alert"] for a in _alerts()}))
def test_alert_names_follow_the_convention(alert: str) -> None:
    assert re.fullmatch(r"GpuAgent[A-Z][A-Za-z]+", alert)


def test_the_stale_alert_leaves_room_for_the_slowest_sample_interval_the_agent_takes() -> None:
    """GpuAgentTelemetryStale calls a sample older than its threshold a stuck sampler;
    telemetry.interval_s had no upper bound, so a node sampling less often than that kept the
    alert pending, and one past about 6 minutes paged for a sampler that was not stuck. The
    config's bound keeps two samples inside the threshold, and a larger value is refused
    naming the setting."""
    import dataclasses

    from agent.config import TelemetrySettings, load_config
    from agent.config.rules import RULES_KEY
    from agent.errors import AgentError

    (stale,) = [a for a in _alerts() if a["alert"] == "GpuAgentTelemetryStale"]
    threshold = float(re.findall(r">\s*([0-9.]+)", stale["expr"])[0])
    (interval,) = [f for f in dataclasses.fields(TelemetrySettings) if f.name == "interval_s"]
    most = interval.metadata[RULES_KEY].le
    assert 2 * most <= threshold, (most, threshold)
    with pytest.raises(AgentError, match=r"INTERVAL_S: .*<= 30"):
        load_config(None, {"GPU_AGENT_TELEMETRY__INTERVAL_S": str(most + 1)})
