"""`agent.errors.check_each`: a list's refusal names every refused item under its index."""

from __future__ import annotations

import pytest

from agent.errors import FieldViolation, InvalidSpec, check_each


def _positive(n: int) -> None:
    if n <= 0:
        raise InvalidSpec(f"{n} is not positive", [FieldViolation("count", "> 0")])


def _not_seven(n: int) -> None:
    if n == 7:
        raise InvalidSpec("seven is refused")  # no field of its own


def test_every_refused_item_is_named_under_its_index_and_the_first_is_said() -> None:
    with pytest.raises(InvalidSpec) as refused:
        check_each([1, -2, 3, 0], _positive)
    assert str(refused.value) == "2 of 4 items refused; items[1]: -2 is not positive"
    assert refused.value.violations == (
        FieldViolation("items[1].count", "> 0"),
        FieldViolation("items[3].count", "> 0"),
    )


def test_a_refusal_without_a_field_names_the_item_and_one_item_is_refused_as_it_is() -> None:
    with pytest.raises(InvalidSpec) as whole:
        check_each([7, 8], _not_seven, what="targets")
    assert whole.value.violations == (FieldViolation("targets[0]", "seven is refused"),)
    with pytest.raises(InvalidSpec) as alone:
        check_each([-1], _positive)
    assert str(alone.value) == "-1 is not positive"
    assert alone.value.violations == (FieldViolation("count", "> 0"),)
    check_each([], _positive)  # nothing to refuse
