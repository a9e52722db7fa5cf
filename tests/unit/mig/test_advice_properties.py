"""Placement advice against the naive oracle, on random layouts of every GPU model the agent knows.

Every advised placement is one NVML lists for the profile and one the oracle can complete
beside the existing instances; every placement the oracle can complete is advised; each "still
fits" count is the most instances of that profile the oracle can add (brute force); the
recommended placement is the best by the documented rule; a move that fits a fragmented
profile leaves a layout the oracle accepts.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.gpu.models import MODELS
from agent.gpu.types import GiProfile, GpuLayout, Placement
from agent.mig.advice import advise_gpu, moves_to_fit, profile_order
from tests.unit.mig import oracle
from tests.unit.mig.layouts import make_layout, profiles_of


@st.composite
def layouts(draw: st.DrawFn, model_key: str | None = None) -> GpuLayout:
    key = model_key or draw(st.sampled_from(sorted(MODELS)))
    profiles = profiles_of(MODELS[key])
    width = max(p.memory_slices for p in profiles)
    placed: list[tuple[GiProfile, Placement]] = []
    for profile, where in draw(
        st.lists(st.tuples(st.sampled_from(profiles), st.integers(0, 7)), max_size=10)
    ):
        at = profile.placements[where % len(profile.placements)]
        shapes = [(p, (p.slice_count,)) for p, _ in [*placed, (profile, at)]]
        fixed = [((p, (p.slice_count,)), q) for p, q in [*placed, (profile, at)]]
        if oracle.completes(shapes, fixed, width):
            placed.append((profile, at))
    busy = draw(st.sets(st.integers(1, max(len(placed), 1)), max_size=2)) if placed else set()
    return make_layout(
        key, [(p.name, q.start) for p, q in placed], busy=[(100 + i, i) for i in sorted(busy)]
    )


def _shapes(layout: GpuLayout) -> list[tuple[oracle.Shape, Placement]]:
    return [(shape, at) for shape, _, at in oracle.shapes_of_layout(layout)]


def _oracle_adds(
    layout: GpuLayout, fixed: list[tuple[oracle.Shape, Placement]], profile: GiProfile
) -> int:
    """The most ``profile`` instances that can join ``fixed``: plain brute force."""
    width = layout.total_memory_slices
    shapes = [s for s, _ in fixed]
    best = 0
    for n in range(1, len(profile.placements) + 1):
        if not oracle.completes([*shapes, *[(profile, (profile.slice_count,))] * n], fixed, width):
            break
        best = n
    return best


def _check(layout: GpuLayout) -> None:
    advice = advise_gpu(layout)
    width = layout.total_memory_slices
    fixed = _shapes(layout)
    profiles = sorted(layout.profiles, key=profile_order)
    assert [name for name, _ in advice.fits_now] == [p.name for p in profiles]
    for (name, n), profile in zip(advice.fits_now, profiles, strict=True):
        assert n == _oracle_adds(layout, fixed, profile), name
    for p_advice, profile in zip(advice.profiles, profiles, strict=True):
        shape = (profile, (profile.slice_count,))
        possible = [
            at
            for at in profile.placements
            if oracle.completes([*(s for s, _ in fixed), shape], [*fixed, (shape, at)], width)
        ]
        advised = [o.placement for o in p_advice.placements]
        assert sorted(advised) == sorted(possible), profile.name
        scores = {}
        for option in p_advice.placements:
            assert option.placement in profile.placements
            after = [*fixed, (shape, option.placement)]
            expected = [(p.name, _oracle_adds(layout, after, p)) for p in profiles]
            assert list(option.fits_after) == expected, (profile.name, option.placement)
            largest = next((name for name, n in expected if n), None)
            assert option.largest_after == largest
            scores[option.placement] = (tuple(n for _, n in expected), -option.placement.start)
        if scores:
            assert p_advice.recommended == max(scores, key=lambda at: scores[at])
            assert not p_advice.reason
        else:
            assert p_advice.recommended is None and p_advice.reason
        found = moves_to_fit(layout, profile.name)
        if possible:
            assert found is None
        if found is not None:
            moves, target = found
            assert p_advice.fragmented and 1 <= len(moves) <= 2
            moved = {m.gpu_instance: m.target for m in moves}
            after = [(s, moved.get(gi, at)) for s, gi, at in oracle.shapes_of_layout(layout)]
            for s, at in after:
                assert at in s[0].placements
            new = [*after, (shape, target)]
            assert oracle.completes([s for s, _ in new], new, width)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_advice_matches_a_brute_force_search_on_random_layouts(layout: GpuLayout) -> None:
    _check(layout)


@pytest.mark.parametrize("key", sorted(MODELS))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_model_the_agent_knows_is_covered(key: str, data: st.DataObject) -> None:
    """A few layouts of each model on its own, so no model is left to chance."""
    _check(data.draw(layouts(key)))


def test_the_recommended_placement_keeps_the_largest_profile_placeable() -> None:
    # H100 with a 1g.10gb at slices 0 and 4: free 1,2,3,5,6,7. A new 1g.10gb at 2 or 3 would
    # leave no 2g.20gb placement; at 1 or 5 one stays; 1 wins the tie (lowest start).
    layout = make_layout("H100-SXM5-80GB", [("1g.10gb", 0), ("1g.10gb", 4)])
    (one,) = advise_gpu(layout, "1g.10gb").profiles
    assert one.recommended == Placement(1, 1)
    fits = {o.placement.start: dict(o.fits_after) for o in one.placements}
    assert sorted(fits) == [1, 2, 3, 5, 6]
    assert [fits[s]["2g.20gb"] for s in (1, 2, 3, 5, 6)] == [1, 0, 0, 1, 1]
    assert fits[1]["1g.20gb"] == 2 > fits[6]["1g.20gb"]


def test_a_fragmented_profile_is_named_with_the_move_that_fits_it() -> None:
    # A100-40GB: 1g.5gb at 2 and at 5 leave 6 free slices, but neither 3g.20gb placement (0, 4).
    layout = make_layout("A100-SXM4-40GB", [("1g.5gb", 2), ("1g.5gb", 5)])
    (three,) = advise_gpu(layout, "3g.20gb").profiles
    assert three.fragmented and three.recommended is None
    assert three.reason.startswith("fragmented: 6 free memory slice(s)")
    found = moves_to_fit(layout, "3g.20gb")
    assert found is not None
    moves, target = found
    # Moving the one at 5 to 3 frees 0-1 for a 2g as well; moving the one at 2 to 6 would not.
    assert [str(m) for m in moves] == ["the 1g.5gb at slice 5 were at slice 3"]
    assert target == Placement(4, 4)
