"""The GPU Operator's default MIG configs (reference/mig.md §3.5) on every simulated GPU model.

Every config that exists for a model applies and asserts, one after the other on the same node,
so each apply is also a transition from the previous layout. A config naming another board's
profiles is refused with the profiles this board has.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import InvalidSpec
from agent.mig.spec import load_spec
from tests.unit.mig.simnode import sim_node

pytestmark = pytest.mark.integration

OPERATOR_CONFIG = (
    Path(__file__).parents[1] / "unit" / "mig" / "gpu-operator-default-mig-config.yaml"
)

COMMON = {"all-disabled", "all-enabled", "all-balanced"}
EIGHTY = COMMON | {
    "all-1g.10gb",
    "all-1g.10gb.me",
    "all-1g.20gb",
    "all-2g.20gb",
    "all-3g.40gb",
    "all-4g.40gb",
    "all-7g.80gb",
}
EXPECTED = {
    "dgx-a100": COMMON
    | {
        "all-1g.5gb",
        "all-1g.5gb.me",
        "all-1g.10gb",
        "all-2g.10gb",
        "all-3g.20gb",
        "all-4g.20gb",
        "all-7g.40gb",
    },
    "dgx-a100-80": EIGHTY,
    "dgx-h100": EIGHTY,
    "mixed": EIGHTY,
    "a30-node": COMMON
    | {"all-1g.6gb", "all-1g.6gb.me", "all-2g.12gb", "all-2g.12gb.me", "all-4g.24gb"},
    "h100-nvl": COMMON
    | {
        "all-1g.12gb",
        "all-1g.12gb.me",
        "all-1g.24gb",
        "all-2g.24gb",
        "all-3g.47gb",
        "all-4g.47gb",
        "all-7g.94gb",
    },
    "hgx-h200": COMMON
    | {
        "all-1g.18gb",
        "all-1g.18gb.me",
        "all-1g.35gb",
        "all-2g.35gb",
        "all-3g.71gb",
        "all-4g.71gb",
        "all-7g.141gb",
    },
}


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_every_operator_default_config_of_the_model_applies_and_asserts(
    preset: str, tmp_path: Path
) -> None:
    node = sim_node(tmp_path, preset)
    spec = load_spec(OPERATOR_CONFIG)
    applied: set[str] = set()
    try:
        for name in spec.names:
            try:
                plan = node.service.plan(spec, name)
            except InvalidSpec as exc:
                # A name of another board: the error lists this board's profiles.
                assert "its profiles are:" in str(exc), exc
                continue
            if plan.unselected:  # device-filtered for another model
                assert not plan.gpus, name
                continue
            result = node.service.apply(spec, name)
            assert {g.status for g in result.gpus} <= {"applied", "unchanged"}, name
            assert node.service.check(spec, name).applied, (name, node.service.check(spec, name))
            applied.add(name)
    finally:
        node.close()
    assert applied == EXPECTED[preset]


def test_filters_pick_each_models_entry_on_a_mixed_node(tmp_path: Path) -> None:
    """all-1g.10gb: 7 x 1g.10gb on 80GB parts; the 40GB entry selects nothing here."""
    node = sim_node(tmp_path, "mixed")
    try:
        spec = load_spec(OPERATOR_CONFIG)
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
