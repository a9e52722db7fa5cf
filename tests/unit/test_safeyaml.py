"""The attacker's YAML: every document the agent reads is refused within bounds, naming the field
and the path, with a short message, and never with a RecursionError, a TypeError or a ValueError
(agent/safeyaml.py; issue 16)."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from agent.errors import InvalidSpec
from agent.safeyaml import DEFAULT, MAX_MESSAGE, Limits, load, read_text


def billion_laughs(levels: int = 9, fan_out: int = 10) -> str:
    """``a`` holds 10 strings, ``b`` 10 a's, ... ``j`` 10**9 strings: a few hundred bytes."""
    names = "abcdefghijklmnop"
    lines = [f"{names[0]}: &{names[0]} [" + ", ".join(["lol"] * fan_out) + "]"]
    for i in range(1, levels):
        refs = ", ".join([f"*{names[i - 1]}"] * fan_out)
        lines.append(f"{names[i]}: &{names[i]} [{refs}]")
    return "\n".join(lines) + "\n"


def refusal(text: str | bytes, limits: Limits = DEFAULT) -> InvalidSpec:
    with pytest.raises(InvalidSpec) as caught:
        load(text, "config_yaml", limits)
    exc = caught.value
    assert exc.violations, "a refusal names its field"
    assert all(v.field.startswith("config_yaml") for v in exc.violations)
    assert len(str(exc)) < 2 * MAX_MESSAGE + 200, "the message is bounded"
    return exc


@pytest.mark.parametrize("aliases", [16, 1_000_000])
def test_billion_laughs_is_refused_at_once_in_little_memory(aliases: int) -> None:
    """Within the alias budget or far beyond it, the expansion is counted, never built."""
    text = billion_laughs()
    assert len(text) < 500
    tracemalloc.start()
    started = time.monotonic()
    try:
        exc = refusal(text, Limits(max_aliases=aliases))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 2.0
    assert peak < 8 * 1024 * 1024
    assert "alias" in str(exc) or "values once aliases expand" in str(exc)


def test_anchors_and_merges_within_the_budget_load_as_yaml_means() -> None:
    text = "base: &base {replicas: 2, name: gpu}\nover:\n  <<: *base\n  replicas: 4\n"
    assert load(text, "f") == {
        "base": {"replicas": 2, "name": "gpu"},
        "over": {"replicas": 4, "name": "gpu"},
    }


def test_an_alias_inside_the_node_it_names_is_refused() -> None:
    """``&a [*a]`` would build a list that contains itself; any walk of it never ends."""
    assert "cycle" in str(refusal("&a [*a]"))
    assert "cycle" in str(refusal("a: &a {b: *a}"))


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        "{a: " * 50_000 + "1" + "}" * 50_000,
        "".join(f"{'  ' * i}k{i}:\n" for i in range(500)),
        "- " * 5000 + "x",
    ],
    ids=["flow-seq", "flow-map", "block-map", "block-seq"],
)
def test_deep_nesting_is_refused_without_a_recursion_error(text: str) -> None:
    exc = refusal(text)
    assert "nested deeper than 32 levels" in str(exc)


def test_nesting_up_to_the_limit_loads() -> None:
    assert load("[" * 31 + "]" * 31, "f") is not None


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("? [a, b]\n: 1\n", "config_yaml"),
        ("{[1]: 2}", "config_yaml"),
        ("mig-devices:\n  ? {x: 1}\n  : 2\n", "config_yaml: mig-devices"),
        ("k: &k v\n*k : 1\n", "config_yaml"),
    ],
    ids=["block-list-key", "flow-list-key", "nested-map-key", "alias-key"],
)
def test_a_mapping_key_that_is_not_a_scalar_is_refused(text: str, path: str) -> None:
    exc = refusal(text)
    assert exc.violations[0].field == path
    assert "mapping keys must be plain scalars" in exc.violations[0].description


def test_a_5000_digit_integer_is_refused_before_int_and_names_its_path() -> None:
    exc = refusal("mig-configs:\n  a:\n  - devices: [" + "9" * 5000 + "]\n")
    assert exc.violations[0].field == "config_yaml: mig-configs.a[0].devices[0]"
    assert "integer longer than" in exc.violations[0].description
    assert "9999" not in str(exc)


def test_an_integer_beyond_64_bits_is_refused_however_it_is_written() -> None:
    assert "beyond" in str(refusal("x: 0x" + "f" * 17))
    assert "beyond" in str(refusal("x: 1" + ":0" * 20))  # YAML 1.1 base 60
    assert load("x: 18446744073709551615", "f") == {"x": 2**64 - 1}


def test_a_huge_string_is_refused_and_not_echoed() -> None:
    exc = refusal("name: " + "A" * 100_000)
    assert exc.violations[0].field == "config_yaml: name"
    assert "AAAA" not in str(exc)


def test_a_document_over_the_size_limit_is_refused_before_parsing() -> None:
    exc = refusal("a: 1\n" * 300_000)
    assert "at most 1048576 bytes" in exc.violations[0].description


def test_duplicate_keys_are_refused_not_silently_overwritten() -> None:
    assert "duplicate key 'a' (line 2)" in str(refusal("a: 1\na: 2\n"))


def test_syntax_errors_and_unknown_tags_are_refusals_with_capped_text() -> None:
    refusal("a: [")
    refusal("a: &a`\x7f?{b: *a}")  # control characters: found by bench/fuzz_rpc.py as INTERNAL
    refusal("!!python/object/apply:os.system ['true']")
    exc = refusal(b"\xff\xfe")
    assert "UTF-8" in str(exc)
    long_line = "a: b: " + "c" * 10_000
    assert len(refusal(long_line).violations[0].description) <= MAX_MESSAGE


def test_read_text_refuses_a_huge_file_without_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(4 * 1024**3)  # sparse: 4 GiB that would not fit the agent's memory limit
    tracemalloc.start()
    try:
        with pytest.raises(InvalidSpec, match="larger than 1024 bytes"):
            read_text(big, "config", 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024
