"""The fleet view: agent answers -> node rows, slice maps, idle devices, totals; selectors."""

from __future__ import annotations

import pytest

from agent._proto.gpuagent.v1 import agent_pb2, cache_pb2, sharing_pb2
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.inventory import node_view, unreachable_view
from agent.coordinator.fleet.selector import parse_selector
from agent.coordinator.fleet.status import fleet_status
from agent.errors import InvalidSpec
from agent.gpu.types import GiProfile
from agent.wire.node import gpu_pb, layout_from, node_from
from tests.unit.coordinator.fakeagents import driverless_node
from tests.unit.coordinator.fleets import A30, H100, gpu


def _node(idle: tuple[float | None, ...] = (10.0, 7200.0, 3600.0)) -> agent_pb2.Node:
    """``idle``: each GPU's idle seconds as the agent's telemetry sampler last saw them."""
    layouts = [
        gpu(
            "a",
            0,
            H100,
            [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)],
            busy=[(99, 4)],
        ),
        gpu("a", 1, H100, mig=(False, False)),
        gpu("a", 2, A30, [("2g.12gb", 0)]),
    ]
    node = agent_pb2.Node(name="node-a", simulated_preset="mixed")
    node.gpus.extend(gpu_pb(g, idle_seconds=s) for g, s in zip(layouts, idle, strict=True))
    node.sharing.CopyFrom(
        sharing_pb2.SharingConfig(
            strategy=sharing_pb2.SHARING_STRATEGY_TIME_SLICING,
            resources=[sharing_pb2.SharedResource(name="nvidia.com/gpu", replicas=4)],
        )
    )
    node.cache.items.extend(
        [
            cache_pb2.CacheItem(name="llama", state=cache_pb2.CACHE_ITEM_STATE_READY),
            cache_pb2.CacheItem(name="mistral", state=cache_pb2.CACHE_ITEM_STATE_FETCHING),
        ]
    )
    node.health.components.add(name="sharing", healthy=False, detail="plugin not loaded")
    return node


def test_what_planning_needs_of_a_layout_survives_the_trip_through_the_api() -> None:
    """The CLI's MIG reads and the coordinator plan on these records (agent/wire/node.py);
    generate-config orders profiles by their NVML constant, so it must come through too."""
    layout = gpu("a", 0, H100, [("3g.40gb", 4, (1, 1, 1))], busy=[(5, 1)])
    back = layout_from(gpu_pb(layout))
    assert (back.instances, back.processes) == (layout.instances, layout.processes)
    assert back.gpu == layout.gpu  # the subsystem id too: device filters match on it

    def planning(p: GiProfile) -> tuple[object, ...]:
        return (
            p.id,
            p.constant,
            p.name,
            p.slice_count,
            p.memory_slices,
            p.instance_count,
            p.placements,
        )

    assert [planning(p) for p in back.profiles] == [planning(p) for p in layout.profiles]


def test_node_rows_and_profile_totals() -> None:
    view = node_view(Target("10.0.0.1:9401", labels={"pool": "x"}), node_from(_node()), 3600)
    gone = unreachable_view(Target("10.0.0.9:9401", "node-z"), "10.0.0.9:9401: connection refused")
    status = fleet_status([view, gone])
    a, z = status.nodes
    assert (a.name, a.health, a.detail) == ("node-a", "unhealthy", "sharing: plugin not loaded")
    assert a.models == "1x A30, 2x H100 80GB HBM3"
    assert [g.slices for g in a.gpus] == ["1122****", "-", "22.."]
    assert a.idle == {"1g.10gb": 2, "2g.12gb": 1, "2g.20gb": 1}
    assert (a.sharing, a.warm, a.idle_gpus) == ("time-slicing nvidia.com/gpu x4", 1, 2)
    assert (z.health, z.detail) == ("unreachable", "10.0.0.9:9401: connection refused")
    by_profile = {p.profile: p for p in status.profiles}
    assert (by_profile["3g.40gb"].devices, by_profile["3g.40gb"].in_use) == (1, 1)
    assert by_profile["1g.10gb"].idle == 2
    assert by_profile["2g.12gb"].creatable == 1  # the A30's free slices 2-3
    assert (status.gpus, status.reachable, status.idle_gpus) == (3, 1, 2)


@pytest.mark.parametrize(
    ("idle", "idle_after_s", "count"),
    [
        ((10.0, 7200.0, 3600.0), 3600.0, 2),
        ((10.0, 7200.0, 3600.0), 0.0, 3),
        ((10.0, None, 3600.0), 3600.0, 1),  # a GPU without a figure is not counted idle
        ((None, None, None), 3600.0, None),  # no figure at all: unknown, not 0
        ((10.0, 7200.0, 3600.0), None, None),  # not asked for
    ],
)
def test_idle_gpus_are_counted_from_the_inventorys_idle_seconds(
    idle: tuple[float | None, ...], idle_after_s: float | None, count: int | None
) -> None:
    """The sweep's one GetNode per node carries each GPU's idle seconds: no telemetry call."""
    view = node_view(Target("10.0.0.1:9401"), node_from(_node(idle)), idle_after_s)
    assert view.idle_gpus == count


def test_only_fully_warm_images_count_as_warm() -> None:
    """A Nydus image pulled without its data is ready but not warm: its pod would still fetch."""
    node = _node()
    level = cache_pb2.ImageWarmthLevel
    for name, warmth in [
        ("server-full", level.Value("IMAGE_WARMTH_LEVEL_FULL")),
        ("server-lazy", level.Value("IMAGE_WARMTH_LEVEL_BOOTSTRAP_ONLY")),
        ("server-half", level.Value("IMAGE_WARMTH_LEVEL_PARTIAL")),
    ]:
        node.cache.items.add(
            name=name,
            kind=cache_pb2.CACHE_ITEM_KIND_IMAGE,
            state=cache_pb2.CACHE_ITEM_STATE_READY,
            image_warmth=cache_pb2.ImageWarmth(level=warmth),
        )
    view = node_view(Target("10.0.0.1:9401"), node_from(node))
    assert view.warm == ("llama", "server-full")


@pytest.mark.parametrize(
    ("text", "selected"),
    [
        ("", True),
        ("name=node-*", True),
        ("name!=node-a", False),
        ("model=h100 80gb hbm3", True),
        ("model=*H200*", False),
        ("pool=x", True),
        ("pool=y", False),
        ("preset=mixed,pool=x", True),
        ("address=10.0.0.1:*", True),
    ],
)
def test_selectors_match_node_facts_and_labels(text: str, selected: bool) -> None:
    view = node_view(Target("10.0.0.1:9401", labels={"pool": "x"}), node_from(_node()))
    assert parse_selector(text).matches(view) is selected


@pytest.mark.parametrize(
    ("text", "driverless", "unreachable"),
    [
        ("model=*H100*", True, True),  # its model cannot be told: kept in view
        ("model=*H100*,pool=x", True, True),
        ("model=*H100*,pool=y", False, False),  # the label can be told, and says no
        ("name=node-b,model=*H100*", False, False),
        ("preset=mixed", False, True),  # a driverless agent still says its preset
    ],
)
def test_a_node_whose_model_cannot_be_told_is_kept_only_where_its_other_facts_agree(
    text: str, driverless: bool, unreachable: bool
) -> None:
    """A driverless or silent node stayed in every selection with a model term, whatever its
    name or labels said: `model=*H100*,pool=y` picked a pool-x node whose driver was loading,
    and the desired state bound it to pool y's rule. Only what cannot be told is let pass."""
    target = Target("10.0.0.1:9401", node="node-a", labels={"pool": "x"})
    unread = driverless_node("node-a")
    unread.simulated_preset = "dgx-h100"
    silent = unreachable_view(target, "unreachable")
    selector = parse_selector(text)
    assert selector.may_match(node_view(target, node_from(unread))) is driverless
    assert selector.may_match(silent) is unreachable


def test_a_bad_selector_term_says_what_is_allowed() -> None:
    with pytest.raises(InvalidSpec, match="not key=value"):
        parse_selector("model")


@pytest.mark.parametrize(
    ("text", "field", "said"),
    [
        ("allocation=bogus", "selector.allocation", "device-plugin, dra, dra-dynamic-mig"),
        ("allocation!=dra-dynamic", "selector.allocation", "device-plugin, dra, dra-dynamic-mig"),
        ("a b=c", "selector", "'a b' is not a node label key"),
        ("pool/=x", "selector", "'pool/' is not a node label key"),
        ("-pool=x", "selector", "'-pool' is not a node label key"),
    ],
)
def test_a_selector_value_or_key_that_can_match_nothing_is_refused(
    text: str, field: str, said: str
) -> None:
    """`allocation=bogus` or a label key Kubernetes cannot hold selected no node (or, with !=,
    every node) without a word: a typo in a rollout's selector read as an empty fleet."""
    with pytest.raises(InvalidSpec) as refused:
        parse_selector(text)
    violations = {v.field: v.description for v in refused.value.violations}
    assert said in f"{refused.value} {violations.get(field)}", (refused.value, violations)


@pytest.mark.parametrize(
    "text", ["allocation=dra*", "allocation!=none", "nvidia.com/mig.config=all-1g.10gb", "a_b=1"]
)
def test_selector_globs_over_allocation_modes_and_prefixed_label_keys_are_taken(text: str) -> None:
    assert parse_selector(text).terms


def test_a_lost_gpu_shows_lost_in_fleet_status_even_without_a_uuid() -> None:
    """A GPU lost mid-run keeps its identity; one lost before the agent started is only an
    index (GetNode gives it no UUID): both rows say lost, the node's detail names both."""
    node = _node()
    node.gpus[1].health = agent_pb2.GPU_HEALTH_LOST
    node.gpus.add(index=3, health=agent_pb2.GPU_HEALTH_LOST)
    status = fleet_status([node_view(Target("10.0.0.1:9401"), node_from(node))])
    (row,) = status.nodes
    assert {g.index: g.mig for g in row.gpus} == {0: "on", 1: "lost", 2: "on", 3: "lost"}
    assert row.health == "unhealthy"
    assert "GPU 1 lost" in row.detail and "GPU 3 lost" in row.detail


def test_a_gpu_lost_mid_run_offers_none_of_its_last_seen_devices() -> None:
    """Its last-seen instances were counted as devices and as idle ones: no pod can use them."""
    node = _node()
    node.gpus[0].health = agent_pb2.GPU_HEALTH_LOST  # the H100 with 1g, 1g, 2g and 3g
    status = fleet_status([node_view(Target("10.0.0.1:9401"), node_from(node))])
    lost = status.nodes[0].gpus[0]
    assert (lost.mig, lost.devices, lost.idle, lost.creatable) == ("lost", {}, {}, {})
    devices = {p.profile: p.devices for p in status.profiles if p.devices}
    assert devices == {"2g.12gb": 1}  # the A30's only


def test_a_lost_gpus_slice_map_is_not_shown_as_a_live_layout() -> None:
    """Its slice map was the last-seen one: `1122333.` for a GPU nobody can read, or `-`
    (a whole GPU, MIG off) for one that fell off the bus with MIG off. It reads `lost`, and
    the node's detail says each loss once, with the driver's error: the agent's gpu-driver
    component says it too while the driver is attached, and was matched by its text."""
    from agent.cli.fleet.status import _status_table
    from agent.coordinator.fleet.status import status_document

    node = _node()
    node.gpus[0].health = agent_pb2.GPU_HEALTH_LOST  # MIG on, 1g 1g 2g 3g
    node.gpus[1].health = agent_pb2.GPU_HEALTH_LOST  # MIG off
    node.gpus[1].health_detail = "fell off the bus"
    node.driver.state = agent_pb2.DRIVER_STATE_ATTACHED
    node.health.components.add(name="gpu-driver", healthy=False, detail="GPU 0 lost: GPU is lost")
    status = fleet_status([node_view(Target("10.0.0.1:9401"), node_from(node))])
    (a,) = status.nodes
    assert [g.slices for g in a.gpus] == ["lost", "lost", "22.."]
    assert a.detail.count("GPU 0 lost") == 1, a.detail
    assert a.detail.count("GPU 1 lost") == 1, a.detail
    assert "GPU 1 lost: fell off the bus" in a.detail, a.detail  # with the driver's error
    table = _status_table(status_document(status, "1h", nodes=True))
    assert "lost lost 22.." in table, table


def test_a_failed_gpu_offers_none_of_its_devices_and_keeps_its_mig_mode() -> None:
    """The H100 failed (XID 48, reset-gpu): its idle 1g.10gb and 2g.20gb were counted as idle
    devices, its free slices as creatable ones, though its devices serve no pod until it is
    reset. It offers none, as a lost one; its row still says MIG on and the mark."""
    node = _node()
    node.gpus[0].condition.CopyFrom(
        agent_pb2.HealthMark(
            state=agent_pb2.HEALTH_STATE_FAILED, reason="XID 48", action="reset-gpu"
        )
    )
    status = fleet_status([node_view(Target("10.0.0.1:9401"), node_from(node))])
    failed = status.nodes[0].gpus[0]
    assert (failed.mig, failed.devices, failed.idle, failed.creatable) == ("on", {}, {}, {})
    assert failed.health.state == "failed"
    devices = {p.profile: p.devices for p in status.profiles if p.devices}
    assert devices == {"2g.12gb": 1}  # the A30's only
    offered = {p.profile for p in status.profiles}  # GPU 1 has MIG off: the A30's alone
    assert not offered & {"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"}, offered


def test_a_failed_or_lost_gpu_is_no_idle_capacity() -> None:
    """GPU 1 (idle 2 h) marked failed and GPU 2 (idle 1 h) lost were counted idle: neither
    serves a pod, so neither is idle capacity; with both out, none is."""
    node = _node()
    node.gpus[1].condition.CopyFrom(
        agent_pb2.HealthMark(state=agent_pb2.HEALTH_STATE_FAILED, reason="XID 79")
    )
    assert node_view(Target("10.0.0.1:9401"), node_from(node), 3600).idle_gpus == 1
    node.gpus[2].health = agent_pb2.GPU_HEALTH_LOST
    view = node_view(Target("10.0.0.1:9401"), node_from(node), 3600)
    assert view.idle_gpus == 0
    assert fleet_status([view]).idle_gpus == 0


def test_a_sharing_config_the_plugin_has_not_loaded_says_so_in_the_sharing_column() -> None:
    """The column showed the file's config as if in effect; the agent says the plugin has not
    loaded it (GetNode's sharing_pickup, not its component's words), and the node needs
    attention."""
    node = _node()
    node.sharing_pickup = "not-loaded"
    del node.health.components[:]
    node.health.components.add(
        name="sharing", healthy=False, detail="plugin not-loaded: no process is running"
    )
    status = fleet_status([node_view(Target("10.0.0.1:9401"), node_from(node))])
    (row,) = status.nodes
    assert row.sharing == "time-slicing nvidia.com/gpu x4 (not loaded)"
    assert row.health == "unhealthy" and "plugin not-loaded" in row.detail
    node.sharing_pickup = "loaded"  # the same words, a plugin that has it: no mark
    [loaded] = fleet_status([node_view(Target("10.0.0.1:9401"), node_from(node))]).nodes
    assert loaded.sharing == "time-slicing nvidia.com/gpu x4"


def test_a_gpu_lost_before_it_was_read_is_of_no_model_a_selector_matches() -> None:
    """Its name is not known: the models column said "1x , 2x H100 ..." and a selector saw an
    empty model among the node's."""
    node = _node()
    lost = node.gpus.add(index=3)
    lost.health, lost.health_detail = agent_pb2.GPU_HEALTH_LOST, "GPU is lost"
    view = node_view(Target("10.0.0.1:9401"), node_from(node), 3600)
    assert view.models == ("NVIDIA A30", "NVIDIA H100 80GB HBM3")
    [row] = fleet_status([view]).nodes
    assert row.models == "1x A30, 2x H100 80GB HBM3, 1x unknown (lost before it was read)"
    assert "GPU 3 lost" in row.detail


def test_a_node_that_withholds_processes_is_shown_with_its_gpus_and_says_so() -> None:
    """A read identity (e.g. `fleet status --insecure` on the read-only loopback door) sees the
    node answering with its GPUs and layouts; only which devices are idle is unknown, and it is
    shown as withheld, never as 0 idle or as an unreachable node."""
    node = _node()
    node.processes_hidden = True
    for g in node.gpus:
        del g.processes[:]
    view = node_view(Target("10.0.0.1:9401"), node_from(node), 3600)
    assert view.reachable and view.withheld == ("processes",)
    assert not view.plannable and "read role" in view.why_not_plannable
    status = fleet_status([view])
    [row] = status.nodes
    assert row.health == "unhealthy"  # its sharing component, as without the roles
    assert row.detail == "sharing: plugin not loaded; processes withheld (read role)"
    assert len(row.gpus) == 3 and row.models == "1x A30, 2x H100 80GB HBM3"
    assert row.idle is None and all(g.idle is None for g in row.gpus)
    assert row.idle_gpus == 2  # from telemetry's idle seconds, which are not withheld
    assert status.reachable == 1
    by_profile = {p.profile: p for p in status.profiles}
    assert (by_profile["1g.10gb"].devices, by_profile["1g.10gb"].unknown) == (2, 2)
    assert (by_profile["1g.10gb"].in_use, by_profile["1g.10gb"].idle) == (0, 0)


def test_each_node_row_carries_its_allocation_mode() -> None:
    from agent.cli.fleet.status import _status_table
    from agent.coordinator.fleet.status import status_document

    node = _node()
    node.allocation.mode = agent_pb2.ALLOCATION_MODE_DRA_DYNAMIC_MIG
    node.allocation.evidence = "partitionable devices"
    node.allocation.dra_driver = "gpu.nvidia.com"
    gone = unreachable_view(Target("10.0.0.9:9401", "node-z"), "connection refused")
    doc = status_document(
        fleet_status([node_view(Target("10.0.0.1:9401"), node_from(node)), gone]),
        "1h",
        nodes=True,
    )
    a, z = doc["nodes"]
    assert a["allocation"] == {
        "mode": "dra-dynamic-mig",
        "evidence": "partitionable devices",
        "driver": "gpu.nvidia.com",
    }
    assert z["allocation"] is None  # not answered: not a mode
    table = _status_table(doc).splitlines()
    assert "ALLOCATION" in table[0]
    assert "dra-dynamic-mig" in table[1] and " - " in table[2]
    assert doc["totals"]["allocation"] == {"dra-dynamic-mig": 1}


def test_a_node_whose_driver_is_not_ready_is_not_counted_as_a_node_without_gpus() -> None:
    """A driverless agent lists no GPU: fleet status said "GPUS 0", "0 GPU(s)" and "0 idle"
    for GPUs it never read."""
    from agent.cli.fleet.status import _status_table
    from agent.coordinator.fleet.status import status_document

    driverless = driverless_node("node-b")
    views = [
        node_view(Target("10.0.0.1:9401"), node_from(_node()), 3600.0),
        node_view(Target("10.0.0.2:9401"), node_from(driverless), 3600.0),
    ]
    status = fleet_status(views)
    a, b = status.nodes
    assert (a.gpus_read, b.gpus_read) == (True, False)
    assert b.idle_gpus is None  # unknown, not 0
    assert (status.gpus, status.gpus_unread) == (3, 1)
    doc = status_document(status, "1h", nodes=True)
    assert doc["totals"]["gpus_unread_nodes"] == 1
    table = _status_table(doc)
    assert "? (not read)" in table
    assert "3 GPU(s) (and the GPUs of 1 node(s) not read: driver not ready)" in table


def test_a_node_whose_gpus_were_not_read_counts_under_no_model_line() -> None:
    """Its MODELS read `-` and the totals counted it under a model line `-` beside
    `3x ...`, as if a node of no GPUs; its models are unknown, said so."""
    from agent.coordinator.fleet.status import status_document

    driverless = driverless_node("node-b")
    status = fleet_status([node_view(Target("10.0.0.2:9401"), node_from(driverless), 3600.0)])
    assert status.nodes[0].models == "? (not read)"
    assert status_document(status, "1h")["totals"]["models"] == {"? (not read)": 1}


def test_an_unreachable_node_shows_its_gpus_and_warm_items_as_unknown_not_0() -> None:
    """A node that did not answer showed "GPUS 0" and "WARM 0", and JSON ``"gpus_read": true``
    and ``"warm": 0``: counts nobody read. Now they are unknown (``?``, ``null``), and the
    totals' unread count still names only answering nodes."""
    from agent.cli.fleet.status import _status_table
    from agent.coordinator.fleet.status import status_document

    gone = unreachable_view(Target("10.0.0.9:9401", "node-z"), "connection refused")
    status = fleet_status([gone])
    (z,) = status.nodes
    assert (z.gpus_read, z.warm, z.idle) == (False, None, None)
    doc = status_document(status, "1h", nodes=True)
    record = doc["nodes"][0]
    assert (record["gpus_read"], record["warm"], record["idle"]) == (False, None, None)
    assert doc["totals"]["gpus_unread_nodes"] == 0  # unread for being unreachable, said there
    row = next(line for line in _status_table(doc).splitlines() if line.startswith("node-z"))
    cells = row.split()
    assert "0" not in cells, row  # neither GPUS nor WARM claims a count


def test_the_summary_counts_the_gpus_of_nodes_that_did_not_answer_as_unread() -> None:
    """With no agent answering the summary read `0 GPU(s) ... GPU health: no GPU.`: a fleet of
    no GPUs, for GPUs nobody read. The nodes that did not answer are said beside the count,
    as those whose driver is not ready are."""
    from agent.cli.fleet.status import _status_table
    from agent.coordinator.fleet.status import status_document

    gone = unreachable_view(Target("10.0.0.9:9401", "node-z"), "connection refused")
    alone = _status_table(status_document(fleet_status([gone]), "1h"))
    assert "0 GPU(s) (and the GPUs of 1 node(s) not read: not answering)" in alone, alone
    assert "GPU health: none read." in alone and "no GPU" not in alone, alone
    beside = fleet_status([node_view(Target("10.0.0.1:9401"), node_from(_node()), 3600), gone])
    text = _status_table(status_document(beside, "1h"))
    assert "3 GPU(s) (and the GPUs of 1 node(s) not read: not answering)" in text, text


def test_the_idle_total_says_on_how_many_answering_nodes_idle_time_is_unknown() -> None:
    """A node whose agent knows no GPU's idle time shows its idle count unknown, but the
    totals summed it as 0: `0 idle for 1h or more` for a fleet none of whose idle time was
    known. The totals say on how many answering nodes (GPUs read) it is unknown
    (`idle_unknown_nodes`), and so does the summary."""
    from agent.cli.fleet.status import _status_table
    from agent.coordinator.fleet.status import status_document

    unknown = node_view(Target("10.0.0.1:9401"), node_from(_node((None, None, None))), 3600)
    assert unknown.idle_gpus is None
    doc = status_document(fleet_status([unknown]), "1h")
    assert (doc["totals"]["idle_gpus"], doc["totals"]["idle_unknown_nodes"]) == (0, 1)
    assert "0 idle for 1h or more (idle time unknown on 1 node(s))" in _status_table(doc)
    known = node_view(Target("10.0.0.2:9401"), node_from(_node()), 3600)
    doc = status_document(fleet_status([known]), "1h")
    assert doc["totals"]["idle_unknown_nodes"] == 0
    assert "idle time unknown" not in _status_table(doc)


def test_a_node_with_a_gpu_listed_but_not_read_needs_attention_naming_it_and_the_call() -> None:
    """GPU 1 answers NVML's list but its MIG-mode read fails (it needs a reset), and GPU 3 was
    never read: the agent's gpu-driver component says so, and is dropped while the driver is
    attached (a lost GPU says itself). The node read ok with no attention; it is unhealthy,
    naming each GPU and the failing call."""
    from agent.coordinator.fleet.status import needs_attention, status_document

    node = _node()
    del node.health.components[:]  # the sharing complaint: only the unread GPUs are wrong
    node.driver.state = agent_pb2.DRIVER_STATE_ATTACHED
    node.gpus[1].unread = "nvmlDeviceGetMigMode: Unknown Error"
    node.gpus.add(index=3, unread="nvmlDeviceGetUUID: GPU requires reset", never_read=True)
    node.health.components.add(name="gpu-driver", healthy=False, detail="GPU 1 not read")
    [row] = fleet_status([node_view(Target("10.0.0.1:9401"), node_from(node))]).nodes
    assert row.health == "unhealthy" and needs_attention(row)
    assert "GPU 1 not read: nvmlDeviceGetMigMode: Unknown Error" in row.detail, row.detail
    assert "GPU 3 not read: nvmlDeviceGetUUID: GPU requires reset" in row.detail, row.detail
    status = fleet_status([node_view(Target("10.0.0.1:9401"), node_from(node))])
    assert status_document(status, "1h", nodes=True)["totals"]["attention"] == 1


def test_an_unread_gpus_last_seen_free_space_and_slice_map_are_not_shown_as_live() -> None:
    """The A30 (GPU 2, 2g.12gb at 0-1, 2-3 free) fails its MIG-mode read: its free slices were
    counted creatable and its last slice map shown as live. GPU 3 was lost and GPU 4 never
    read, both without a UUID: keyed by UUID, GPU 4 read as lost, and its unknown MIG mode as
    n/a (no MIG); its model was "lost before it was read"."""
    from agent.cli.fleet.status import _status_table
    from agent.coordinator.fleet.status import status_document

    node = _node()
    node.gpus[2].unread = "nvmlDeviceGetMigMode: Unknown Error"
    node.gpus.add(index=3, health=agent_pb2.GPU_HEALTH_LOST)
    node.gpus.add(index=4, unread="nvmlDeviceGetUUID: GPU requires reset", never_read=True)
    status = fleet_status([node_view(Target("10.0.0.1:9401"), node_from(node))])
    (row,) = status.nodes
    unread, lost, never = row.gpus[2], row.gpus[3], row.gpus[4]
    assert (unread.mig, unread.slices, unread.creatable) == ("unread", "unread", {})
    assert (lost.mig, lost.slices) == ("lost", "lost")
    assert (never.mig, never.slices, never.creatable) == ("unread", "unread", {})
    assert "2g.12gb" not in {p.profile for p in status.profiles if p.creatable}
    assert row.models == (
        "1x A30, 2x H100 80GB HBM3, 1x unknown (lost before it was read), 1x unknown (not read)"
    )
    table = _status_table(status_document(status, "1h", nodes=True))
    assert "1122**** - unread lost unread" in table, table
    assert "unread: listed, but its reads fail (it may need a reset)" in table, table
