"""Argument checks shared by the schedules (private)."""

import math
import numbers


def check_int(owner, name, value, minimum):
    """Returns `value` as an int if it is an integer >= `minimum`, else raises.

    Example:

    >>> check_int("WarmupSchedule", "warmup_steps", 100, 0)
    100
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"{owner}: `{name}` must be an integer >= {minimum}. "
            f"Received: {name}={value!r} (type {type(value).__name__})."
        )
    if value < minimum:
        raise ValueError(
            f"{owner}: `{name}` must be an integer >= {minimum}. "
            f"Received: {name}={value!r}."
        )
    return int(value)


def check_float(owner, name, value, minimum=0.0, strict=False):
    """Returns `value` as a float if it is a finite real number above `minimum`.

    `strict=True` means `value > minimum`, else `value >= minimum`.

    Example:

    >>> check_float("WarmupSchedule", "peak", 1e-3, strict=True)
    0.001
    """
    relation = ">" if strict else ">="
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"{owner}: `{name}` must be a finite number {relation} {minimum}. "
            f"Received: {name}={value!r} (type {type(value).__name__})."
        )
    value = float(value)
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise ValueError(
            f"{owner}: `{name}` must be a finite number {relation} {minimum}. "
            f"Received: {name}={value!r}."
        )
    return value


def check_choice(owner, name, value, choices):
    """Returns `value` if it is one of `choices`, else raises listing them.

    Example:

    >>> check_choice("WarmupSchedule", "shape", "linear", ("linear", "cosine"))
    'linear'
    """
    if value not in choices:
        raise ValueError(
            f"{owner}: `{name}` must be one of {', '.join(repr(c) for c in choices)}. "
            f"Received: {name}={value!r}."
        )
    return value
