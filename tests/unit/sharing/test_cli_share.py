"""``gpu-agent share`` as a user runs it, on a real SharingService over records (no simulator).

The object on ``ctx.obj`` provides only ``sharing_service()``, which is all share.py requires.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from agent.cli.share import share
from agent.config import SharingSettings
from agent.sharing.service import SharingService
from tests.unit.sharing.layouts import full_gpu, mig_gpu, node
from tests.unit.sharing.pidns_fixtures import POD_NAMESPACE, a_proc


@dataclass
class Obj:
    service: SharingService

    def sharing_service(self) -> SharingService:
        return self.service


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return tmp_path / "config.yaml"


def run(
    config_path: Path,
    *args: str,
    layouts: list | None = None,
    stdin: str | None = None,
    reload: str = "none",
    proc: Path = Path("/proc"),
) -> Result:
    settings = SharingSettings(config_path=config_path, reload=reload)
    svc = SharingService(settings, lambda: layouts if layouts is not None else node(8), proc=proc)
    return CliRunner().invoke(share, list(args), obj=Obj(svc), input=stdin)


@pytest.mark.usefixtures("plugin_loaded")
def test_set_time_slicing_then_show_as_a_table(config_path: Path) -> None:
    result = run(config_path, "set", "--time-slicing", "nvidia.com/gpu=4")
    assert result.exit_code == 0, result.output
    assert "Set: wrote" in result.stdout
    assert "warning: the plugin was not reloaded" in result.stderr
    shown = run(config_path, "show")
    assert shown.exit_code == 0, shown.output
    assert "Strategy:  time-slicing (migStrategy none)" in shown.stdout
    assert "failRequestsGreaterThanOne false" in shown.stdout
    row = next(line for line in shown.stdout.splitlines() if line.startswith("nvidia.com/gpu"))
    assert row.split() == ["nvidia.com/gpu", "8", "4", "32"]


def test_a_change_the_plugin_was_not_reloaded_for_exits_15(config_path: Path) -> None:
    """Exit 0 with a warning said "done" while the plugin ran its old config (no process to
    signal here). The same set again retries the reload, and is not done either."""
    for args in (["set", "--time-slicing", "gpu=4"], ["set", "--time-slicing", "gpu=4"]):
        result = run(config_path, *args, reload="sighup")
        assert result.exit_code == 15, result.output
        assert "no process named nvidia-device-plugin found" in result.stderr
    assert "error: the config is already written, but the plugin was not reloaded" in (
        result.stderr
    )
    assert "The plugin had not loaded it: reloaded again." in result.stdout
    assert run(config_path, "clear", reload="sighup").exit_code == 15
    assert run(config_path, "rollback", reload="sighup").exit_code == 15
    # reload none: something else reloads the plugin; written is done, with a warning
    done = run(config_path, "set", "--time-slicing", "gpu=2")
    assert done.exit_code == 0 and "warning: the plugin was not reloaded" in done.stderr


def test_a_rollback_to_the_config_on_disk_retries_a_reload_that_did_not_reach_the_plugin(
    config_path: Path,
) -> None:
    """A rollback to what the file already says (its previous is the same: a writer stopped
    between the two files) answered "Unchanged" with exit 0 while the plugin had not loaded it;
    like the same set, it retries the reload and is not done while that does not reach it."""
    assert run(config_path, "set", "--time-slicing", "gpu=4", reload="sighup").exit_code == 15
    written = config_path.read_bytes()
    config_path.with_name("config.yaml.previous").write_bytes(written)
    result = run(config_path, "rollback", reload="sighup")
    assert result.exit_code == 15, result.output
    assert "error: the config is already written, but the plugin was not reloaded" in (
        result.stderr
    )
    assert "The plugin had not loaded it: reloaded again." in result.stdout
    assert "Reload:    sighup: no process named nvidia-device-plugin found" in result.stdout
    assert config_path.read_bytes() == written  # nothing written
    # With reload none something else reloads the plugin: unchanged, nothing tried.
    plain = run(config_path, "rollback")
    assert plain.exit_code == 0 and "nothing written or reloaded" in plain.stdout


#: What the agent says of a plugin it cannot see (agent.sharing.reload.NO_HOSTPID).
NO_HOSTPID = "agent has no hostPID; plugin process not visible"


def test_without_hostpid_the_plugin_s_pickup_is_not_observable_not_not_loaded(
    config_path: Path, tmp_path: Path
) -> None:
    """In a PID namespace of its own (a pod without hostPID: /proc/self/ns/pid is not the
    node's) the agent sees no plugin process; `share show` said "not-loaded", a false "no"
    (tests/unit/sharing/test_hostpid.py, docs/sharing.md "Without hostPID")."""
    pod = a_proc(tmp_path / "proc", POD_NAMESPACE, nspid="7")  # its own /proc: one pid
    result = run(config_path, "set", "--time-slicing", "gpu=4", reload="sighup", proc=pod)
    assert result.exit_code == 15, result.output  # written, not reloaded: not done
    assert f"the plugin was not reloaded (sighup): {NO_HOSTPID}" in result.stderr
    shown = run(config_path, "show", reload="sighup", proc=pod)
    assert f"Plugin:    unknown: {NO_HOSTPID}" in shown.stdout
    assert "not-loaded" not in shown.stdout
    data = json.loads(run(config_path, "show", "-o", "json", proc=pod).stdout)
    assert data["plugin"]["state"] == "unknown"
    assert data["plugin"]["detail"].startswith(NO_HOSTPID)
    # The user's own command again: a signal cannot reach a plugin the agent does not see,
    # so none is sent again; the answer is "unchanged", the pickup still said unknown.
    again = run(config_path, "set", "--time-slicing", "gpu=4", reload="sighup", proc=pod)
    assert again.exit_code == 0 and "nothing written or reloaded" in again.stdout
    assert f"plugin unknown: {NO_HOSTPID}" in again.stdout


def test_show_as_json(config_path: Path) -> None:
    run(config_path, "set", "--time-slicing", "gpu=4", "--rename-by-default")
    data = json.loads(run(config_path, "show", "-o", "json").stdout)
    assert data["strategy"] == "time-slicing"
    assert data["rename_by_default"] is True
    assert data["plugin"]["state"] == "not-loaded"  # no plugin here: it advertises what not known
    assert data["advertised"] is None
    assert data["advertised_unknown"].endswith(
        "once it does it advertises nvidia.com/gpu.shared 32"
    )
    assert data["last_write"]["action"] == "set"
    assert data["config"]["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}
    ]


def test_set_mps_as_yaml(config_path: Path) -> None:
    result = run(config_path, "set", "--mps", "nvidia.com/gpu=2", "-o", "yaml")
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert data["strategy"] == "mps"
    assert data["fail_requests_greater_than_one"] is True
    assert data["changed"] is True


@pytest.mark.usefixtures("plugin_loaded")
def test_set_mig_resources_under_mixed(config_path: Path) -> None:
    layouts = [mig_gpu(0, "1g.10gb", "1g.10gb"), full_gpu(1)]
    result = run(
        config_path,
        "set",
        "--mig-strategy",
        "mixed",
        "--time-slicing",
        "nvidia.com/mig-1g.10gb=3",
        "--fail-requests-greater-than-one",
        "-o",
        "json",
        layouts=layouts,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["fail_requests_greater_than_one"] is True
    assert {a["resource"]: a["count"] for a in data["advertised"]} == {
        "nvidia.com/gpu": 1,
        "nvidia.com/mig-1g.10gb": 6,
    }


@pytest.mark.usefixtures("plugin_loaded")
def test_set_from_a_file_in_the_plugins_schema(config_path: Path) -> None:
    """The README's example, 10 replicas on 8 GPUs: nvidia.com/gpu 80; again from stdin: no-op."""
    example = Path(__file__).parent / "golden" / "readme-time-slicing.yaml"
    result = run(config_path, "set", "-f", str(example))
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("nvidia.com/gpu"))
    assert row.split() == ["nvidia.com/gpu", "8", "10", "80"]
    stdin = run(config_path, "set", "-f", "-", stdin=example.read_text())
    assert "Unchanged" in stdin.stdout


def test_a_refusal_names_each_field_and_exits_2(config_path: Path) -> None:
    result = run(
        config_path, "set", "--time-slicing", "nvidia.com/gpu=1", "--mps", "nvidia.com/gpu=2"
    )
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: the sharing config is refused (2 problems)",
        "  sharing: timeSlicing and mps are mutually exclusive (the plugin applies MPS and "
        "ignores timeSlicing); keep one",
        "  sharing.timeSlicing.resources[0].replicas: must be >= 2, got 1 (the plugin refuses "
        'the file: "number of replicas must be >= 2"); use share clear to stop sharing',
    ]
    assert not config_path.exists()


def test_a_malformed_file_names_the_field(config_path: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replica: 4\n")
    result = run(config_path, "set", "-f", str(bad))
    assert result.exit_code == 2
    assert "  sharing.timeSlicing.resources[0].replica: unknown key" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --time-slicing, --mps or -f FILE"),
        (["--time-slicing", "gpu"], "expected RESOURCE=REPLICAS"),
        (["--time-slicing", "gpu=four"], "REPLICAS must be an integer"),
        (["-f", "-", "--mps", "gpu=2"], "cannot be combined"),
    ],
)
def test_usage_errors(config_path: Path, args: list[str], message: str) -> None:
    result = run(config_path, "set", *args, stdin="")
    assert result.exit_code == 2
    assert message in result.stderr


def test_clear_and_rollback(config_path: Path) -> None:
    run(config_path, "set", "--time-slicing", "gpu=4")
    cleared = run(config_path, "clear", "-o", "json")
    assert json.loads(cleared.stdout)["strategy"] == "none"
    rolled = run(config_path, "rollback", "-o", "json")
    assert rolled.exit_code == 0, rolled.output
    assert json.loads(rolled.stdout)["strategy"] == "time-slicing"


def test_rollback_with_nothing_to_restore_exits_with_not_founds_code(config_path: Path) -> None:
    result = run(config_path, "rollback")
    assert result.exit_code == 3
    assert result.stderr.startswith("error: no previous config at ")


def test_every_command_documents_an_example() -> None:
    for name, command in share.commands.items():
        assert command.help and "gpu-agent share " + name in command.help, name


def test_a_flag_the_plugin_cannot_parse_is_refused_before_writing(
    config_path: Path, tmp_path: Path
) -> None:
    """`share set -f` with flags the plugin's Go types refuse: nothing written, nothing reloaded,
    each field named with what the plugin expects (tests/fixtures/device-plugin-configs)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: v1\nflags:\n  failOnInitError: 'false'\n  gfd: {sleepInterval: 1 minute}\n"
        "  plugin: {passDeviceSpecs: 'true'}\n"
        "sharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n"
    )
    result = run(config_path, "set", "-f", str(bad))
    assert result.exit_code == 2, result.output
    assert "  flags.failOnInitError: must be true or false (a YAML boolean" in result.stderr
    assert "  flags.gfd.sleepInterval: must be a Go duration" in result.stderr
    assert "  flags.plugin.passDeviceSpecs: must be true or false" in result.stderr
    assert not config_path.exists()


def test_show_of_a_hand_written_file_names_the_flag_that_stops_the_plugin(
    config_path: Path,
) -> None:
    config_path.write_text("version: v1\nflags:\n  gfd:\n    sleepInterval: true\n")
    shown = run(config_path, "show", "-o", "json")
    assert shown.exit_code == 0, shown.output
    problems = json.loads(shown.stdout)["problems"]
    assert [p["field"] for p in problems] == ["flags.gfd.sleepInterval"]
    # And a set over that file is refused for it, rather than written and reloaded.
    result = run(config_path, "set", "--time-slicing", "gpu=2")
    assert result.exit_code == 2
    assert "flags.gfd.sleepInterval" in result.stderr
    assert "sleepInterval: true" in config_path.read_text()


def test_mig_strategy_alone_changes_that_flag_and_keeps_the_node_s_sharing(
    config_path: Path,
) -> None:
    """What `gpu-agent doctor` (sharing/mig-strategy) tells a user to run on a MIG node whose
    plugin runs with none; before, `share set` refused it without --time-slicing or --mps."""
    layouts = [mig_gpu(i, "1g.10gb", "1g.10gb", "3g.40gb") for i in range(2)]
    first = run(
        config_path,
        "set",
        "--mig-strategy",
        "mixed",
        "--time-slicing",
        "mig-1g.10gb=3",
        layouts=layouts,
    )
    assert first.exit_code == 0, first.output
    single = run(config_path, "set", "--mig-strategy", "single", layouts=layouts)
    assert single.exit_code != 0  # single has no mig-1g.10gb to share: refused, nothing written
    assert "exist only under flags.migStrategy: mixed (this config: single)" in single.output
    assert yaml.safe_load(config_path.read_text())["flags"] == {"migStrategy": "mixed"}
    run(config_path, "clear", layouts=layouts)
    again = run(config_path, "set", "--mig-strategy", "single", layouts=layouts)
    assert again.exit_code == 0, again.output
    written = yaml.safe_load(config_path.read_text())
    assert written["flags"] == {"migStrategy": "single"} and "sharing" not in written


def test_a_file_that_is_not_utf8_is_refused_naming_the_option(
    config_path: Path, tmp_path: Path
) -> None:
    """`share set -f` of bytes that are not UTF-8 was a UnicodeDecodeError traceback."""
    bad = tmp_path / "sharing.yaml"
    bad.write_bytes(b"\xff\xfeversion: v1\n")
    for args in (["-f", str(bad)], ["-f", "-"]):
        settings = SharingSettings(config_path=config_path, reload="none")
        svc = SharingService(settings, lambda: node(8))
        refused = CliRunner().invoke(share, ["set", *args], obj=Obj(svc), input=b"\x8a\x00\xff")
        assert refused.exit_code == 2, refused.output
        assert "not UTF-8" in refused.output and "file" in refused.output, refused.output
    assert not config_path.exists()


@pytest.mark.parametrize("replicas", ["1_0", "\u0664", "99999999999999999999"])
@pytest.mark.parametrize("option", ["--time-slicing", "--mps"])
def test_replicas_are_plain_ascii_digits_or_refused_naming_the_option(
    config_path: Path, option: str, replicas: str
) -> None:
    """REPLICAS went through Python's int(): ``gpu=1_0`` set 10 replicas, an Arabic-Indic
    ``gpu=٤`` set 4, and a number past 64 bits reached the agent and came back as a refusal of
    ``config_yaml``, a field the user never gave. Each is now refused as a usage error naming
    the option, and nothing is written (docs/sharing.md, "Commands")."""
    result = run(config_path, "set", option, f"nvidia.com/gpu={replicas}")
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {option}" in result.stderr, result.stderr
    assert "REPLICAS must be" in result.stderr, result.stderr
    assert not config_path.exists()
    rendered = CliRunner().invoke(share, ["render", "--dra", option, f"gpu={replicas}"])
    assert rendered.exit_code == 2 and f"Invalid value for {option}" in rendered.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--rename-by-default"], "--rename-by-default"),
        (["--mig-strategy", "mixed", "--rename-by-default"], "--rename-by-default"),
        (["--fail-requests-greater-than-one"], "--fail-requests-greater-than-one"),
        (["--no-fail-requests-greater-than-one"], "--no-fail-requests-greater-than-one"),
    ],
)
def test_a_sharing_option_without_resources_is_refused_naming_it(
    config_path: Path, args: list[str], named: str
) -> None:
    """``--rename-by-default`` (or ``--fail-requests-greater-than-one``) without
    ``--time-slicing``/``--mps`` was refused with "give --time-slicing, --mps or -f FILE",
    which named neither the option given nor why; beside ``--mig-strategy``, which is allowed
    alone, that read as if ``--mig-strategy`` were the mistake. The refusal now names the
    option and what it needs, and nothing is written (docs/sharing.md, "Commands")."""
    result = run(config_path, "set", *args)
    assert result.exit_code == 2, result.output
    assert f"{named} applies to the resources of --time-slicing or --mps" in result.stderr
    assert not config_path.exists()


def test_the_help_of_each_command_says_what_it_does_on_a_dra_node() -> None:
    """Every `share` command's help spoke of the device plugin only (write its file, reload
    it), while on a node whose allocation mode is dra or dra-dynamic-mig the same commands
    write DeviceClasses and reload nothing. Each help now says so (docs/dra.md, "Sharing under
    DRA")."""
    for name in ("show", "set", "clear", "rollback"):
        result = CliRunner().invoke(share, [name, "--help"])
        assert result.exit_code == 0
        assert "DeviceClass" in " ".join(result.output.split()), (name, result.output)
    group = CliRunner().invoke(share, ["--help"])
    assert "DeviceClass" in " ".join(group.output.split())


def test_json_says_null_not_an_empty_list_when_what_is_advertised_is_not_known(
    config_path: Path,
) -> None:
    """With GPU 3 lost, `share show -o json` and `share set -o json` gave `"advertised": []`,
    which a script reads as "the plugin advertises nothing"; `advertised_unknown` said why, but
    only a script that knew to look saw it. Unknown is null, as `status` gives a lost GPU's
    processes."""
    settings = SharingSettings(config_path=config_path, reload="none")
    svc = SharingService(settings, lambda: node(7), gpus_lost=lambda: (3,))

    def json_of(*args: str) -> dict[str, object]:
        result = CliRunner().invoke(share, [*args, "-o", "json"], obj=Obj(svc))
        assert result.exit_code == 0, result.output
        return dict(json.loads(result.stdout))

    for data in (json_of("set", "--time-slicing", "nvidia.com/gpu=4"), json_of("show")):
        assert data["advertised"] is None
        assert str(data["advertised_unknown"]).startswith("GPU 3 lost")


@pytest.mark.usefixtures("plugin_loaded")
@pytest.mark.parametrize("empty", ["", "\n", "# nothing yet\n"])
def test_an_empty_document_is_refused_and_the_sharing_stays(config_path: Path, empty: str) -> None:
    """`share set -f - </dev/null` (an empty file, a pipe whose writer failed) set a config
    with no sharing: time-slicing was gone ("Strategy: none") without a word. Refused naming
    -f, as `power apply -f empty.yaml` is; saying so (`version: v1`, no sharing) still works."""
    assert run(config_path, "set", "--time-slicing", "nvidia.com/gpu=4").exit_code == 0
    before = config_path.read_text()
    refused = run(config_path, "set", "-f", "-", stdin=empty)
    assert refused.exit_code == 2, refused.output
    assert "the device-plugin config is empty" in refused.stderr
    assert "share clear" in refused.stderr
    assert config_path.read_text() == before
    assert "Strategy:  time-slicing" in run(config_path, "show").stdout
    said = run(config_path, "set", "-f", "-", stdin="version: v1\n")
    assert said.exit_code == 0, said.output
    assert "Strategy:  none" in run(config_path, "show").stdout


@pytest.mark.parametrize("empty", ["", "  \n# c\n"])
def test_set_sharing_refuses_an_empty_config_yaml(empty: str) -> None:
    """The RPC took an empty config_yaml as a config without sharing, as the CLI did; so did
    `fleet apply share -f empty.yaml`, which checks a config as the agents will."""
    from agent._proto.gpuagent.v1 import sharing_pb2
    from agent.errors import InvalidSpec
    from agent.sharing.schema import Sharing
    from agent.wire.sharing import requested_config

    with pytest.raises(InvalidSpec, match="config_yaml: the device-plugin config is empty"):
        requested_config(sharing_pb2.SetSharingRequest(config_yaml=empty))
    said = requested_config(sharing_pb2.SetSharingRequest(config_yaml="version: v1\n"))
    assert said.sharing == Sharing()  # a document that says "no sharing" is still one
