"""What the plugin advertises: devices x replicas per resource (reference/mig.md §4, §5.1)."""

from __future__ import annotations

from pathlib import Path

from agent.sharing.advertise import Advertised, advertise, base_resources, mig_device_profiles
from agent.sharing.schema import parse
from tests.unit.sharing.layouts import full_gpu, mig_gpu, node

GOLDEN = Path(__file__).parent / "golden"


def counts(advertised: tuple[Advertised, ...]) -> dict[str, int]:
    return {a.resource: a.count for a in advertised}


def test_readme_examples_advertise_80_on_8_gpus() -> None:
    """The README: 10 replicas on 8 GPUs give 80, renamed to .shared with renameByDefault."""
    expected = {
        "readme-time-slicing.yaml": {"nvidia.com/gpu": 80},
        "readme-time-slicing-renamed.yaml": {"nvidia.com/gpu.shared": 80},
        "readme-mps.yaml": {"nvidia.com/gpu": 80},
        "readme-mps-renamed.yaml": {"nvidia.com/gpu.shared": 80},
        "readme-flags.yaml": {"nvidia.com/gpu": 8},
    }
    for name, want in expected.items():
        assert counts(advertise(parse((GOLDEN / name).read_text()), node(8))) == want, name


def test_eight_gpus_times_four_replicas() -> None:
    config = parse({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}})
    assert advertise(config, node(8)) == (Advertised("nvidia.com/gpu", 8, 4),)
    assert advertise(config, node(8))[0].count == 32


def test_no_sharing_advertises_the_devices_once() -> None:
    assert advertise(parse({}), node(2)) == (Advertised("nvidia.com/gpu", 2, 1),)


def test_mixed_strategy_counts_mig_devices_per_profile_and_shares_only_listed_ones() -> None:
    layouts = [
        mig_gpu(0, "1g.10gb", "1g.10gb", "1g.10gb", "3g.40gb"),
        mig_gpu(1, "1g.10gb+me", "1c.3g.40gb"),
        full_gpu(2),
    ]
    config = parse(
        {
            "flags": {"migStrategy": "mixed"},
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": True,
                    "resources": [{"name": "mig-1g.10gb", "replicas": 3}],
                }
            },
        }
    )
    assert advertise(config, layouts) == (
        Advertised("nvidia.com/gpu", 1, 1),
        Advertised("nvidia.com/mig-1g.10gb.me", 1, 1),
        Advertised("nvidia.com/mig-1g.10gb.shared", 3, 3),
        Advertised("nvidia.com/mig-3g.40gb", 1, 1),
    )


def test_single_strategy_advertises_mig_devices_as_gpu() -> None:
    layouts = [mig_gpu(0, "1g.10gb", "1g.10gb"), mig_gpu(1, "1g.10gb")]
    assert base_resources("single", layouts) == {"nvidia.com/gpu": 3}
    assert base_resources("single", node(2)) == {"nvidia.com/gpu": 2}


def test_single_strategy_with_mixed_profiles_advertises_nothing() -> None:
    """GFD marks such a node -MIG-INVALID with a count of 0."""
    assert base_resources("single", [mig_gpu(0, "1g.10gb", "2g.20gb")]) == {"nvidia.com/gpu": 0}
    assert base_resources("single", [mig_gpu(0)]) == {"nvidia.com/gpu": 0}


def test_none_strategy_counts_mig_enabled_gpus_whole() -> None:
    assert base_resources("none", [mig_gpu(0, "1g.10gb"), full_gpu(1, mig_capable=False)]) == {
        "nvidia.com/gpu": 2
    }


def test_sub_gi_devices_carry_the_c_prefix() -> None:
    assert mig_device_profiles(mig_gpu(0, "1c.3g.40gb", "4g.40gb")) == ["1c.3g.40gb", "4g.40gb"]
