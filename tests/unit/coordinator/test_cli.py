"""`gpu-agent fleet` commands that need no agents: offline replay, and refused arguments
(`fleet prewarm`'s source options refused before any node is contacted)."""

from __future__ import annotations

import csv
import dataclasses
import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.fleet import fleet
from agent.cli.fleet.plan import _plan_table
from agent.coordinator import flows
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.inventory import NodeView
from agent.coordinator.fleet.selector import Selector
from agent.coordinator.flows import PlanResult, Selection
from agent.coordinator.planning import claimdemand, clusterdemand
from agent.coordinator.planning.demand import Demand, DemandEntry, parse_demand
from agent.coordinator.planning.planfile import load_plan
from agent.coordinator.planning.planner import plan_fleet
from agent.coordinator.planning.rightsize import Window
from agent.errors import InvalidSpec
from agent.gpu.types import GpuLayout
from agent.prewarm import kinds
from agent.wire.telemetry import telemetry_from
from tests.unit.coordinator.agents import invoke, invoke_process
from tests.unit.coordinator.fleets import gpu, node
from tests.unit.coordinator.listener import connected
from tests.unit.coordinator.test_rightsize import snapshot


def test_an_offline_replay_on_nodes_one_might_buy(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time,profile,count\n0,3g.40gb,4\n3600,3g.40gb,6\n")
    result = invoke(
        fleet, ["replay", "--trace", str(trace), "--offline", "--add", "dgx-h100=2", "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    first, second = json.loads(result.output)
    assert (first["met"], first["unmet"], second["met"]) == (4, [], 6)
    assert second["total_slices"] == 8 * 3  # three GPUs in MIG mode by then


def test_the_table_of_a_replay_sums_up_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time,profile,count\n0,7g.80gb,3\n")
    result = invoke(fleet, ["replay", "--trace", str(trace), "--offline", "--add", "dgx-h100=1"])
    assert result.exit_code == 0, result.output
    assert "0 of 1 step(s) leave demand unmet" in result.output


def test_commands_say_what_is_missing(tmp_path: Path) -> None:
    demand = tmp_path / "demand.yaml"
    demand.write_text("version: v1\ndemand: {1g.10gb: 1}\n")
    no_agents = invoke(fleet, ["plan", "--demand", str(demand)])
    assert no_agents.exit_code == 2 and "where are the agents?" in no_agents.output
    both = invoke(
        fleet,
        ["apply", "mig", "-f", str(demand), "--plan", str(demand), "--agents", "a:1", "--insecure"],
    )
    assert both.exit_code == 2 and "not both" in both.output
    bad_add = invoke(fleet, ["replay", "--trace", str(demand), "--offline", "--add", "x"])
    assert bad_add.exit_code == 2


def test_the_plan_table_shows_changes_totals_and_unmet_demand() -> None:
    fleet_layouts = [node("a", gpu("a", 0, instances=[("1g.10gb", 4)], busy=[(7, 1)]), gpu("a", 1))]
    want = Demand((DemandEntry("3g.40gb", 2), DemandEntry("7g.80gb", 2)))
    result = PlanResult(plan_fleet(fleet_layouts, want), 3, ("node-z",))
    text = _plan_table({"result": result, "out": Path("plan.yaml")})
    assert "a     1    H100 80GB HBM3  -" in text
    assert "UNMET 7g.80gb (priority 0): 2 of 2 cannot be placed" in text
    assert "lost to 3g.40gb (priority 0, 1 device(s))" in text
    assert "a plan from scratch would destroy 3" in text
    assert "Not planned (no answer): node-z" in text
    assert "gpu-agent fleet apply mig --plan plan.yaml" in text


def _answering(monkeypatch: pytest.MonkeyPatch, views: list[NodeView]) -> None:
    """`fleet plan` sees these nodes as its sweep's answer (no agent is dialled)."""

    async def select(fleet: object, chosen: Selector, **_: object) -> Selection:
        picked = tuple(v for v in views if chosen.matches(v))
        return Selection(picked, {v.name: Target(v.address, v.name) for v in picked})

    monkeypatch.setattr(flows, "select", select)


def _view(name: str, *layouts: GpuLayout, labels: dict[str, str] | None = None) -> NodeView:
    return NodeView(name, f"{name}:9401", labels=labels or {}, layouts=layouts)


def test_plan_exits_11_when_demand_is_unmet_and_still_prints_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _answering(monkeypatch, [_view("a", gpu("a", 0))])
    demand = tmp_path / "demand.yaml"
    demand.write_text(
        "version: v1\ndemand:\n  - {profile: 7g.80gb, count: 1, priority: 1}\n"
        "  - {profile: 1g.10gb, count: 2}\n"
    )
    out = tmp_path / "plan.yaml"
    result = invoke(
        fleet, ["plan", "--demand", str(demand), "--agents", "a:1", "--insecure", "--out", str(out)]
    )
    assert result.exit_code == 11, result.output
    assert "UNMET 1g.10gb (priority 0)" in result.output
    assert "lost to 7g.80gb (priority 1, 1 device(s))" in result.output
    assert "error: 2 device(s) of 1 demand entry left unmet: 1g.10gb short 2" in result.output
    assert load_plan(out)  # the plan is written all the same
    met = tmp_path / "met.yaml"
    met.write_text("version: v1\ndemand: {7g.80gb: 1}\n")
    assert (
        invoke(fleet, ["plan", "--demand", str(met), "--agents", "a:1", "--insecure"]).exit_code
        == 0
    )


def test_plan_says_when_the_selector_matched_no_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _answering(monkeypatch, [_view("a", gpu("a", 0))])
    demand = tmp_path / "demand.yaml"
    demand.write_text("version: v1\ndemand: {7g.80gb: 1}\n")
    result = invoke(
        fleet, ["plan", "--demand", str(demand), "--agents", "a:1", "--insecure", "-l", "name=zz"]
    )
    assert result.exit_code == 3
    assert "error: the selector name=zz matched no node" in result.output


def test_plan_from_the_cluster_takes_pending_pods_and_their_node_selector_as_a_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _answering(
        monkeypatch,
        [_view("a", gpu("a", 0), labels={"pool": "train"}), _view("b", gpu("b", 0))],
    )
    pods = [
        {
            "metadata": {"name": "job", "namespace": "ml"},
            "spec": {
                "nodeSelector": {"pool": "train"},
                "containers": [{"resources": {"limits": {"nvidia.com/mig-3g.40gb": 2}}}],
            },
            "status": {"phase": "Pending"},
        }
    ]
    monkeypatch.setattr(clusterdemand, "cluster_client", lambda: None)
    monkeypatch.setattr(clusterdemand, "list_pods", lambda client: pods)
    monkeypatch.setattr(claimdemand, "list_claims", lambda client: [])
    monkeypatch.setattr(claimdemand, "list_templates", lambda client: [])
    result = invoke(
        fleet, ["plan", "--from-cluster", "--agents", "a:1", "--insecure", "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["demand"]["source"] == "cluster"
    assert [(c["node"], c["after"]) for c in doc["changes"]] == [("a", [["3g.40gb", 2]])]
    both = invoke(
        fleet, ["plan", "--from-cluster", "--demand", "x.yaml", "--agents", "a:1", "--insecure"]
    )
    assert both.exit_code == 2 and "one of them" in both.output


def test_replay_writes_its_report_and_picture(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("time,profile,count,priority\n0,7g.80gb,8,0\n0,1g.10gb,56,0\n")
    report, svg = tmp_path / "report.csv", tmp_path / "demand.svg"
    args = ["replay", "--trace", str(trace), "--offline", "--add", "dgx-h100=1"]
    result = invoke(fleet, [*args, "--report", str(report), "--svg", str(svg), "--end", "3600"])
    assert result.exit_code == 0, result.output
    assert "0:56/64" in result.output  # met by priority, in the table
    (row,) = csv.DictReader(report.read_text().splitlines())
    assert (row["met"], row["unmet"], row["gpus_reconfigured"]) == ("56", "8", "8")
    assert svg.read_text().startswith("<svg") and 'class="capacity"' in svg.read_text()
    bad = invoke(fleet, [*args, "--report", str(tmp_path / "r.txt")])
    assert bad.exit_code == 2 and ".csv or .json" in bad.output


def test_replay_refuses_to_write_over_its_own_trace_naming_it(tmp_path: Path) -> None:
    trace = tmp_path / "week.csv"
    text = "time,profile,count\n0,7g.80gb,1\n"
    trace.write_text(text)
    (tmp_path / "link.csv").symlink_to(trace)
    args = ["replay", "--trace", str(trace), "--offline", "--add", "dgx-h100=1"]
    for report in (str(trace), str(tmp_path / "link.csv"), str(tmp_path / "." / "week.csv")):
        result = invoke(fleet, [*args, "--report", report])
        assert result.exit_code == 2, result.output
        assert f"is the input --trace file {trace}" in result.output
    assert invoke(fleet, [*args, "--svg", str(trace)]).exit_code == 2
    same = str(tmp_path / "out.csv")
    both = invoke(fleet, [*args, "--report", same, "--svg", same])
    assert both.exit_code == 2 and "name two files" in both.output
    assert trace.read_text() == text and not (tmp_path / "out.csv").exists()


def test_plan_refuses_to_write_its_plan_over_its_demand_file(
    tmp_path: Path, listener: socket.socket
) -> None:
    """`fleet plan --demand demand.yaml --out demand.yaml` replaced the demand with the plan
    (a FleetMigPlan), so the next `fleet plan` read no demand. Refused naming --out, before
    any agent is dialled, and the demand file is left as it was."""
    demand = tmp_path / "demand.yaml"
    text = "version: v1\ndemand: {1g.10gb: 1}\n"
    demand.write_text(text)
    (tmp_path / "link.yaml").symlink_to(demand)
    address = f"unix:{listener.getsockname()}"
    for out in (demand, tmp_path / "link.yaml", tmp_path / "." / "demand.yaml"):
        args = ["plan", "--demand", str(demand), "--out", str(out)]
        result = invoke(fleet, [*args, "--agents", address, "--insecure"])
        assert result.exit_code == 2, result.output
        assert f"is the input --demand file {demand}" in result.output and "out: " in result.output
    assert demand.read_text() == text
    assert not connected(listener)


def test_rightsize_lists_the_pods_that_fit_smaller_and_writes_their_demand(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = gpu("a", 0, instances=[("3g.40gb", 0)])
    _answering(monkeypatch, [_view("a", layout)])
    sweeps: list[int] = []

    async def observe(
        f: object,
        selection: Selection,
        *,
        samples: int,
        every_s: float,
        swept: Callable[[int, Window], None],
    ) -> Window:
        sweeps.append(samples)
        window = Window()
        sample = ("GPU-a-0", 1, "3g.40gb", "small", {252: 3000, 1001: 0.1})
        for done in range(1, samples + 1):
            window.add("a", telemetry_from(snapshot(sample)))
            swept(done, window)
        return window

    monkeypatch.setattr(flows, "observe", observe)
    out = tmp_path / "smaller.yaml"
    args = ["rightsize", "--agents", "a:1", "--insecure", "--window", "2m", "--every", "30s"]
    result = invoke(fleet, [*args, "--demand-out", str(out)])
    assert result.exit_code == 0, result.output
    assert sweeps == [5]
    # A 2-minute watch says what it does and where it is (stderr), not silence till the end.
    assert "Watching 1 node(s) for 2m: 5 sweeps, one every 30s." in result.output
    assert "sweep 2/5: 1 pod device(s) seen; 90s left" in result.output
    assert "1 of 1 pod(s) fit a smaller profile (headroom 20%), freeing 3 memory slice(s)" in (
        result.output
    )
    assert parse_demand(out.read_text()).entries == (
        DemandEntry("1g.10gb", 1, "NVIDIA H100 80GB HBM3"),
    )
    bad = invoke(
        fleet, ["rightsize", "--agents", "a:1", "--insecure", "--window", "1m", "--every", "0"]
    )
    assert bad.exit_code == 2 and "--every" in bad.output


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ([], kinds.schemas()[0].manifest_source),  # none given: the first kind's is named
        (["--url", "https://x/a", "--model", "org/m"], "model"),
        (["--image", "r/app:1", "--model", "org/m"], "model"),
        (["--url", "https://x/a", "--image", "r/app:1"], "image"),
        (["--url", "https://x/a", "--revision", "v1"], "revision"),
        (["--url", "https://x/a", "--include", "*.json"], "include"),
        (["--image", "r/app:1", "--endpoint", "https://hub"], "endpoint"),
        (["--model", "org/m", "--sha256", "0" * 64], "sha256"),
        (["--model", "org/m", "--runtime-handler", "nydus"], "runtime_handler"),
        (["--model", "../etc"], "model"),
        (["--model", "org/m", "--revision", "a..b"], "revision"),
        (["--model", "org/m", "--include", ""], "include"),
        (["--model", "org/m", "--name", "a/b"], "name"),
        (["--model", "org/m", "--endpoint", "ftp://hub"], "endpoint"),
        (["--model", "org/m", "--header-file", "Authorization"], "header_files"),
        (
            ["--model", "org/m", "--header-file", "Authorization=token"],
            "header_files[Authorization]",
        ),
        (["--image", "r/app:1", "--header-file", "Authorization=/s/t"], "header_files"),
    ],
)
def test_fleet_prewarm_refuses_a_bad_combination_before_contacting_a_node(
    args: list[str], field: str, listener: socket.socket
) -> None:
    """Exactly one of --url, --image, --model, with only the options of that source; the
    refusal is InvalidSpec naming the field, and no agent is contacted."""
    address = f"unix:{listener.getsockname()}"
    result = CliRunner().invoke(fleet, ["prewarm", *args, "--agents", address, "--insecure"])
    assert result.exit_code == InvalidSpec.exit_code, result.output
    # "error: [--model: ]HEADLINE", then "  FIELD: description" per violation not in it.
    lines = [
        line.removeprefix("error: ").removeprefix("--model: ").strip()
        for line in result.output.splitlines()
    ]
    assert result.output.startswith("error: ")
    assert field in [line.split(": ")[0] for line in lines], result.output
    assert not connected(listener)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["-f", "FILE", "--strategy", "mps", "--replicas", "2"], "file"),
        (["-f", "FILE", "--rename"], "file"),
        (["-f", "FILE", "--resource", "nvidia.com/mig-1g.10gb"], "file"),
        (["--strategy", "time-slicing", "--replicas", "99999999999"], "--replicas"),
    ],
)
def test_fleet_share_refuses_a_bad_combination_before_contacting_a_node(
    args: list[str], named: str, listener: socket.socket, tmp_path: Path
) -> None:
    """`fleet apply share -f FILE --strategy mps --replicas 2` rolled the file out and dropped
    the options without a word, and `--replicas 99999999999` was a ValueError traceback. Both
    are now refused naming the option, before any node is contacted (docs/coordinator.md,
    "Rollouts")."""
    spec = tmp_path / "ts.yaml"
    spec.write_text("sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 4}]\n")
    args = [str(spec) if a == "FILE" else a for a in args]
    address = f"unix:{listener.getsockname()}"
    result = invoke(fleet, ["apply", "share", *args, "--agents", address, "--insecure"])
    assert result.exit_code == InvalidSpec.exit_code, result.output
    assert named in result.output and "Traceback" not in result.output
    assert not connected(listener)


def test_a_node_s_refusal_of_a_share_rollout_names_the_field(tmp_path: Path) -> None:
    """A node that refused the sharing config was reported as "the sharing config is refused
    (1 problem)", the problem itself left out. The node's line now carries each field and why
    (docs/coordinator.md, "Rollouts")."""
    from tests.unit.api.support import InProcessAgent, agent_config

    with InProcessAgent(tmp_path, agent_config(tmp_path)) as agent:
        share = ["fleet", "apply", "share", "--strategy", "mps", "--replicas", "49"]
        result = invoke_process(
            [*share, "--agents", f"unix:{agent.socket}", "--insecure"], timeout=120
        )
    assert result.exit_code != 0, result.output
    assert "sharing.mps.resources[0].replicas: at most 48" in result.output, result.output


@pytest.mark.parametrize("value", ["-5", "-1h", "nan", "inf", "soon"])
def test_fleet_status_refuses_an_idle_threshold_that_is_no_duration(
    value: str, listener: socket.socket
) -> None:
    """`--idle-after -5` counted every GPU idle ('16 idle for -5 or more'), `nan` none: a
    duration is a finite number of seconds, 0 or more, refused naming the option before any
    agent is dialled."""
    address = f"unix:{listener.getsockname()}"
    result = invoke(fleet, ["status", "--agents", address, "--insecure", "--idle-after", value])
    assert result.exit_code == 2, result.output
    assert "idle-after: " in result.output
    assert not connected(listener)


@pytest.mark.parametrize(("option", "other"), [("--window", "--every"), ("--every", "--window")])
def test_rightsize_names_the_option_whose_duration_is_bad(option: str, other: str) -> None:
    """The refusal named `idle-after`, an option rightsize does not have."""
    args = ["rightsize", "--agents", "a:1", "--insecure", option, "1x", other, "1m"]
    result = invoke(fleet, args)
    assert result.exit_code == 2, result.output
    assert f"{option.removeprefix('--')}: " in result.output
    assert "idle-after" not in result.output


@pytest.mark.parametrize("selector", ["pool=inference", "pool!=training"])
def test_a_label_selector_without_a_label_source_is_refused(
    selector: str, listener: socket.socket
) -> None:
    """--agents (and --dns) read no node labels: `pool=inference` selected no node and
    `pool!=training` every node, training ones included, for labels nobody read. Refused
    naming the selector and --kubernetes, before any agent is dialled."""
    address = f"unix:{listener.getsockname()}"
    for args in (
        ["status", "-l", selector],
        ["apply", "share", "--strategy", "time-slicing", "--replicas", "2", "-l", selector],
    ):
        result = invoke(fleet, [*args, "--agents", address, "--insecure"])
        assert result.exit_code == 2, result.output
        assert selector in result.output and "--kubernetes" in result.output, result.output
    assert not connected(listener)


@pytest.mark.parametrize("url", ["foo", "ftp://x", "http://", "127.0.0.1:9400"])
def test_fleet_status_refuses_a_coordinator_url_that_is_not_http(url: str) -> None:
    """`--coordinator foo` ended in a traceback (urllib's 'unknown url type'), and
    `--coordinator ftp://x` was fetched over FTP and said 'cannot reach the coordinator'."""
    result = CliRunner().invoke(fleet, ["status", "--coordinator", url])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "coordinator: " in result.output and "http://HOST:PORT" in result.output, result.output


def test_a_shared_fleet_option_keeps_its_help_whichever_kind_registers_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`fleet prewarm --pin`, `--name` and `--header-file` serve every kind: their help is said
    once (`SHARED_FLEET_HELP`), so a new kind registered before the others, with its own
    words for the field, does not change what the option says for every kind."""
    from agent.cli.fleet import prewarm as fleet_prewarm
    from agent.prewarm.fields import SHARED_FLEET_HELP, arg
    from agent.prewarm.target import TargetSchema

    @dataclasses.dataclass(frozen=True)
    class AaaRequest:
        path: str = arg(source=True)
        pin: bool = arg("Zap it forever.", default=False, fleet="Zap it forever.")

    shipped = kinds.schemas()
    first = TargetSchema("aaa", AaaRequest, "A kind that registers first.")
    monkeypatch.setattr(kinds, "schemas", lambda: [first, *shipped])
    pin = next(f for f in fleet_prewarm._fields() if f.name == "pin")
    assert pin.arg.fleet == SHARED_FLEET_HELP["pin"] == "Never evict it."
