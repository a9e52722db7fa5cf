"""Every MIG config NVIDIA ships, round-tripped on every simulated GPU model.

The shipped files (tests/fixtures/mig-configs: the GPU Operator's default-mig-parted-config and
mig-parted's systemd default, examples and mig-manager example ConfigMaps, unchanged) are applied
and asserted config by config, one after the other on the same node, so each apply is also a
transition from the previous layout. A config naming another board's profiles is refused with the
profiles this board has; a config device-filtered for another board selects nothing; an
unfiltered config too big for the board is refused before anything changes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import Conflict, InvalidSpec
from agent.gpu.models import MODELS, profile_name
from agent.gpu.sim.presets import PRESETS
from agent.mig.spec import MigSpec, load_spec
from tests.unit.mig.simnode import SimNode, sim_node

pytestmark = pytest.mark.integration

CONFIGS = Path(__file__).parents[1] / "fixtures" / "mig-configs"
FILES = sorted(p.name for p in CONFIGS.glob("*.yaml"))
OPERATOR = "gpu-operator-default-mig-parted-config.yaml"

# Profile names of boards the simulator has no model for (GB200, B300, GB300: mig.md §1.3 gives
# names only). A config of the shipped files that uses one of them may reach only the
# unknown-profile path; every other config must apply on at least one model.
UNMODELLED = {
    "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb", "7g.189gb",  # GB200
    "3g.95gb", "4g.95gb",  # GB200 boards reporting more memory
    "1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb",  # B300
    "1g.35gb+me", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb",  # GB300
}  # fmt: skip


def _refusal(node: SimNode, spec: MigSpec, name: str) -> str | None:
    """Why ``name`` is not for this board, before any change; None when it applies here."""
    try:
        plan = node.service.plan(spec, name)
    except InvalidSpec as exc:
        # A name of another board: the error lists this board's profiles.
        assert "its profiles are:" in str(exc), (name, exc)
        return "unknown-profile"
    if plan.unselected and not plan.gpus:  # device-filtered for another model
        return "not-selected"
    if any(g.status == "infeasible" for g in plan.gpus):
        return "infeasible"
    return None


def _round_trip(state_dir: Path, preset: str, file: str) -> dict[str, str]:
    """Plan, apply and assert each config of ``file``: config name -> outcome."""
    node = sim_node(state_dir, preset)
    spec = load_spec(CONFIGS / file)
    outcomes: dict[str, str] = {}
    try:
        for name in spec.names:
            refused = outcomes[name] = _refusal(node, spec, name) or "applied"
            if refused == "infeasible":
                # Unfiltered and too big for this board (all-1g.10gb: 7 on an A100-40GB, whose
                # 1g.10gb is the double-memory profile): refused whole, like mig-parted's
                # "all orderings failed", before anything changes.
                before = node.states()
                with pytest.raises(Conflict, match="cannot be applied"):
                    node.service.apply(spec, name)
                assert node.states() == before, name
            if refused != "applied":
                continue
            plan = node.service.plan(spec, name)
            result = node.service.apply(spec, name)
            assert {g.status for g in result.gpus} <= {"applied", "unchanged"}, (name, result)
            check = node.service.check(spec, name)
            # GPUs no entry selects (devices: [0, 1, 2, 3] on an 8-GPU node) keep their layout;
            # mig-parted's assert skips them, ours names them, so only the selected ones count.
            wrong = [m for m in check.mismatches if "is not selected by any entry" not in m]
            assert check.applied or (plan.unselected and not wrong), (name, check)
    finally:
        node.close()
    return outcomes


def _applies_by_planning(node: SimNode, spec: MigSpec, name: str) -> bool:
    """Whether config ``name`` applies on this board as far as planning tells (that it then
    applies and asserts is what the round trip checks, config by config)."""
    return _refusal(node, spec, name) is None


_Outcomes = dict[tuple[str, str], dict[str, str]]  # (preset, file) -> config name -> outcome


@pytest.fixture(scope="module")
def round_trips() -> _Outcomes:
    """Round trips already run in this module, so the summary test need not repeat them."""
    return {}


@pytest.mark.parametrize("file", FILES)
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_shipped_config_round_trips_on_every_model(
    preset: str, file: str, tmp_path: Path, round_trips: _Outcomes
) -> None:
    """A config the board can hold applies and then asserts; the rest are refused cleanly. Of
    the GPU Operator's default file, each model applies exactly its own configs (EXPECTED)."""
    outcomes = round_trips[preset, file] = _round_trip(tmp_path, preset, file)
    assert outcomes.get("all-disabled", "applied") == "applied"
    if file == OPERATOR:
        assert {n for n, o in outcomes.items() if o == "applied"} == EXPECTED[preset]


def _applied_somewhere(tmp_path: Path, round_trips: _Outcomes) -> set[tuple[str, str]]:
    """The (file, config name) pairs that apply on at least one model. Round trips run on this
    worker tell first; a pair not run here is planned on a fresh node of its model (the round
    trip of that pair, on whichever worker, checks that "applied" really applies), and only
    for the configs no model has applied yet: one model that applies a config is enough."""
    applied = {
        (file, name)
        for (_, file), outcomes in round_trips.items()
        for name, outcome in outcomes.items()
        if outcome == "applied"
    }
    for preset in sorted(PRESETS):
        for file in FILES:
            if (preset, file) in round_trips:
                continue
            spec = load_spec(CONFIGS / file)
            open_names = [n for n in spec.names if (file, n) not in applied]
            if not open_names:
                continue
            node = sim_node(tmp_path / preset / file, preset)
            try:
                applied |= {(file, n) for n in open_names if _applies_by_planning(node, spec, n)}
            finally:
                node.close()
    return applied


def test_every_config_for_a_modelled_board_reaches_the_real_path(
    tmp_path: Path, round_trips: _Outcomes
) -> None:
    """No shipped config stops at the unknown-profile path for lack of a model (issue #20)."""
    modelled = {profile_name(m, p) for m in MODELS.values() for p in m.gi_profiles}
    assert not UNMODELLED & modelled  # the exemption covers boards without a model only
    spec_profiles = {
        (file, name): {p for entry in entries for p, _ in entry.mig_devices}
        for file in FILES
        for name, entries in load_spec(CONFIGS / file).configs
    }
    applied = _applied_somewhere(tmp_path, round_trips)
    never_applied = {
        key for key in spec_profiles if key not in applied and not spec_profiles[key] & UNMODELLED
    }
    assert never_applied == set()


# The GPU Operator's per-board configs (mig.md §3.5) that each preset must apply.
COMMON = {"all-disabled", "all-enabled", "all-balanced"}
EIGHTY = COMMON | {
    "all-1g.10gb", "all-1g.10gb.me", "all-1g.20gb", "all-2g.20gb", "all-3g.40gb", "all-4g.40gb",
    "all-7g.80gb",
}  # fmt: skip
NINETY_SIX = COMMON | {
    "all-1g.12gb", "all-1g.12gb.me", "all-1g.24gb", "all-2g.24gb", "all-3g.48gb", "all-4g.48gb",
    "all-7g.96gb",
}  # fmt: skip
EXPECTED = {
    "dgx-a100": COMMON | {
        "all-1g.5gb", "all-1g.5gb.me", "all-1g.10gb", "all-2g.10gb", "all-3g.20gb",
        "all-4g.20gb", "all-7g.40gb",
    },
    "dgx-a100-80": EIGHTY,
    "dgx-h100": EIGHTY,
    "mixed": EIGHTY,
    "a30-node": COMMON | {
        "all-1g.6gb", "all-1g.6gb.me", "all-2g.12gb", "all-2g.12gb.me", "all-4g.24gb",
    },
    "h100-nvl": COMMON | {
        "all-1g.12gb", "all-1g.12gb.me", "all-1g.24gb", "all-2g.24gb", "all-3g.47gb",
        "all-4g.47gb", "all-7g.94gb",
    },
    "hgx-h200": COMMON | {
        "all-1g.18gb", "all-1g.18gb.me", "all-1g.35gb", "all-2g.35gb", "all-3g.71gb",
        "all-4g.71gb", "all-7g.141gb",
    },
    "gh200": NINETY_SIX,
    "hgx-h20": NINETY_SIX,
    "gh200-144": COMMON | {
        "all-1g.18gb", "all-1g.18gb.me", "all-1g.36gb", "all-2g.36gb", "all-3g.72gb",
        "all-4g.72gb", "all-7g.144gb",
    },
    "dgx-b200": COMMON | {
        "all-1g.23gb", "all-1g.23gb.me", "all-1g.45gb", "all-2g.45gb", "all-3g.90gb",
        "all-4g.90gb", "all-7g.180gb",
    },
    "rtx-pro-6000": COMMON | {
        "all-1g.24gb", "all-1g.24gb.me", "all-1g.24gb.gfx", "all-1g.24gb.me.all",
        "all-1g.24gb-me", "all-2g.48gb", "all-2g.48gb.gfx", "all-2g.48gb.me.all",
        "all-2g.48gb-me", "all-4g.96gb", "all-4g.96gb.gfx",
    },
}  # fmt: skip


def test_every_preset_is_covered() -> None:
    assert set(EXPECTED) == set(PRESETS)


def test_filters_pick_each_models_entry_on_a_mixed_node(tmp_path: Path) -> None:
    """all-1g.10gb: 7 x 1g.10gb on 80GB parts; the 40GB entry selects nothing here."""
    node = sim_node(tmp_path, "mixed")
    try:
        spec = load_spec(CONFIGS / OPERATOR)
        plan = node.service.plan(spec, "all-1g.10gb")
        assert {p.desired.source for p in plan.gpus} == {"mig-configs.all-1g.10gb[0]"}
        node.service.apply(spec, "all-balanced")
        exported = node.service.export()["mig-configs"]["current"]
        assert exported == [
            {
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
            }
        ]
    finally:
        node.close()
