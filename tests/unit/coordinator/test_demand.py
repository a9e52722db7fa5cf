"""Demand files and demand traces: what they mean, and the errors for bad ones."""

from __future__ import annotations

import pytest

from agent.coordinator.planning.demand import Demand, DemandEntry, parse_demand, parse_trace
from agent.errors import InvalidSpec
from agent.gpu.models import model_key


def test_counts_for_any_model_and_per_model() -> None:
    demand = parse_demand(
        """
version: v1
demand:
  1g.10gb: 40
  3g.40gb:
    NVIDIA H100 80GB HBM3: 6
    A100-SXM4-80GB: 2
"""
    )
    assert demand.entries == (
        DemandEntry("1g.10gb", 40),
        DemandEntry("3g.40gb", 6, "NVIDIA H100 80GB HBM3"),
        DemandEntry("3g.40gb", 2, "A100-SXM4-80GB"),
    )
    assert demand.total == 48
    assert demand.entry_for("3g.40gb", "NVIDIA A100-SXM4-80GB") == 2
    assert demand.entry_for("1g.10gb", "anything") == 0
    assert demand.entry_for("2g.20gb", "NVIDIA H100 80GB HBM3") is None


def test_entries_with_priorities_and_pools() -> None:
    """The list form: the same profile may be asked for at several priorities and pools."""
    demand = parse_demand(
        """
version: v1
demand:
  - {profile: 7g.80gb, count: 8, priority: 100, pool: "pool=training"}
  - {profile: 1g.10gb, count: 56, model: NVIDIA H100 80GB HBM3}
  - {profile: 1g.10gb, count: 4, priority: 5}
"""
    )
    assert demand.entries == (
        DemandEntry("7g.80gb", 8, None, 100, "pool=training"),
        DemandEntry("1g.10gb", 56, "NVIDIA H100 80GB HBM3"),
        DemandEntry("1g.10gb", 4, None, 5),
    )
    assert demand.pools == ("pool=training",)


def test_model_names_match_without_case_or_the_vendor_prefix() -> None:
    assert model_key("NVIDIA  H100 80GB HBM3") == model_key("h100 80gb hbm3")


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("version: v2\ndemand: {1g.10gb: 1}", "version", "must be v1"),
        ("version: v1\ndemand: {1g.10gb: -1}", "demand.1g.10gb", "integer >= 0"),
        ("version: v1\ndemand: {1g.10gb: true}", "demand.1g.10gb", "integer >= 0"),
        ("version: v1\ndemand: {10gb: 1}", "demand.10gb", "invalid MIG profile"),
        ("version: v1\ndemand: {1c.3g.40gb: 1}", "demand.1c.3g.40gb", "compute-instance"),
        ("version: v1\ndemand: {1g.10gb: {}}", "demand.1g.10gb", "at least one model"),
        ("version: v1\ndemand: 5", "demand", "must map MIG profile names"),
        ("version: v1\ndemand: [1]", "demand[0]", "an entry"),
        ("version: v1\ndemand: {1g.10gb: 1000001}", "demand.1g.10gb", "at most 1000000"),
        ("version: v1\ndemand: [{profile: 1g.10gb, count: 1, x: 1}]", "demand[0].x", "unexpected"),
        (
            "version: v1\ndemand: [{profile: 1g.10gb, count: 1, priority: hi}]",
            "demand[0].priority",
            "an integer",
        ),
        (
            "version: v1\ndemand: [{profile: 1g.10gb, count: 1, pool: ''}]",
            "demand[0].pool",
            "non-empty",
        ),
        (
            "version: v1\ndemand: [{profile: 1g.10gb, count: 1}, {profile: 1g.10gb, count: 2}]",
            "demand[1]",
            "listed twice",
        ),
        ("version: v1\ndemand: {}\nextra: 1", "extra", "unexpected field"),
    ],
)
def test_bad_demand_names_the_field(text: str, field: str, says: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_demand(text)
    assert any(v.field == field and says in v.description for v in caught.value.violations), (
        caught.value.violations
    )


def test_a_compute_instance_profile_is_refused_with_what_to_write_instead() -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_demand("version: v1\ndemand: {1c.3g.40gb: 6}", "demand.yaml")
    message = str(caught.value)
    assert message.startswith("demand.yaml: demand.1c.3g.40gb: 1c.3g.40gb is a compute-instance")
    for says in (
        "demand counts GPU-instance profiles (such as 3g.40gb)",
        "ask for 3g.40gb GPU instances here",
        "split into compute instances per layout in a MIG config",
        "mig-devices: {1c.3g.40gb: N}",
        "gpu-agent fleet apply mig",
    ):
        assert says in message, message
    with pytest.raises(InvalidSpec, match=r"line 2\.profile: 1c\.2g\.20gb .* ask for 2g\.20gb GPU"):
        parse_trace("time,profile,count\n0,1c.2g.20gb,1\n")  # a trace row alike


def test_one_profile_is_counted_for_any_model_or_per_model_not_both() -> None:
    text = "version: v1\ndemand: {1g.10gb: 3, 1c.1g.10gb: {H100: 1}}"
    with pytest.raises(InvalidSpec, match="not both"):
        parse_demand(text)


def test_a_csv_trace_becomes_cumulative_steps_in_time_order() -> None:
    steps = parse_trace(
        "time,profile,count,model\n"
        "60,1g.10gb,20,\n"
        "0,1g.10gb,10,\n"
        "0,3g.40gb,2,NVIDIA H100 80GB HBM3\n"
        "120,3g.40gb,0,NVIDIA H100 80GB HBM3\n"
    )
    assert [s.time for s in steps] == [0, 60, 120]
    assert steps[0].demand == Demand(
        (DemandEntry("1g.10gb", 10), DemandEntry("3g.40gb", 2, "NVIDIA H100 80GB HBM3"))
    )
    assert steps[1].demand.entries[0] == DemandEntry("1g.10gb", 20)
    assert steps[2].demand.entries[1].count == 0


def test_a_yaml_trace_with_iso_times() -> None:
    steps = parse_trace(
        "- {time: '2025-01-01T00:00:00', profile: 1g.10gb, count: 1}\n"
        "- {time: '2025-01-01T01:00:00', profile: 1g.10gb, count: 3}\n"
    )
    assert [s.time for s in steps] == [0, 3600]
    assert steps[1].label == "2025-01-01T01:00:00"


def test_a_bad_trace_row_names_its_line() -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_trace("time,profile,count\n0,1g.10gb,x\n")
    assert caught.value.violations[0].field == "line 2.count"
    with pytest.raises(InvalidSpec, match="missing columns: count"):
        parse_trace("time,profile\n0,1g.10gb\n")


def test_a_hostile_trace_is_refused_naming_where_without_building_its_rows() -> None:
    """A million-column row was built into a dict per row: ~26 times the file in memory. Now
    a record, its columns and each field are bounded, refused naming the line (and column)."""
    import tracemalloc

    from agent.coordinator.planning import demand

    wide_header = ",".join(f"c{i}" for i in range(1_000_000)) + "\n0\n"
    wide_row = "time,profile,count\n0,1g.10gb,1\n1,1g.10gb,2" + "," * 1_000_000 + "\n"
    tracemalloc.start()
    try:
        for text in (wide_header, wide_row):
            with pytest.raises(InvalidSpec):
                parse_trace(text, "t.csv")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak  # a record's worth, not a copy or a split of the file

    with pytest.raises(InvalidSpec) as caught:
        parse_trace(wide_row, "t.csv")
    assert caught.value.violations[0].field == "line 3"

    few = ",".join(["time,profile,count", *(f"x{i}" for i in range(demand.MAX_COLUMNS))])
    with pytest.raises(InvalidSpec, match="header: 35 columns, at most 32") as caught:
        parse_trace(few + "\n0,1g.10gb,1\n")
    assert caught.value.violations[0].field == "header"

    long_pool = "p" * (demand.MAX_FIELD_CHARS + 1)
    with pytest.raises(InvalidSpec) as caught:
        parse_trace(f"time,profile,count,pool\n0,1g.10gb,1,ok\n5,1g.10gb,2,{long_pool}\n")
    assert caught.value.violations[0].field == "line 3.pool"

    # Quoted fields spanning lines still make one record, under the record's bound.
    quoted = '"' + "a\n" * (demand.MAX_RECORD_CHARS // 2 + 1) + '"'
    with pytest.raises(InvalidSpec, match="longer than 65536 characters"):
        parse_trace(f"time,profile,count,pool\n0,1g.10gb,1,{quoted}\n")
    steps = parse_trace('time,profile,count,pool\n0,1g.10gb,1,"a=b,\nc=d"\n\n')
    assert steps[0].demand.entries[0].pool == "a=b,\nc=d"


def test_a_trace_at_its_column_bound_keeps_only_the_columns_it_reads() -> None:
    """Within the bounds a row's 32 columns were kept in a dict each: ~19 times the file in
    memory. Only the six a trace reads are kept (the others are ignored, as before)."""
    import tracemalloc

    header = "time,profile,count," + ",".join(f"note{i}" for i in range(29))
    rows = [f"{t},1g.10gb,{t % 7}," + ",".join(["abcd"] * 29) for t in range(20_000)]
    text = "\n".join([header, *rows]) + "\n"
    tracemalloc.start()
    try:
        steps = parse_trace(text, "t.csv")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(steps) == 20_000 and steps[-1].demand.entries[0].count == 19_999 % 7
    assert peak < 8 * len(text), (peak, len(text))


def test_a_trace_row_is_named_by_its_line_in_the_file() -> None:
    """A blank line and a quoted line break moved the row index off the file's lines: one row
    had two line numbers, its bounds refusal naming one and its fields' another."""
    text = 'time,profile,count\n\n0,1g.10gb,1\n1,"bad\nprofile",1\n2,1g.10gb,x\n'
    with pytest.raises(InvalidSpec) as caught:
        parse_trace(text, "trace.csv")
    assert [v.field for v in caught.value.violations] == ["line 5.profile", "line 6.count"]


def test_a_column_named_with_control_characters_is_named_by_its_position() -> None:
    """The header's name of an over-long field went into the refusal as it was, terminal
    escapes and all."""
    text = "time,profile,\x1b]0;pwn\x07evil\n0,1g.10gb," + "9" * 5000 + "\n"
    with pytest.raises(InvalidSpec) as caught:
        parse_trace(text, "trace.csv")
    assert [v.field for v in caught.value.violations] == ["line 2.column 3"]
    assert str(caught.value).isprintable()
