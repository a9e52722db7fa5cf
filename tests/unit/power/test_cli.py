"""``gpu-agent power`` on a simulated node (an embedded agent): what the tables and JSON say."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner, Result

from agent.cli.context import CliContext
from agent.cli.power import power
from agent.gpu.sim import SimControl


def _power(tmp_path: Path, *args: str, stdin: bytes | None = None) -> Result:
    obj = CliContext(None, {"simulate": "dgx-h100", "state_dir": tmp_path}, env={})
    try:
        return CliRunner().invoke(power, list(args), obj=obj, input=stdin)
    finally:
        obj.close()


def test_show_names_a_gpu_whose_limits_cannot_be_read_and_shows_the_others(
    tmp_path: Path,
) -> None:
    """`power show` failed with exit 6 and no table when one GPU had no power management."""
    assert _power(tmp_path, "show").exit_code == 0  # makes the simulated node
    SimControl(tmp_path).inject_fault(
        "nvmlDeviceGetPowerManagementLimitConstraints", "NotSupported", gpu=1, count=1000
    )
    table = _power(tmp_path, "show")
    assert table.exit_code == 0, table.output
    rows = [line.split()[0] for line in table.stdout.splitlines()[1:] if line[:1].isdigit()]
    assert rows == ["0", "2", "3", "4", "5", "6", "7"]
    assert "warning: GPU 1: its power limits cannot be read" in table.stderr
    data = json.loads(_power(tmp_path, "show", "-o", "json").stdout)
    assert [g["index"] for g in data["gpus"]] == [0, 2, 3, 4, 5, 6, 7]
    assert data["unread_gpus"] == [1] and data["lost_gpus"] == []


def test_a_spec_that_is_not_utf8_is_refused_naming_the_option(tmp_path: Path) -> None:
    """Bytes that are not UTF-8, in a file or on stdin, were a UnicodeDecodeError traceback."""
    bad = tmp_path / "power.yaml"
    bad.write_bytes(b"\xff\xfeversion: v1\n")
    for args, stdin in [(("-f", str(bad)), None), (("-f", "-"), b"\x8a\x00\xff")]:
        refused = _power(tmp_path, "apply", *args, stdin=stdin)
        assert refused.exit_code == 2, refused.output
        assert "not UTF-8" in refused.output and "file" in refused.output, refused.output
    missing = _power(tmp_path, "apply", "-f", str(tmp_path / "absent.yaml"))
    assert missing.exit_code == 2 and "does not exist" in missing.output, missing.output


def test_apply_says_where_the_driver_holds_another_limit_than_the_one_set(
    tmp_path: Path,
) -> None:
    """Another writer on the host holds GPU 2 at 400 W: the row's AFTER is the 400 W the
    driver holds (read back), JSON keeps the 500 W asked beside it, and a warning names both."""
    assert _power(tmp_path, "show").exit_code == 0  # makes the simulated node
    SimControl(tmp_path).write_power_limit(2, 400)
    spec = tmp_path / "power.yaml"
    spec.write_text("version: v1\npower: [{gpus: [1, 2], limit: 500W}]\n")
    applied = _power(tmp_path, "apply", "-f", str(spec), "-o", "json")
    assert applied.exit_code == 0, applied.output
    changes = {c["index"]: c for c in json.loads(applied.stdout)["changes"]}
    assert (changes[2]["after_w"], changes[2]["requested_w"]) == (400, 500)
    assert (changes[1]["after_w"], changes[1]["requested_w"]) == (500, 500)
    assert "warning: GPU 2 (GPU-" in applied.stderr
    assert "set to 500 W, but the driver holds 400 W" in applied.stderr
    assert "GPU 1 " not in applied.stderr


def test_apply_warns_of_the_lost_gpus_the_spec_is_for_and_of_no_other(tmp_path: Path) -> None:
    """GPU 1 is lost. `power apply` warned "GPU 1 is lost: not capped now ..." for every spec,
    one that names only GPU 0 too, and listed it in `lost_gpus`: it took the node's lost GPUs,
    not the agent's answer. Now only a spec for it says so: `gpus: all` for sure, a model entry
    unsure (GPU 1 was lost before this agent saw it, so its model is unknown)."""
    assert _power(tmp_path, "show").exit_code == 0  # makes the simulated node
    SimControl(tmp_path).mark_lost(1)
    spec = tmp_path / "power.yaml"
    spec.write_text("version: v1\npower: [{gpus: [0], limit: 500W}]\n")
    only_0 = _power(tmp_path, "apply", "-f", str(spec), "-o", "json")
    assert only_0.exit_code == 0, only_0.output
    assert "GPU 1" not in only_0.stderr, only_0.stderr
    assert json.loads(only_0.stdout)["lost_gpus"] == []
    spec.write_text("version: v1\npower: [{gpus: all, limit: 0.8}]\n")
    every = _power(tmp_path, "apply", "-f", str(spec), "-o", "json")
    assert every.exit_code == 0, every.output
    assert (
        "warning: GPU 1 is lost: not capped now; the agent sets the spec's cap when it answers "
        "again" in every.stderr
    ), every.stderr
    assert json.loads(every.stdout)["lost_gpus"] == [1]
    spec.write_text("version: v1\npower: [{model: H100 80GB HBM3, limit: 600W}]\n")
    model = _power(tmp_path, "apply", "-f", str(spec))
    assert model.exit_code == 0, model.output
    assert (
        "warning: GPU 1 is lost: not capped now; its model is unknown (lost before the agent "
        "saw it): capped when it answers again if it is 'H100 80GB HBM3'" in model.stderr
    ), model.stderr


def test_show_names_a_gpu_that_fails_a_read_and_the_failing_call(tmp_path: Path) -> None:
    """`power show` exited 1 with only 'nvmlDeviceGetMigMode: Unknown Error', no GPU named."""
    assert _power(tmp_path, "show").exit_code == 0  # makes the simulated node
    SimControl(tmp_path).inject_fault("nvmlDeviceGetMigMode", "Unknown", gpu=1, count=10**6)
    table = _power(tmp_path, "show")
    assert table.exit_code == 0, table.output
    rows = [line.split()[0] for line in table.stdout.splitlines()[1:] if line[:1].isdigit()]
    assert rows == ["0", "2", "3", "4", "5", "6", "7"]
    assert "warning: GPU 1 cannot be read (nvmlDeviceGetMigMode: Unknown Error)" in table.stderr


def test_apply_to_every_gpu_names_the_one_it_cannot_read_and_caps_it_once_read(
    tmp_path: Path,
) -> None:
    """GPU 1 fails a read (not lost). `power apply` with `gpus: all` capped the other seven and
    said nothing of it: the rows read as every GPU of the node capped."""
    assert _power(tmp_path, "show").exit_code == 0  # makes the simulated node
    control = SimControl(tmp_path)
    control.inject_fault("nvmlDeviceGetMigMode", "Unknown", gpu=1, count=10**6)
    spec = tmp_path / "power.yaml"
    spec.write_text("version: v1\npower: [{gpus: all, limit: 500W}]\n")
    applied = _power(tmp_path, "apply", "-f", str(spec), "-o", "json")
    assert applied.exit_code == 0, applied.output
    assert (
        "warning: GPU 1 cannot be read (nvmlDeviceGetMigMode: Unknown Error): not capped now; "
        "the agent sets the spec's cap once it is read" in applied.stderr
    ), applied.stderr
    answer = json.loads(applied.stdout)
    assert answer["unread_gpus"] == [1] and answer["lost_gpus"] == []
    assert sorted(c["index"] for c in answer["changes"]) == [0, 2, 3, 4, 5, 6, 7]
