"""The agent config: defaults < YAML file < env GPU_AGENT_* < flags, every bad input named."""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.config import (
    AgentConfig,
    PrewarmSettings,
    TelemetrySettings,
    config_schema,
    load_config,
)
from agent.errors import InvalidSpec


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def invalid(
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> InvalidSpec:
    with pytest.raises(InvalidSpec) as caught:
        load_config(file, env if env is not None else {}, flags)
    return caught.value


def leaf_paths(cls: type, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for f in dataclasses.fields(cls):
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            yield from leaf_paths(f.default_factory, (*prefix, f.name))
        else:
            yield (*prefix, f.name)


def value_at(config: object, path: tuple[str, ...]) -> Any:
    for part in path:
        config = getattr(config, part)
    return config


# --- defaults and precedence ---------------------------------------------------------------------


def test_defaults_match_the_contract() -> None:
    """With no file, env or flags, every setting has its documented default."""
    config = load_config(env={})
    assert config == AgentConfig()
    assert config.simulate is None
    assert config.state_dir == Path("/var/lib/gpu-agent")
    assert config.node_name == socket.gethostname()
    assert config.grpc_insecure_listen is None
    assert config.telemetry.interval_s == 1.0
    assert config.prewarm.budget_bytes == 200 * 1024**3
    assert config.sharing.reload == "sighup"
    assert config.tls.mutating_identities == ()


def test_config_is_frozen() -> None:
    """Nothing may change the config after load."""
    config = load_config(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.log_level = "debug"  # type: ignore[misc]


def test_flags_beat_env_beat_file_for_the_same_key(tmp_path: Path) -> None:
    """Each source overrides the ones before it, key by key."""
    file = write(tmp_path, "telemetry:\n  interval_s: 0.5\nlog_level: debug\n")
    env = {"GPU_AGENT_TELEMETRY__INTERVAL_S": "0.7", "GPU_AGENT_LOG_LEVEL": "warning"}
    flags = {"telemetry.interval_s": 0.9}

    both = load_config(file, env, flags)
    assert both.telemetry.interval_s == 0.9
    assert both.log_level == "warning"
    assert load_config(file, env).telemetry.interval_s == 0.7
    assert load_config(file, {}).telemetry.interval_s == 0.5
    assert load_config(file, {}).log_level == "debug"


def test_a_flag_given_as_none_was_not_given() -> None:
    """None in flags is a flag left out; the lower source stays."""
    config = load_config(env={"GPU_AGENT_SIMULATE": "dgx-h100"}, flags={"simulate": None})
    assert config.simulate == "dgx-h100"


def test_env_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit env, os.environ is read."""
    monkeypatch.setenv("GPU_AGENT_SIMULATE", "a100-40gb")
    assert load_config().simulate == "a100-40gb"


def test_nested_sections_from_a_file_keep_the_other_defaults(tmp_path: Path) -> None:
    """A section sets only the keys it names."""
    file = write(
        tmp_path,
        """
simulate: dgx-h100
state_dir: /tmp/agent
telemetry:
  interval_s: 0.25
  metric_names: native
prewarm:
  allowed_hosts: [huggingface.co, example.org]
  budget_bytes: 10Gi
  allow_http: true
mig:
""",
    )
    config = load_config(file, {})
    assert config.simulate == "dgx-h100"
    assert config.state_dir == Path("/tmp/agent")
    assert config.telemetry == TelemetrySettings(interval_s=0.25, metric_names="native")
    assert config.prewarm == PrewarmSettings(
        allowed_hosts=("huggingface.co", "example.org"), budget_bytes=10 * 1024**3, allow_http=True
    )
    assert config.mig == AgentConfig().mig


def test_an_empty_file_means_all_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, ""), {}) == AgentConfig()


def test_gpu_agent_config_names_the_file_unless_one_is_passed(tmp_path: Path) -> None:
    """The DaemonSet can point at a mounted ConfigMap through env alone."""
    named = write(tmp_path, "log_level: error\n")
    other = tmp_path / "other.yaml"
    other.write_text("log_level: debug\n")
    assert load_config(env={"GPU_AGENT_CONFIG": str(named)}).log_level == "error"
    assert load_config(other, {"GPU_AGENT_CONFIG": str(named)}).log_level == "debug"


def test_node_name_env_is_read_under_gpu_agent_node_name() -> None:
    """NODE_NAME (downward API) works; GPU_AGENT_NODE_NAME wins over it."""
    assert load_config(env={"NODE_NAME": "gpu-7"}).node_name == "gpu-7"
    both = {"NODE_NAME": "gpu-7", "GPU_AGENT_NODE_NAME": "gpu-8"}
    assert load_config(env=both).node_name == "gpu-8"


# --- parsing env and flag text -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        *[("true", True), ("1", True), ("YES", True), ("on", True)],
        *[("false", False), ("0", False), ("no", False), ("Off", False)],
    ],
)
def test_env_bools(text: str, expected: bool) -> None:
    config = load_config(env={"GPU_AGENT_PREWARM__ALLOW_HTTP": text})
    assert config.prewarm.allow_http is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1048576", 1048576),
        ("200Gi", 200 * 1024**3),
        ("200GiB", 200 * 1024**3),
        ("1.5Ti", int(1.5 * 1024**4)),
        ("10G", 10 * 1000**3),
        ("500 MB", 500 * 1000**2),
        ("4k", 4000),
    ],
)
def test_byte_budgets_take_suffixes(text: str, expected: int) -> None:
    config = load_config(env={"GPU_AGENT_PREWARM__BUDGET_BYTES": text})
    assert config.prewarm.budget_bytes == expected


@given(st.integers(min_value=1, max_value=2**40), st.sampled_from(["", "Ki", "Mi", "Gi"]))
def test_byte_budgets_scale_by_their_binary_suffix(number: int, suffix: str) -> None:
    scale = {"": 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}[suffix]
    config = load_config(env={"GPU_AGENT_PREWARM__BUDGET_BYTES": f"{number}{suffix}"})
    assert config.prewarm.budget_bytes == number * scale


def test_env_lists_are_comma_separated() -> None:
    env = {
        "GPU_AGENT_PREWARM__DENIED_HOSTS": " a.example , b.example,,",
        "GPU_AGENT_TLS__MUTATING_IDENTITIES": "",
    }
    config = load_config(env=env)
    assert config.prewarm.denied_hosts == ("a.example", "b.example")
    assert config.tls.mutating_identities == ()


def test_empty_env_text_unsets_an_optional_setting(tmp_path: Path) -> None:
    file = write(tmp_path, "telemetry:\n  collectors: /etc/c.csv\n")
    config = load_config(file, {"GPU_AGENT_TELEMETRY__COLLECTORS": ""})
    assert config.telemetry.collectors is None


@pytest.mark.parametrize(
    ("env", "flags", "named"),
    [
        ({"GPU_AGENT_SIMULATE": ""}, {}, "env GPU_AGENT_SIMULATE"),
        ({}, {"simulate": ""}, "flag simulate"),
        ({"GPU_AGENT_SIMULATE": "dgx-h100"}, {"simulate": ""}, "flag simulate"),
    ],
)
def test_an_empty_simulate_is_refused_never_taken_as_the_real_nvml(
    env: dict[str, str], flags: dict[str, object], named: str
) -> None:
    """`--simulate "$PRESET"` with PRESET unset (or GPU_AGENT_SIMULATE=) meant the real NVML:
    a command meant for a simulated node acted on the host's GPUs. Refused naming the flag or
    variable; unset (or null in YAML) is still the real NVML."""
    with pytest.raises(InvalidSpec) as refused:
        load_config(None, env, flags)
    assert f"{named}: expected a non-empty string" in str(refused.value)
    assert load_config(None, {}, {"simulate": None}).simulate is None


def test_flags_take_typed_values_or_text() -> None:
    """Click hands over typed values (Path, float) or text; both work."""
    flags = {
        "state_dir": Path("/tmp/x"),
        "telemetry.interval_s": "0.5",
        "prewarm.allowed_hosts": ("a", "b"),
    }
    config = load_config(env={}, flags=flags)
    assert config.state_dir == Path("/tmp/x")
    assert config.telemetry.interval_s == 0.5
    assert config.prewarm.allowed_hosts == ("a", "b")


@pytest.mark.parametrize("address", ["127.0.0.1:0", "127.0.0.2:9", "[::1]:9401", "localhost:50051"])
def test_insecure_listen_accepts_loopback(address: str) -> None:
    config = load_config(env={"GPU_AGENT_GRPC_INSECURE_LISTEN": address})
    assert config.grpc_insecure_listen == address


@pytest.mark.parametrize("address", ["[::]:9401", "node-1:9400", "10.1.2.3:0", "0.0.0.0:65535"])
def test_listen_accepts_any_host(address: str) -> None:
    assert load_config(env={"GPU_AGENT_METRICS_LISTEN": address}).metrics_listen == address


# --- every bad value names the key path and what is allowed --------------------------------------


BAD_FILE_VALUES = [
    ("telemetry:\n  interval_s: fast\n", "telemetry.interval_s", "a finite number, >= 0.1"),
    ("telemetry:\n  interval_s: 0.05\n", "telemetry.interval_s", ">= 0.1"),
    ("telemetry:\n  interval_s: .inf\n", "telemetry.interval_s", "a finite number"),
    ("telemetry:\n  interval_s: true\n", "telemetry.interval_s", "a finite number"),
    ("telemetry:\n  idle_threshold_percent: 101\n", "telemetry.idle_threshold_percent", "<= 100"),
    ("telemetry:\n  metric_names: prom\n", "telemetry.metric_names", "one of: dcgm, native"),
    ("sharing:\n  reload: kill\n", "sharing.reload", "one of: sighup, label, restart-pod, none"),
    ("log_level: INFO\n", "log_level", "one of: debug, info, warning, error"),
    ("log_level: null\n", "log_level", "one of: debug, info, warning, error"),
    ("prewarm:\n  max_volume_share: 0\n", "prewarm.max_volume_share", "> 0 and <= 1"),
    ("prewarm:\n  max_volume_share: 1.5\n", "prewarm.max_volume_share", "> 0 and <= 1"),
    ("prewarm:\n  budget_bytes: 0\n", "prewarm.budget_bytes", "> 0"),
    ("prewarm:\n  budget_bytes: 1.5\n", "prewarm.budget_bytes", "a byte count"),
    ("prewarm:\n  budget_bytes: lots\n", "prewarm.budget_bytes", "e.g. 200Gi"),
    ("prewarm:\n  allow_http: maybe\n", "prewarm.allow_http", "true or false"),
    ("prewarm:\n  allowed_hosts: [1, 2]\n", "prewarm.allowed_hosts", "a list of non-empty strings"),
    ("prewarm:\n  allowed_hosts: {a: 1}\n", "prewarm.allowed_hosts", "a list of non-empty strings"),
    ("prewarm:\n  egress_allow: ['10.0.0.0/8 x']\n", "prewarm.egress_allow", "CIDRs"),
    ("prewarm:\n  egress_allow: ['http://a']\n", "prewarm.egress_allow", "host names or globs"),
    # A header directory names the origin its secrets may go to.
    ("prewarm:\n  header_dirs: [/etc/s]\n", "prewarm.header_dirs", "ORIGIN=DIRECTORY"),
    # Signature keys: bounded in count and length, each one query key (or a glob of one).
    ("prewarm:\n  ignored_query_params: ['sig=x']\n", "prewarm.ignored_query_params", "& = #"),
    ("prewarm:\n  ignored_query_params: ['a b']\n", "prewarm.ignored_query_params", "spaces"),
    (
        f"prewarm:\n  ignored_query_params: ['{'k' * 129}']\n",
        "prewarm.ignored_query_params",
        "each 1-128 characters",
    ),
    (
        f"prewarm:\n  ignored_query_params: [{', '.join(f'k{i}' for i in range(257))}]\n",
        "prewarm.ignored_query_params",
        "at most 256 query keys",
    ),
    ("prewarm:\n  header_dirs: ['https://h/p=/s']\n", "prewarm.header_dirs", "scheme://host"),
    ("prewarm:\n  header_dirs: ['https://h=rel']\n", "prewarm.header_dirs", "ORIGIN=DIRECTORY"),
    ("prewarm:\n  header_dirs: ['https://h:x=/s']\n", "prewarm.header_dirs", "ORIGIN=DIRECTORY"),
    (
        "prewarm:\n  dragonfly_proxy: ftp://x\n",
        "prewarm.dragonfly_proxy",
        "an http:// or https:// URL",
    ),
    ("state_dir: ''\n", "state_dir", "a path"),
    ("state_dir: [a]\n", "state_dir", "a path"),
    ("node_name: 7\n", "node_name", "a non-empty string"),
    ("metrics_listen: '9400'\n", "metrics_listen", "HOST:PORT or [IPv6]:PORT"),
    ("grpc_listen: 'host:99999'\n", "grpc_listen", "PORT 0-65535"),
    ("grpc_listen: '::1:80'\n", "grpc_listen", "[IPv6]:PORT"),
    ("grpc_insecure_listen: 0.0.0.0:9402\n", "grpc_insecure_listen", "a loopback HOST:PORT"),
    ("grpc_insecure_listen: '[::]:9402'\n", "grpc_insecure_listen", "127.0.0.1:PORT, [::1]:PORT"),
    ("grpc_insecure_listen: node-1:9402\n", "grpc_insecure_listen", "localhost:PORT"),
]


def test_signature_query_keys_take_globs_and_may_be_none(tmp_path: Path) -> None:
    env = {"GPU_AGENT_PREWARM__IGNORED_QUERY_PARAMS": "X-Amz-*,sig"}
    assert load_config(env=env).prewarm.ignored_query_params == ("X-Amz-*", "sig")
    none = load_config(write(tmp_path, "prewarm:\n  ignored_query_params: []\n"), env={})
    assert none.prewarm.ignored_query_params == ()


@pytest.mark.parametrize(("text", "key", "allowed"), BAD_FILE_VALUES)
def test_bad_file_values_name_the_key_and_the_allowed_values(
    tmp_path: Path, text: str, key: str, allowed: str
) -> None:
    error = invalid(write(tmp_path, text))
    assert [v.field for v in error.violations] == [key]
    assert allowed in error.violations[0].description
    assert key in str(error)
    assert allowed in str(error)


@pytest.mark.parametrize(
    ("name", "text", "allowed"),
    [
        ("GPU_AGENT_TELEMETRY__INTERVAL_S", "0.05", ">= 0.1"),
        ("GPU_AGENT_TELEMETRY__INTERVAL_S", "nan", "a finite number"),
        ("GPU_AGENT_PREWARM__BUDGET_BYTES", "-1", "a byte count"),
        ("GPU_AGENT_PREWARM__BUDGET_BYTES", "1.5", "a byte count"),
        ("GPU_AGENT_PREWARM__ALLOW_HTTP", "maybe", "true or false"),
        ("GPU_AGENT_SHARING__RELOAD", "", "one of: sighup, label, restart-pod, none"),
        ("GPU_AGENT_STATE_DIR", "", "a path"),
        ("GPU_AGENT_GRPC_INSECURE_LISTEN", "0.0.0.0:9402", "a loopback HOST:PORT"),
        # a list written as YAML is told the env's form, whatever the setting's own words say
        ("GPU_AGENT_PREWARM__EGRESS_ALLOW", '["127.0.0.1/32"]', "comma-separated in env"),
    ],
)
def test_bad_env_values_name_the_variable(name: str, text: str, allowed: str) -> None:
    error = invalid(env={name: text})
    assert [v.field for v in error.violations] == [f"env {name}"]
    assert allowed in error.violations[0].description
    assert repr(text) in error.violations[0].description


def test_bad_flag_values_name_the_flag() -> None:
    error = invalid(flags={"telemetry.interval_s": 0.01})
    assert [v.field for v in error.violations] == ["flag telemetry.interval_s"]
    assert ">= 0.1" in error.violations[0].description


def test_a_bad_value_is_an_error_even_when_a_later_source_overrides_it() -> None:
    """Every source must be valid on its own: a typo in env is not hidden by a flag."""
    error = invalid(env={"GPU_AGENT_LOG_LEVEL": "loud"}, flags={"log_level": "info"})
    assert [v.field for v in error.violations] == ["env GPU_AGENT_LOG_LEVEL"]


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    file = write(tmp_path, "log_level: loud\ntelemetry:\n  interval_s: 0\n")
    error = invalid(file, env={"GPU_AGENT_PREWARM__ALLOW_HTTP": "maybe"}, flags={"simulate": ""})
    assert {v.field for v in error.violations} == {
        "log_level",
        "telemetry.interval_s",
        "env GPU_AGENT_PREWARM__ALLOW_HTTP",
        "flag simulate",  # empty: refused, not the real NVML
    }
    assert str(file) in str(error)


# --- unknown keys list the valid keys of their section -------------------------------------------


def test_unknown_top_level_file_key(tmp_path: Path) -> None:
    error = invalid(write(tmp_path, "simulator: dgx-h100\n"))
    (violation,) = error.violations
    assert violation.field == "simulator"
    assert "did you mean simulate?" in violation.description
    assert "simulate, state_dir, node_name" in violation.description


def test_unknown_key_inside_a_file_section(tmp_path: Path) -> None:
    error = invalid(write(tmp_path, "telemetry:\n  intervall_s: 1\n"))
    (violation,) = error.violations
    assert violation.field == "telemetry.intervall_s"
    assert "valid keys in telemetry: interval_s, collectors, metric_names" in violation.description


def test_a_section_given_a_scalar_lists_its_keys(tmp_path: Path) -> None:
    error = invalid(write(tmp_path, "tls: on\n"))
    (violation,) = error.violations
    assert violation.field == "tls"
    assert "expected a mapping with keys: cert_file, key_file, ca_file" in violation.description


def test_a_non_string_file_key_is_unknown(tmp_path: Path) -> None:
    error = invalid(write(tmp_path, "1: 2\n"))
    assert [v.field for v in error.violations] == ["1"]


@pytest.mark.parametrize(
    ("name", "listed"),
    [
        ("GPU_AGENT_SIMULATOR", "GPU_AGENT_SIMULATE, GPU_AGENT_STATE_DIR"),
        ("GPU_AGENT_SIMULATOR", "GPU_AGENT_TELEMETRY__*"),
        (
            "GPU_AGENT_TELEMETRY__INTERVAL",
            "GPU_AGENT_TELEMETRY__INTERVAL_S, GPU_AGENT_TELEMETRY__COLLECTORS",
        ),
        ("GPU_AGENT_TELEMETRY", "GPU_AGENT_TELEMETRY__INTERVAL_S"),
        ("GPU_AGENT_STATE_DIR__X", "GPU_AGENT_STATE_DIR is a setting, not a section"),
        ("GPU_AGENT_state_dir", "did you mean GPU_AGENT_STATE_DIR?"),
    ],
)
def test_unknown_gpu_agent_env_keys_are_errors(name: str, listed: str) -> None:
    error = invalid(env={name: "x"})
    (violation,) = error.violations
    assert violation.field == f"env {name}"
    assert listed in violation.description


def test_other_env_variables_are_ignored() -> None:
    assert load_config(env={"PATH": "/bin", "GPU_AGENTX": "1", "HOME": "/root"}) == AgentConfig()


@pytest.mark.parametrize(
    ("key", "listed"),
    [
        ("telemetry.intervals", "valid keys in telemetry: interval_s"),
        ("nope", "valid keys: simulate, state_dir"),
        ("prewarm", "set one of: prewarm.cache_dir, prewarm.budget_bytes"),
    ],
)
def test_unknown_flag_keys_are_errors(key: str, listed: str) -> None:
    error = invalid(flags={key: "1"})
    (violation,) = error.violations
    assert violation.field == f"flag {key}"
    assert listed in violation.description


# --- files that cannot be used -------------------------------------------------------------------


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    error = invalid(missing)
    assert str(missing) in str(error)
    assert "does not exist" in str(error)


def test_a_directory_is_not_a_config_file(tmp_path: Path) -> None:
    error = invalid(tmp_path)
    assert str(tmp_path) in str(error)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "42\n"])
def test_yaml_that_is_not_a_mapping(tmp_path: Path, text: str) -> None:
    file = write(tmp_path, text)
    error = invalid(file)
    assert str(file) in str(error)
    assert "expected a mapping of settings" in str(error)
    assert [v.field for v in error.violations] == ["config"]


def test_broken_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    file = write(tmp_path, "log_level: info\ntelemetry: [\n")
    error = invalid(file)
    assert str(file) in str(error)
    assert "line 3" in str(error)


# --- settings that need each other ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "missing"), [("cert_file", "key_file"), ("key_file", "cert_file")]
)
def test_tls_cert_and_key_come_together(given: str, missing: str) -> None:
    error = invalid(flags={f"tls.{given}": "/etc/tls/x.pem"})
    (violation,) = error.violations
    assert violation.field == f"tls.{given}"
    assert f"tls.{missing} must be set too" in violation.description


def test_tls_cert_and_key_together_are_accepted() -> None:
    flags = {"tls.cert_file": "/etc/tls/tls.crt", "tls.key_file": "/etc/tls/tls.key"}
    config = load_config(env={}, flags=flags)
    assert config.tls.cert_file == Path("/etc/tls/tls.crt")
    assert config.tls.key_file == Path("/etc/tls/tls.key")


# --- the schema ----------------------------------------------------------------------------------


def test_schema_lists_every_setting_with_its_env_name() -> None:
    rows = config_schema()
    expected = [".".join(path) for path in leaf_paths(AgentConfig)]
    assert [row["key"] for row in rows] == expected
    for row in rows:
        path = str(row["key"]).split(".")
        assert row["env"] == "GPU_AGENT_" + "__".join(path).upper()
        assert row["doc"] and row["allowed"] and row["type"]


def test_schema_defaults_are_the_dataclass_defaults() -> None:
    defaults = AgentConfig()
    for row in config_schema():
        value = value_at(defaults, tuple(str(row["key"]).split(".")))
        if row["key"] == "node_name":
            assert row["default"] == "the machine's host name"
        elif isinstance(value, Path):
            assert row["default"] == str(value)
        elif isinstance(value, tuple):
            assert row["default"] == list(value)
        else:
            assert row["default"] == value


def env_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


def test_every_env_name_in_the_schema_sets_its_setting() -> None:
    """Each row's env name, given its default as text, loads that default back."""
    defaults = AgentConfig()
    for row in config_schema():
        if row["key"] in ("node_name", "simulate"):  # simulate's none is unset, never "" in env
            continue
        env = {str(row["env"]): env_text(row["default"])}
        loaded = load_config(env=env)
        path = tuple(str(row["key"]).split("."))
        assert value_at(loaded, path) == value_at(defaults, path), row["env"]


# --- retired keys load with a warning ----------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "named"),
    [
        ("file", "config mig.label_poll_s is no longer read"),
        ("env", "config env GPU_AGENT_MIG__LABEL_POLL_S is no longer read"),
    ],
)
def test_a_retired_key_is_ignored_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, source: str, named: str
) -> None:
    """A DaemonSet's ConfigMap written for an older agent still loads (issue 37)."""
    file = write(tmp_path, "mig:\n  label_poll_s: 5\n") if source == "file" else None
    env = {"GPU_AGENT_MIG__LABEL_POLL_S": "5"} if source == "env" else {}
    with caplog.at_level(logging.WARNING, logger="agent.config.loader"):
        config = load_config(file, env)
    assert config == AgentConfig()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "agent.config.loader"]
    assert named in line
    assert "remove it" in line


@pytest.mark.parametrize(
    ("name", "text", "allowed"),
    [
        ("GPU_AGENT_SHARING__PLUGIN_NAMESPACE", "GPU Operator", "a namespace: a DNS label"),
        ("GPU_AGENT_DRA__PLUGIN_NAMESPACE", "gpu_operator", "a namespace: a DNS label"),
        ("GPU_AGENT_SHARING__LABEL_CONFIG_NAME", "my config!", "a label value"),
        ("GPU_AGENT_SHARING__LABEL_CONFIG_NAME", "a" * 64, "a label value"),
    ],
)
def test_the_kubernetes_names_of_the_plugin_settings_are_checked_at_load(
    name: str, text: str, allowed: str
) -> None:
    """sharing.plugin_namespace and dra.plugin_namespace took any text, refused by the API
    server only when a reload or a republish deleted pods there (for sharing, after the plugin's
    file was written), and sharing.label_config_name only when a share change ran. Each is now
    refused at load, naming the setting and what it must be (docs/sharing.md, "Reloading the
    plugin")."""
    error = invalid(env={name: text})
    assert [v.field for v in error.violations] == [f"env {name}"]
    assert allowed in error.violations[0].description


@pytest.mark.parametrize(
    "listen",
    [
        "0.0.0.0:\u0669\u0664\u0660\u0660",
        "127.0.0.1:9\uff14\uff10\uff10",
        "a\u00a0b:9400",
        "a b:9400",
    ],
    ids=["arabic-indic-port", "fullwidth-port", "no-break-space-host", "space-host"],
)
def test_a_listen_address_with_a_port_not_in_ascii_digits_or_a_spaced_host_is_refused(
    listen: str,
) -> None:
    """int() reads any script's digits: "٩٤٠٠" was port 9400 (a bind far from the check)."""
    from agent.config.rules import listen_host

    assert listen_host(listen) is None
    assert listen_host("0.0.0.0:9400") == "0.0.0.0"
