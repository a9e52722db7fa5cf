"""The power spec: the forms a user writes, and a refusal naming the field for everything else."""

from __future__ import annotations

import pytest

from agent.errors import InvalidSpec
from agent.power.spec import Entry, Limit, parse


def test_every_selector_and_limit_form() -> None:
    spec = parse(
        "version: v1\n"
        "power:\n"
        "  - {gpus: all, limit: 0.8}\n"
        "  - {gpus: [0, 1, GPU-1234], limit: 500W}\n"
        "  - {model: 'NVIDIA H100 80GB HBM3', limit: '412.5 w'}\n"
        "  - {model: A30, limit: 80%}\n"
        "  - {gpus: [2], limit: 1}\n"
    )
    assert spec.entries == (
        Entry(Limit(fraction=0.8), all_gpus=True),
        Entry(Limit(watts=500.0), indices=(0, 1), uuids=("GPU-1234",)),
        Entry(Limit(watts=412.5), model="NVIDIA H100 80GB HBM3"),
        Entry(Limit(fraction=0.8), model="A30"),
        Entry(Limit(fraction=1.0), indices=(2,)),
    )
    assert Limit(fraction=0.8).milliwatts(700_000) == 560_000
    assert Limit(watts=412.5).milliwatts(700_000) == 412_500


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("- 1\n", "spec", "a mapping"),
        ("power: [{gpus: all, limit: 0.5}]\n", "version", "must be 'v1'"),
        ("version: v2\npower: [{gpus: all, limit: 0.5}]\n", "version", "must be 'v1'"),
        ("version: v1\npower: []\n", "power", "non-empty list"),
        ("version: v1\npower: [{gpus: all, limit: 0.5}]\nextra: 1\n", "extra", "unknown field"),
        ("version: v1\npower: [{gpus: all, limit: 500}]\n", "power[0].limit", "'500W' for watts"),
        ("version: v1\npower: [{gpus: all, limit: 0}]\n", "power[0].limit", "0 < f <= 1"),
        ("version: v1\npower: [{gpus: all, limit: -0.5}]\n", "power[0].limit", "0 < f <= 1"),
        ("version: v1\npower: [{gpus: all, limit: .nan}]\n", "power[0].limit", "0 < f <= 1"),
        ("version: v1\npower: [{gpus: all, limit: .inf}]\n", "power[0].limit", "0 < f <= 1"),
        ("version: v1\npower: [{gpus: all, limit: true}]\n", "power[0].limit", "required"),
        ("version: v1\npower: [{gpus: all}]\n", "power[0].limit", "required"),
        ("version: v1\npower: [{gpus: all, limit: 0W}]\n", "power[0].limit", "above 0"),
        ("version: v1\npower: [{gpus: all, limit: 1e9W}]\n", "power[0].limit", "watts"),
        ("version: v1\npower: [{gpus: all, limit: 999999W}]\n", "power[0].limit", "above 0"),
        ("version: v1\npower: [{gpus: all, limit: 150%}]\n", "power[0].limit", "at most 100"),
        ("version: v1\npower: [{gpus: all, limit: 5kW}]\n", "power[0].limit", "watts"),
        ("version: v1\npower: [{limit: 0.5}]\n", "power[0]", "exactly one of gpus and model"),
        (
            "version: v1\npower: [{gpus: all, model: A30, limit: 0.5}]\n",
            "power[0]",
            "exactly one of gpus and model",
        ),
        ("version: v1\npower: [{gpus: some, limit: 0.5}]\n", "power[0].gpus", "'all'"),
        ("version: v1\npower: [{gpus: [], limit: 0.5}]\n", "power[0].gpus", "'all'"),
        ("version: v1\npower: [{gpus: [true], limit: 0.5}]\n", "power[0].gpus[0]", "GPU index"),
        ("version: v1\npower: [{gpus: [-1], limit: 0.5}]\n", "power[0].gpus[0]", "GPU index"),
        ("version: v1\npower: [{gpus: [/dev/x], limit: 0.5}]\n", "power[0].gpus[0]", "UUID"),
        ("version: v1\npower: [{model: '', limit: 0.5}]\n", "power[0].model", "model name"),
        ("version: v1\npower: [{model: [A30], limit: 0.5}]\n", "power[0].model", "model name"),
        ("version: v1\npower: [{gpus: all, limit: 0.5, x: 1}]\n", "power[0].x", "unknown"),
        ("version: v1\npower: [7]\n", "power[0]", "a mapping"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(text: str, field: str, says: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse(text)
    fields = {v.field: v.description for v in refused.value.violations}
    assert field in fields, refused.value.violations
    assert says in fields[field]


def test_hostile_documents_are_refused_before_they_are_built() -> None:
    bomb = "a: &a [x, x, x]\nb: &b [*a, *a, *a]\nversion: v1\npower: [*b]\n"
    huge = "version: v1\npower:\n" + "  - {gpus: all, limit: 0.5}\n" * 3000
    many = "version: v1\npower:\n" + "  - {gpus: all, limit: 0.5}\n" * 65
    for text in (bomb, huge, many, "{" * 100, "version: v1\npower: !!python/object:os.system x\n"):
        with pytest.raises(InvalidSpec):
            parse(text)


def test_the_watts_hint_is_given_only_where_those_watts_would_be_taken() -> None:
    """`limit: .inf` said "write 'infW' for watts", and 0 "write '0W'": both refused in turn."""
    for value, hint in [("500", "write '500W'"), (".inf", ""), ("0", ""), ("-5", ""), (".nan", "")]:
        with pytest.raises(InvalidSpec) as refused:
            parse(f"version: v1\npower:\n  - {{gpus: all, limit: {value}}}\n")
        (said,) = [v.description for v in refused.value.violations]
        assert ("write '" in said) == bool(hint) and hint in said, said
        if hint:
            parse(f"version: v1\npower:\n  - {{gpus: all, limit: {value}W}}\n")
