"""tfdist.runtime.argtypes.check_number: the one check behind tfdist's number arguments."""

import math
import re

import numpy as np
import pytest

from tfdist.runtime.argtypes import check_bool, check_callable, check_int_at_least, check_number


@pytest.mark.parametrize("value, expected", [
    (2, 2.0), (0.5, 0.5), (np.float32(0.25), 0.25), (np.int64(3), 3.0),
])
def test_python_and_numpy_numbers_in_bounds_come_back_as_floats(value, expected):
    result = check_number("rate", value, above=0)
    assert type(result) is float and result == expected


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -math.inf, True, "3", [1.0],
                                   np.array([1.0]), None])
def test_anything_but_a_finite_number_is_refused_by_name(value):
    with pytest.raises(ValueError) as caught:
        check_number("rate", value, above=0)
    assert str(caught.value) == f"rate must be a finite number > 0, got {value!r}."


@pytest.mark.parametrize("bounds, good, bad, allowed", [
    (dict(above=0), 1e-9, 0, "> 0"),
    (dict(at_least=0), 0, -1e-9, ">= 0"),
    (dict(at_least=0, below=1), 0.0, 1.0, "in [0, 1)"),
    (dict(above=0, at_most=1), 1.0, 0.0, "in (0, 1]"),
    (dict(below=1.5), -7, 1.5, "< 1.5"),
    (dict(at_most=2), 2, 2.5, "<= 2"),
])
def test_each_bound_is_honoured_at_its_edge_and_named(bounds, good, bad, allowed):
    assert check_number("x", good, **bounds) == good
    with pytest.raises(ValueError, match=rf"^x must be a finite number {re.escape(allowed)}, "
                                         rf"got {bad!r}\.$"):
        check_number("x", bad, **bounds)


def test_none_is_allowed_only_when_it_means_something_and_the_message_says_what():
    assert check_number("timeout", None, above=0, unit="seconds", none_means="no limit") is None
    with pytest.raises(ValueError) as caught:
        check_number("timeout", -1, above=0, unit="seconds", none_means="no limit",
                     hint="300 suits a cluster")
    assert str(caught.value) == ("timeout must be a finite number of seconds > 0 or None "
                                 "(no limit), got -1; 300 suits a cluster.")


def test_two_bounds_on_one_side_is_a_programming_error():
    with pytest.raises(TypeError, match="one lower bound"):
        check_number("x", 1, above=0, at_least=0)
    with pytest.raises(TypeError, match="one upper bound"):
        check_number("x", 1, below=2, at_most=2)


@pytest.mark.parametrize("value, expected", [(True, True), (False, False), (np.bool_(True), True)])
def test_check_bool_takes_python_and_numpy_bools(value, expected):
    assert check_bool("flag", value) is expected


@pytest.mark.parametrize("value", ["no", "False", 0, 1, None, [True]])
def test_check_bool_refuses_what_would_count_by_its_truth(value):
    with pytest.raises(ValueError) as caught:
        check_bool("flag", value)
    assert str(caught.value) == f"flag must be True or False, got {value!r}."


def test_check_callable_takes_functions_and_none_only_when_allowed():
    assert check_callable("print_fn", print, "a function of one string") is print
    assert check_callable("print_fn", None, "a function of one string", allow_none=True) is None
    with pytest.raises(ValueError, match=r"^print_fn must be a function of one string or None, "
                                         r"got 'stdout'\.$"):
        check_callable("print_fn", "stdout", "a function of one string", allow_none=True)
    with pytest.raises(ValueError, match=r"^on_discard must be a function, got None\.$"):
        check_callable("on_discard", None, "a function")


def test_a_long_value_is_shown_by_its_type_and_shape():
    with pytest.raises(ValueError, match=r"^batch_size must be an integer >= 1, got ndarray of "
                                         r"shape \(100, 3\)\.$"):
        check_int_at_least("batch_size", np.zeros((100, 3)), 1)
    with pytest.raises(ValueError, match=r"^rate must be a finite number > 0, got '(x){76}\.\.\.\.$"):
        check_number("rate", "x" * 200, above=0)
