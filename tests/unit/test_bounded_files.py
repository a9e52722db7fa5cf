"""Every file the agent or the coordinator reads refuses the attacker's input with InvalidSpec,
never another exception, and never by reading or expanding it whole (issue 16): the agent config,
MIG configs and hooks, prewarm manifests, the device plugin's config, the coordinator's desired
state, demand, trace and plan files, kubeconfigs, and counters CSVs. A file that is missing,
unreadable or not UTF-8 is refused the same way, naming the file (one rule:
``safeyaml.read_text``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config import load_config
from agent.coordinator.control.desired import load_desired
from agent.coordinator.planning.demand import MAX_ROWS, load_demand, load_trace
from agent.coordinator.planning.planfile import load_plan
from agent.errors import InvalidSpec
from agent.kubeconfig import load as load_kubeconfig
from agent.mig.hooks import load_hooks
from agent.mig.spec import load_spec
from agent.prewarm.manifest import load_manifest
from agent.sharing.schema import parse
from agent.sharing.store import ConfigStore
from dcgm.counters import MAX_LINE, load_counters
from dcgm.counters import MAX_ROWS as MAX_COUNTER_ROWS
from tests.unit.test_safeyaml import billion_laughs

LOADERS: dict[str, Callable[[Path], object]] = {
    "agent config": lambda p: load_config(p, env={}),
    "mig config": load_spec,
    "prewarm manifest": load_manifest,
    "plugin config": lambda p: parse(ConfigStore(p).read() or b""),
    "desired state": load_desired,
    "demand": load_demand,
    "trace": load_trace,
    "plan": load_plan,
    "mig hooks": load_hooks,
    "kubeconfig": load_kubeconfig,
}
ATTACKS = {
    "billion-laughs": billion_laughs() + "version: *i\n",
    "deep-nesting": "[" * 50_000 + "]" * 50_000,
    "list-as-key": "? [a, b]\n: 1\n",
    "5000-digits": "version: " + "9" * 5000 + "\n",
    "cycle": "- &a [*a]\n",
    "control-character": "a: \x07\n",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
@pytest.mark.parametrize("loader", list(LOADERS))
def test_every_yaml_file_refuses_the_attackers_input(
    tmp_path: Path, loader: str, attack: str
) -> None:
    path = tmp_path / "input.yaml"
    path.write_text(ATTACKS[attack])
    with pytest.raises(InvalidSpec) as caught:
        LOADERS[loader](path)
    assert len(str(caught.value)) < 2000


@pytest.mark.parametrize(
    "loader",
    [
        "agent config",
        "mig config",
        "mig hooks",
        "prewarm manifest",
        "plugin config",
        "desired state",
        "plan",
    ],
)
def test_a_file_past_its_size_bound_is_refused_unread(tmp_path: Path, loader: str) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as f:
        f.truncate(2 * 1024**3)  # sparse: reading it whole would take 2 GiB
    with pytest.raises(InvalidSpec, match="larger than"):
        LOADERS[loader](path)


#: every loader given a path (a missing plugin config is the plugin's defaults, not a refusal)
READ_FROM_DISK = {
    **{name: load for name, load in LOADERS.items() if name != "plugin config"},
    "counters CSV": load_counters,
}


@pytest.mark.parametrize("loader", READ_FROM_DISK)
def test_a_missing_unreadable_or_binary_file_is_refused_naming_it(
    tmp_path: Path, loader: str
) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(InvalidSpec, match="does not exist") as caught:
        READ_FROM_DISK[loader](missing)
    assert str(missing) in str(caught.value)
    directory = tmp_path / "a-directory.yaml"  # unreadable as a file, for root too
    directory.mkdir()
    with pytest.raises(InvalidSpec, match=r"cannot read .*a-directory\.yaml: Is a directory"):
        READ_FROM_DISK[loader](directory)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"version: v1\n\xff\xfe\n")
    with pytest.raises(InvalidSpec, match=r"binary\.yaml is not UTF-8 text"):
        READ_FROM_DISK[loader](binary)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "counters.csv"
    path.write_text(text)
    return path


def test_counters_csv_rows_lines_and_bytes_are_bounded(tmp_path: Path) -> None:
    row = "DCGM_FI_DEV_GPU_UTIL, gauge, util\n"
    with pytest.raises(InvalidSpec, match=f"more than {MAX_COUNTER_ROWS} rows"):
        load_counters(write(tmp_path, row * (MAX_COUNTER_ROWS + 1)))
    with pytest.raises(InvalidSpec, match=f"longer than {MAX_LINE}"):
        load_counters(write(tmp_path, "DCGM_FI_DEV_GPU_UTIL, gauge, " + "h" * MAX_LINE + "\n"))
    with pytest.raises(InvalidSpec, match="larger than"):
        load_counters(write(tmp_path, "#" * (2 * 1024 * 1024)))


def test_demand_trace_csv_rows_and_fields_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("time,profile,count\n" + "0,1g.10gb,1\n" * (MAX_ROWS + 1))
    with pytest.raises(InvalidSpec, match=f"more than {MAX_ROWS} rows"):
        load_trace(path)
    path.write_text('time,profile,count\n0,1g.10gb,"' + "9" * 200_000 + '"\n')
    with pytest.raises(InvalidSpec):
        load_trace(path)
    path.write_text("time,profile,count\n0,1g.10gb," + "9" * 4000 + "\n")  # under the field cap
    with pytest.raises(InvalidSpec, match="integer"):
        load_trace(path)
    path.write_text("time,profile,count\n0,1g.10gb," + "9" * 5000 + "\n")
    with pytest.raises(InvalidSpec, match=r"line 2\.count: longer than 4096 characters"):
        load_trace(path)
