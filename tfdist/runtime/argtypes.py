"""argparse value types shared by tfdist's command lines (no TensorFlow import).

Example:

    parser.add_argument("--workers", type=int_at_least(1))
"""

import argparse
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
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return value
