"""argparse value types shared by tfdist's command lines (no TensorFlow import).

Example:

    parser.add_argument("--workers", type=int_at_least(1))
"""

import argparse


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
