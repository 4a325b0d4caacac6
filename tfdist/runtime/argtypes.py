"""Argument checks shared by tfdist's command lines and Python API (no TensorFlow import).

argparse value types (`int_at_least`) parse command-line text; the
`check_*` functions check a Python argument where it is given and name it,
what it takes and the value (`shown`) when it is wrong.

Example:

    parser.add_argument("--workers", type=int_at_least(1))
    self.timeout = check_number("timeout", timeout, above=0, unit="seconds")
"""

import argparse
import math
import numbers


def int_at_least(minimum):
    """An argparse type: an integer >= `minimum`, else a message naming the value.

    Args:
        minimum: the smallest allowed integer.

    Example:

    >>> int_at_least(1)("3")
    3
    >>> int_at_least(1)("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be an integer >= 1, got '0'
    """
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value
    return parse


def seconds(*, zero_means=None):
    """An argparse type: a finite number of seconds > 0 (or >= 0 when 0 means something).

    Python's `float` takes "nan" and "inf", which a deadline then cannot use.

    Args:
        zero_means: what 0 means ("disables it"); None refuses 0.

    Example:

    >>> seconds()("2.5")
    2.5
    >>> seconds()("nan")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be a finite number of seconds > 0, got 'nan'
    >>> seconds(zero_means="disables it")("-1")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be a finite number of seconds >= 0 (0 disables it), got '-1'
    """
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and zero_means is None):
            allowed = f">= 0 (0 {zero_means})" if zero_means is not None else "> 0"
            raise argparse.ArgumentTypeError(
                f"must be a finite number of seconds {allowed}, got {text!r}")
        return value
    return parse


def shown(value):
    """`repr(value)` for a message, an array as its type and shape when its repr is long.

    Example:

    >>> shown(3)
    '3'
    >>> import numpy as np
    >>> shown(np.zeros((32, 4)))
    'ndarray of shape (32, 4)'
    """
    text = repr(value)
    if len(text) <= 80:
        return text
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{type(value).__name__} of shape {tuple(shape)}"
    return text[:77] + "..."


def check_int_at_least(name, value, minimum):
    """Checks a Python argument: an integer (a Python or NumPy int, not a bool) >= `minimum`; returns it.

    The function-argument twin of `int_at_least` (which parses command-line text).

    Raises:
        ValueError: naming the argument, the bound and the value.

    Example:

    >>> check_int_at_least("rounds", 3, 1)
    3
    >>> check_int_at_least("rounds", 0, 1)
    Traceback (most recent call last):
    ValueError: rounds must be an integer >= 1, got 0.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {shown(value)}.")
    return value


def _bound_text(above, at_least, below, at_most):
    low = f"({above:g}" if above is not None else f"[{at_least:g}" if at_least is not None else None
    high = f"{below:g})" if below is not None else f"{at_most:g}]" if at_most is not None else None
    if low and high:
        return f"in {low}, {high}"
    if low:
        return f"{'>' if above is not None else '>='} {low[1:]}"
    return f"{'<' if below is not None else '<='} {high[:-1]}"


def check_number(name, value, *, above=None, at_least=None, below=None, at_most=None,
                 unit=None, none_means=None, hint=None):
    """Checks a Python argument: a finite real number (a Python or NumPy one, not a bool) within bounds.

    The one check behind tfdist's number arguments (timeouts, rates,
    fractions, smoothing factors), so that every one of them refuses NaN, an
    infinity, a bool and a string with the same kind of message.

    Args:
        name: the argument's name, for the message.
        value: the value given.
        above, at_least: the lower bound, exclusive or inclusive (at most one).
        below, at_most: the upper bound, exclusive or inclusive (at most one).
        unit: what the number counts ("seconds"), for the message.
        none_means: when given, None is allowed and this says what it means
            ("no limit"); else None is refused.
        hint: a sentence added to the message (the usual values, what 0 does).

    Returns:
        `value` as a float, or None.

    Raises:
        ValueError: naming the argument, what is allowed and the value.

    Example:

    >>> check_number("ack_timeout", 30, above=0, unit="seconds")
    30.0
    >>> check_number("dropout", 1.0, at_least=0, below=1)
    Traceback (most recent call last):
    ValueError: dropout must be a finite number in [0, 1), got 1.0.
    >>> check_number("peak_flops", float("inf"), above=0, none_means="not measured")
    Traceback (most recent call last):
    ValueError: peak_flops must be a finite number > 0 or None (not measured), got inf.
    """
    if (above is not None and at_least is not None) or (below is not None and at_most is not None):
        raise TypeError("check_number takes one lower bound (above or at_least) and one upper "
                        "bound (below or at_most)")
    if value is None and none_means is not None:
        return None
    number = (not isinstance(value, bool) and isinstance(value, numbers.Real)
              and math.isfinite(value))
    if number and ((above is not None and not value > above)
                   or (at_least is not None and not value >= at_least)
                   or (below is not None and not value < below)
                   or (at_most is not None and not value <= at_most)):
        number = False
    if not number:
        allowed = "a finite number" + (f" of {unit}" if unit else "")
        bounds = (above, at_least, below, at_most)
        if any(bound is not None for bound in bounds):
            allowed += " " + _bound_text(*bounds)
        if none_means is not None:
            allowed += f" or None ({none_means})"
        note = f"; {hint}" if hint else ""
        raise ValueError(f"{name} must be {allowed}, got {shown(value)}{note}.")
    return float(value)


def check_bool(name, value):
    """Checks a flag argument: True or False (a NumPy bool too); returns it as a bool.

    A string such as "no" or a number would otherwise count by its truth,
    "no" as True.

    Example:

    >>> check_bool("drop_remainder", False)
    False
    >>> check_bool("drop_remainder", "no")
    Traceback (most recent call last):
    ValueError: drop_remainder must be True or False, got 'no'.
    """
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    if not isinstance(value, bool) and not numpy_bool:  # NumPy not imported for this
        raise ValueError(f"{name} must be True or False, got {shown(value)}.")
    return bool(value)


def check_callable(name, value, what, allow_none=False):
    """Checks a function argument: callable (or None when `allow_none`); returns it.

    Args:
        name: the argument's name, for the message.
        value: the value given.
        what: what the function is called with and does, for the message.
        allow_none: whether None (no function) is allowed.

    Example:

    >>> check_callable("print_fn", print, "a function of one string")  # doctest: +ELLIPSIS
    <built-in function print>
    >>> check_callable("print_fn", None, "a function of one string")
    Traceback (most recent call last):
    ValueError: print_fn must be a function of one string, got None.
    """
    if not callable(value) and not (allow_none and value is None):
        raise ValueError(f"{name} must be {what}{' or None' if allow_none else ''}, got "
                         f"{shown(value)}.")
    return value
