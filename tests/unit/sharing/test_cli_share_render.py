"""``gpu-agent share render --dra``: the objects a spec renders, printed for GitOps; nothing
written, no agent asked."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from agent.cli.share import share

GOLDEN = Path(__file__).parent / "golden"


def render(*args: str) -> object:
    return CliRunner().invoke(share, ["render", *args], obj=None)


def test_render_prints_the_golden_objects_as_yaml() -> None:
    result = render(
        "--dra",
        "--time-slicing",
        "nvidia.com/gpu=4",
        "--time-slicing",
        "nvidia.com/mig-1g.10gb=2",
        "--namespace",
        "team-a",
    )
    assert result.exit_code == 0, result.output
    assert list(yaml.safe_load_all(result.stdout)) == list(
        yaml.safe_load_all((GOLDEN / "dra-time-slicing.yaml").read_text())
    )
    assert "note: sharing.timeSlicing.resources[0].replicas: not carried" in result.stderr


def test_render_as_json_is_a_list(tmp_path: Path) -> None:
    spec = tmp_path / "mps.yaml"
    spec.write_text("sharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n")
    result = render("--dra", "-f", str(spec), "-o", "json")
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    assert listing["kind"] == "List"
    assert [o["metadata"]["name"] for o in listing["items"]] == ["gpu-agent-mps-gpu-25pct"]


def test_render_refuses_what_the_driver_cannot_take_naming_the_field() -> None:
    result = render("--dra", "--dynamic-mig", "--mps", "gpu=2")
    assert result.exit_code == 2
    assert "sharing.mps: allocation mode dra-dynamic-mig" in result.output
    assert result.stdout.count("apiVersion") == 0


def test_render_needs_dra_and_a_namespace_that_is_a_dns_label() -> None:
    assert render("--time-slicing", "gpu=4").exit_code == 2
    bad = render("--dra", "--time-slicing", "gpu=4", "--namespace", "Team_A")
    assert bad.exit_code == 2 and "--namespace" in bad.output


def test_render_of_a_mig_strategy_alone_says_it_renders_nothing() -> None:
    """``share render --dra --mig-strategy mixed`` answered "give --time-slicing, --mps or -f
    FILE (to stop sharing: gpu-agent share clear)": a hint for ``set``, and no word on why the
    strategy alone, which ``set`` takes, renders nothing. It now says so (docs/dra.md,
    "Sharing under DRA")."""
    result = render("--dra", "--mig-strategy", "mixed")
    assert result.exit_code == 2
    assert "--mig-strategy alone renders no object" in result.stderr
    assert "share clear" not in result.stderr
