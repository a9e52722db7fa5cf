"""What a user types that no command may take: a number past its bound, an empty value where one
is needed. Each is refused naming the option (exit 2), never a traceback and never acted on."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agent.cli.context import CliContext
from agent.cli.fleet import fleet
from agent.cli.mig import mig
from agent.cli.sim import sim
from agent.errors import InvalidSpec
from agent.gpu.sim import SimControl, open_simulator

HUGE = "999999999999999999999"  # past the API's uint32 (a GPU index) and 64-bit counts
_GROUPS = {"mig": mig, "sim": sim, "fleet": fleet}


def _run(tmp_path: Path, group: str, *args: str) -> Result:
    """``gpu-agent --simulate dgx-h100 --state-dir TMP GROUP ARGS`` in-process, env left out."""
    obj = CliContext(None, {"simulate": "dgx-h100", "state_dir": tmp_path}, env={})
    try:
        return CliRunner().invoke(_GROUPS[group], list(args), obj=obj)
    finally:
        obj.close()


@pytest.mark.parametrize(
    ("group", "args"),
    [
        ("mig", ["advise", "--gpu", HUGE]),
        ("mig", ["advise", "--gpu", "256"]),
        ("fleet", ["remediate", "n1", "--gpu", HUGE, "--agents", "unix:/nowhere", "--insecure"]),
    ],
)
def test_a_gpu_index_past_255_is_refused_naming_the_option(
    tmp_path: Path, group: str, args: list[str]
) -> None:
    """`mig advise --gpu 999999999999999999999` ended in protobuf's ValueError (the request's
    gpu_index is a uint32): a GPU index is 0-255 (docs/api.md), refused naming --gpu."""
    result = _run(tmp_path, group, *args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "'--gpu'" in result.output and "0<=x<=255" in result.output


def test_advise_still_takes_a_gpu_the_node_has(tmp_path: Path) -> None:
    result = _run(tmp_path, "mig", "advise", "--gpu", "7")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "GPU 7" in result.output


def _limit_w(state_dir: Path) -> object:
    open_simulator(state_dir, "dgx-h100")  # the node, created now if the command refused first
    return SimControl(state_dir).describe()["gpus"][0]["power_limit_w"]


@pytest.mark.parametrize("watts", ["nan", "inf", "1e308", "-inf"])
def test_another_power_writer_needs_a_finite_number_of_watts(tmp_path: Path, watts: str) -> None:
    """`sim power-writer 0 nan` (inf, 1e308) ended in round()'s ValueError or OverflowError:
    refused naming WATTS (exit 2), and no writer is set."""
    result = _run(tmp_path, "sim", "power-writer", "0", "--", watts)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "watts" in result.output.lower()
    assert _limit_w(tmp_path) == 700  # the H100's default: no writer set it


@pytest.mark.parametrize("watts", [float("nan"), float("inf"), 1e308])
def test_the_simulator_checks_the_range_of_a_power_writer_before_rounding(
    tmp_path: Path, watts: float
) -> None:
    open_simulator(tmp_path, "dgx-h100")
    with pytest.raises(InvalidSpec, match=r"watts must be 200\.\.700"):
        SimControl(tmp_path).write_power_limit(0, watts)
    assert _limit_w(tmp_path) == 700
    SimControl(tmp_path).write_power_limit(0, 400.0)
    assert _limit_w(tmp_path) == 400


@pytest.mark.parametrize("option", ["--nth", "--count"])
@pytest.mark.parametrize("value", [HUGE, str(2**31), "0"])
def test_a_fault_s_call_counts_are_bounded(tmp_path: Path, option: str, value: str) -> None:
    """`sim fault F E --nth 99999999999999999999999` was armed: the state file held a count
    without bound. 1 to 2**31-1, refused naming the option; nothing is armed."""
    result = _run(tmp_path, "sim", "fault", "nvmlDeviceGetCount", "Unknown", option, value)
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"'{option}'" in result.output
    open_simulator(tmp_path, "dgx-h100")
    assert SimControl(tmp_path).describe()["faults"] == []
    with pytest.raises(InvalidSpec, match=option.removeprefix("--")):
        SimControl(tmp_path).inject_fault(
            "nvmlDeviceGetCount", "Unknown", **{option.removeprefix("--"): int(value)}
        )
    bound = _run(tmp_path, "sim", "fault", "nvmlDeviceGetCount", "Unknown", option, str(2**31 - 1))
    assert bound.exit_code == 0, (bound.output, bound.exception)


def test_an_error_escapes_the_control_characters_the_user_typed(tmp_path: Path) -> None:
    """`mig plan -c $'\\x1b[31mred\\x07'` printed ESC and BEL to the terminal (a colour, a
    bell; any escape sequence a crafted config name or file holds): the error says them as
    escapes, and printable text, é included, as it is."""
    config = Path(__file__).resolve().parents[2] / "examples" / "mig-config.yaml"
    result = _run(tmp_path, "mig", "plan", "-f", str(config), "-c", "\x1b[31mred\x07é")
    assert result.exit_code == 2, (result.output, result.exception)
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "\\x1b[31mred\\x07é" in result.output
    assert "\n  selected-config: one of: " in result.output  # its lines laid out as before


def test_a_yaml_error_is_said_once_by_line_column_and_what(tmp_path: Path) -> None:
    """A YAML syntax error printed PyYAML's text twice (the headline and the file's field
    line) with its `"<unicode string>"` and caret noise: it is said once, by line, column and
    what is wrong."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nmig-configs:\n  a: [\n")
    broken = _run(tmp_path, "mig", "plan", "-f", str(bad), "-c", "a")
    assert broken.exit_code == 2, (broken.output, broken.exception)
    assert broken.output == (
        f"error: {bad}: not valid YAML: line 4, column 1: expected the node content, but "
        "found '<stream end>' (while parsing a flow node)\n"
    )
