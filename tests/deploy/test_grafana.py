"""The Grafana dashboard: valid dashboard JSON, a sound layout, and every query parses.

promtool cannot parse a lone expression, so each panel query (template variables substituted)
becomes a recording rule in a generated rule file that `promtool check rules` parses: a rule
file loads only if every expression in it is valid PromQL.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import yaml

from dcgm.fields import BY_NAME
from tests.deploy.conftest import DEPLOY, run, tool
from tests.deploy.series import PENDING, unknown_series, used_series

DASHBOARD = DEPLOY / "grafana" / "gpu-node-agent.json"
#: Grafana's built-in variables, with a value of the right kind for parsing.
BUILTINS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")
_LABEL_VALUES = re.compile(r"label_values\((?:(.*),\s*)?(\w+)\)")


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def _queries() -> list[tuple[str, str]]:
    """(where, expression) of every panel target and every variable query's selector."""
    out = []
    for panel in _panels():
        for target in panel["targets"]:
            out.append(
                (f"panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"])
            )
    for var in _dashboard()["templating"]["list"]:
        if var["type"] == "query":
            match = _LABEL_VALUES.fullmatch(var["query"]["query"])
            assert match, f"variable {var['name']}: expected label_values(selector, label)"
            if match.group(1):
                out.append((f"variable {var['name']}", match.group(1)))
    return out


def constants() -> dict[str, str]:
    """The dashboard's constant variables and their values (the agents' scrape job)."""
    return {
        v["name"]: v["query"] for v in _dashboard()["templating"]["list"] if v["type"] == "constant"
    }


def _substitute(expr: str, variables: set[str]) -> str:
    fixed = constants()

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in BUILTINS:
            return BUILTINS[name]
        assert name in variables, f"undefined variable ${name} in {expr}"
        # a constant is its value; every other variable is a multi-value regex: any value
        return fixed.get(name, ".*")

    return _VARIABLE.sub(value, expr)


def test_dashboard_is_importable_json() -> None:
    dash = _dashboard()
    assert dash["uid"] == "gpu-node-agent" and dash["title"]
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    (source,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert source["query"] == "prometheus"
    for panel in _panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": f"${{{source['name']}}}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        assert panel.get("description"), f"{panel['title']}: say what the panel shows"


def test_panels_tile_the_grid() -> None:
    """Panels stay within Grafana's 24 columns and never overlap."""
    taken: set[tuple[int, int]] = set()
    for panel in _dashboard()["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_every_query_parses(tmp_path: Path) -> None:
    variables = {v["name"] for v in _dashboard()["templating"]["list"]}
    rules = [
        {"record": f"dashboard_query_{i}", "expr": _substitute(expr, variables)}
        for i, (_, expr) in enumerate(_queries())
    ]
    rule_file = tmp_path / "dashboard-queries.rules.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run([tool("promtool"), "check", "rules", str(rule_file)])
    index = {r["record"]: where for r, (where, _) in zip(rules, _queries(), strict=True)}
    output = result.stdout + result.stderr
    for record, where in index.items():
        output = output.replace(record, f"{record} ({where})")
    assert result.returncode == 0, output
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_dashboard_uses_only_series_the_agent_exports() -> None:
    names = {n for _, expr in _queries() for n in used_series(expr)}
    unknown, landed = unknown_series(names)
    assert not unknown, f"not exported by default by the agent: {unknown}"
    assert not landed, f"now exported: remove from tests/deploy/series.py PENDING: {landed}"
    pending = sorted(names & PENDING.keys())
    if pending:
        warnings.warn(f"dashboard uses series not exported yet: {pending}", stacklevel=1)


def test_dashboard_shows_what_operators_asked_for() -> None:
    """Per GPU / MIG instance: tensor activity, DRAM bandwidth, PCIe, memory, power; pods on each
    GPU; idle GPUs; cache warmth; MIG layout."""
    exprs = " ".join(expr for _, expr in _queries())
    for series in (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_POWER_USAGE",
        "gpu_agent_pod_memory_used_bytes",
        "gpu_agent_idle_seconds",
        "gpu_agent_prewarm_cache_bytes",
        "gpu_agent_mig_config_state",
        "GPU_I_PROFILE",
    ):
        assert series in exprs, series
    # series of MIG instances are told apart in legends (dcgm-exporter's dashboard does not)
    legends = [
        t["legendFormat"]
        for p in _panels()
        for t in p["targets"]
        if "GPU_I_ID" in t.get("legendFormat", "")
    ]
    assert legends


def test_the_xid_stat_counts_a_storm_of_new_xids(tmp_path: Path) -> None:
    """ "XID errors (1 h)" during a storm: XIDs seen for the first time this hour count too
    (increase() alone reads 0 for a series that starts with its first occurrence), as the
    gpu_agent:xid_errors:increase10m recording rule does. A series whose first XID came
    before the hour does not count whole when Prometheus missed it for a while (a restart)."""
    (panel,) = [p for p in _panels() if p["title"] == "XID errors (1 h)"]
    variables = {v["name"] for v in _dashboard()["templating"]["list"]}
    expr = _substitute(panel["targets"][0]["expr"], variables)
    series = 'gpu_agent_xid_errors_total{{job="gpu-agent",pool="p",node="n",gpu="0",xid="{}"}}'
    first = (
        "gpu_agent_xid_errors_first_seen_timestamp_seconds"
        '{{job="gpu-agent",pool="p",node="n",gpu="0",xid="{}"}}'
    )
    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # One XID new 20 minutes ago (3 occurrences), one older that rose by 2.
                    {"series": series.format(79), "values": "_x40 3x30"},
                    {"series": first.format(79), "values": "_x40 2400x30"},
                    {"series": series.format(13), "values": "5x40 7x30"},
                    {"series": first.format(13), "values": "0x70"},
                    # From an agent too old to say when: new to Prometheus, so counted whole.
                    {"series": series.format(48), "values": "_x40 1x30"},
                    # Seen first 10 minutes before the test's start; this Prometheus has it
                    # only from 40m: not new this hour.
                    {"series": series.format(74), "values": "_x40 4x30"},
                    {"series": first.format(74), "values": "_x40 -600x30"},
                ],
                "promql_expr_test": [
                    {"expr": expr, "eval_time": "60m", "exp_samples": [{"value": 6}]}
                ],
            }
        ],
    }
    path = tmp_path / "xid-stat.test.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = run([tool("promtool"), "test", "rules", str(path)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


#: Panels that show a DCGM field in a base unit: title -> (the field, Grafana's unit for it).
_CONVERTED = {
    "Framebuffer used (bytes)": ("DCGM_FI_DEV_FB_USED", "bytes"),
    "NVLink throughput": ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "Bps"),
}


def test_panels_in_base_units_convert_as_the_field_catalogue_does(tmp_path: Path) -> None:
    """A panel showing a DCGM field in bytes or bytes/s multiplies by the factor the agent's
    native name uses (dcgm/fields.py). The NVLink panel multiplied field 449 by 1024, taking it
    for KiB/s, while its unit is DCGM's MB/s of 1000 KiB: it drew NVLink traffic 1000 times
    too low."""
    variables = {v["name"] for v in _dashboard()["templating"]["list"]}
    raw = 1234.0  # a reading in the field's DCGM unit
    tests = []
    for title, (field, unit) in _CONVERTED.items():
        (panel,) = [p for p in _panels() if p["title"] == title]
        assert panel["fieldConfig"]["defaults"]["unit"] == unit, title
        (target,) = panel["targets"]
        labels = '{job="gpu-agent",pool="p",node="n",gpu="0"}'
        tests.append(
            {
                "interval": "1m",
                "input_series": [{"series": field + labels, "values": f"{raw}x5"}],
                "promql_expr_test": [
                    {
                        "expr": _substitute(target["expr"], variables),
                        "eval_time": "2m",
                        "exp_samples": [{"labels": labels, "value": BY_NAME[field].to_base(raw)}],
                    }
                ],
            }
        )
    path = tmp_path / "conversions.test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [], "tests": tests}))
    result = run([tool("promtool"), "test", "rules", str(path)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
