"""The predicates every command, recipe, config and checkpoint check shares (graphkit.validation)."""

import math

import pytest

from graphkit.validation import divisors, is_count, is_number


@pytest.mark.parametrize("value", [True, False, 1.0, "3", None, 0, -1, math.nan])
def test_is_count_refuses_what_is_not_a_positive_integer(value):
    assert not is_count(value)


def test_is_count_holds_its_bounds():
    assert is_count(1) and is_count(0, 0) and is_count(10, 1, 10)
    assert not is_count(11, 1, 10) and not is_count(-1, 0)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, "1", None])
def test_is_number_refuses_nan_infinities_booleans_and_strings(value):
    assert not is_number(value)


def test_is_number_takes_finite_ints_and_floats():
    assert is_number(0) and is_number(-2.5) and is_number(3e-4)


@pytest.mark.parametrize(("n", "expected"), [(1, [1]), (12, [1, 2, 3, 4, 6, 12]), (49, [1, 7, 49]), (97, [1, 97])])
def test_divisors_are_every_divisor_ascending(n, expected):
    assert divisors(n) == expected == [d for d in range(1, n + 1) if n % d == 0]
