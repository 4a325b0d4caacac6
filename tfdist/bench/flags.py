"""Flags the alternating-rounds benchmarks share (TensorFlow-free, for `--help`).

    parser = argparse.ArgumentParser(prog="tfdist bench model-parallel")
    add_round_flags(parser, rounds=3, steps=10, sequence_length=64, vocab_size=512,
                    quick="tiny data, 1 round of 2 steps (for tests)")
"""

import argparse
import os
import tempfile

from tfdist.runtime.argtypes import int_at_least
from tfdist.runtime.tf_logging import add_tf_log_level_flag


def add_transformer_flags(parser):
    """Adds --size (default tiny), --layers and --batch (global, default 32): the Transformer
    of the model- and tensor-parallel benches.

    Example:

    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_transformer_flags(parser)
    >>> parser.parse_args(["--layers", "4"]).layers
    4
    """
    positive = int_at_least(1)
    parser.add_argument("--size", default="tiny", help="Transformer size (default tiny)")
    parser.add_argument("--layers", type=positive, default=None,
                        help="number of blocks (default: the size's)")
    parser.add_argument("--batch", type=positive, default=32, help="global batch (default 32)")


def add_round_flags(parser, *, rounds, steps, sequence_length, vocab_size, quick,
                    token_defaults=None):
    """Adds --rounds, --steps, --sequence-length, --vocab-size, --json-out, --quick, --tf-log-level.

    Args:
        parser: an `argparse.ArgumentParser`.
        rounds, steps, sequence_length, vocab_size: the benchmark's defaults.
        quick: the help of `--quick` (what the quick setting runs).
        token_defaults: the help's words for the defaults of --sequence-length
            and --vocab-size where they are None (resolved later), e.g.
            `("128; --quick 32", "8000; --quick 256")`.

    Example:

    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_round_flags(parser, rounds=3, steps=10, sequence_length=64, vocab_size=512,
    ...                 quick="tiny data")
    >>> parser.parse_args(["--rounds", "2"]).rounds
    2
    """
    positive = int_at_least(1)
    parser.add_argument("--rounds", type=positive, default=rounds,
                        help=f"alternating rounds (default {rounds})")
    parser.add_argument("--steps", type=positive, default=steps,
                        help=f"timed steps per setting and round (default {steps})")
    shown = token_defaults or (sequence_length, vocab_size)
    parser.add_argument("--sequence-length", type=positive, default=sequence_length,
                        help=f"tokens per example of the synthetic data (default {shown[0]})")
    parser.add_argument("--vocab-size", type=int_at_least(2), default=vocab_size,
                        help=f"vocabulary of the synthetic data (default {shown[1]})")
    parser.add_argument("--json-out", default=None, help="also write the report as JSON here")
    parser.add_argument("--quick", action="store_true", help=quick)
    add_tf_log_level_flag(parser)


def parse_quick(parser, argv, quick_values):
    """Parses `argv` with `parser`, where `--quick` presets `quick_values`: each
    flag the command line leaves unset takes its quick value instead of its
    default, and a flag given on the command line is honoured with `--quick` too
    (`--quick --steps 5` runs the quick setting for 5 steps). Keys of
    `quick_values` that are no flag (e.g. warm-up steps) become attributes of
    the result, under `--quick` only.

    Args:
        parser: an `argparse.ArgumentParser` with a `--quick` flag.
        argv: the arguments.
        quick_values: `{dest: value}` of the quick setting.

    Returns:
        The parsed namespace. A `--json-out` given has its folder created
        (`prepare_output_file`) before the command does any work.

    Example:

    >>> parser = argparse.ArgumentParser()
    >>> add_round_flags(parser, rounds=3, steps=10, sequence_length=64, vocab_size=512,
    ...                 quick="tiny data")
    >>> args = parse_quick(parser, ["--quick", "--steps", "5"], dict(rounds=1, steps=2))
    >>> args.rounds, args.steps
    (1, 5)
    """
    unset = object()
    defaults = vars(parser.parse_args([]))
    args = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(defaults, unset)))
    given = {dest for dest, value in vars(args).items() if value is not unset}
    quick = args.quick is True
    for dest, default in defaults.items():
        if dest not in given:
            setattr(args, dest, quick_values[dest] if quick and dest in quick_values
                    else default)
    if quick:
        for dest, value in quick_values.items():
            if dest not in defaults:
                setattr(args, dest, value)
    if getattr(args, "json_out", None):
        prepare_output_file(args.json_out, "--json-out")
    return args


def prepare_output_folder(path, flag):
    """Creates the folder `path` that `flag` names and checks that a file can
    be written in it, before any work: a benchmark that cannot write its
    results stops at once, not after minutes of measuring.

    Raises:
        ValueError: naming the flag, the path and why (`tfdist bench` exits 2).

    Example:

    >>> prepare_output_folder("/proc/bench", "--out")
    Traceback (most recent call last):
    ValueError: --out /proc/bench: cannot write there (No such file or directory): ...
    """
    _make_writable_folder(path, f"{flag} {path}")


def prepare_output_file(path, flag):
    """`prepare_output_folder` for the folder of the file `path`; a folder at
    `path` itself is refused.

    Example:

    >>> prepare_output_file("results/engine.json", "--json-out")  # creates results/
    """
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a folder; name a file (e.g. {path}/report.json).")
    _make_writable_folder(os.path.dirname(os.path.abspath(path)), f"{flag} {path}")


def _make_writable_folder(folder, named):
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ValueError(
            f"{named}: cannot write there ({error.strerror or error}): name a folder on a disk "
            "this user can write to.") from None


TOKEN_FLAGS = (("--sequence-length", "sequence_length"), ("--vocab-size", "vocab_size"))
"""The flags that shape the Transformer's synthetic tokens, and their destinations."""


def refuse_token_flags_without_tokens(args, transformer, data=None):
    """Refuses `--sequence-length` and `--vocab-size` when no synthetic tokens are measured.

    Args:
        args: the parsed flags (None where a flag was not given).
        transformer: whether a Transformer is measured (else only the CNN's images).
        data: the Transformer's `--data` ("embedded": the recipe's task, not
            synthetic tokens; None or "synthetic": the tokens).

    Raises:
        ValueError: naming the flags given for data they do not shape.

    Example:

    >>> args = argparse.Namespace(sequence_length=64, vocab_size=None)
    >>> refuse_token_flags_without_tokens(args, transformer=False)
    Traceback (most recent call last):
    ValueError: --sequence-length shapes the Transformer's synthetic tokens, not the CNN's images: drop it.
    """
    given = [flag for flag, dest in TOKEN_FLAGS if getattr(args, dest) is not None]
    measured = ("the CNN's images" if not transformer
                else "the embedded task" if data == "embedded" else None)
    if given and measured:
        verb, pronoun = ("shape", "them") if len(given) > 1 else ("shapes", "it")
        raise ValueError(f"{' and '.join(given)} {verb} the Transformer's synthetic tokens, "
                         f"not {measured}: drop {pronoun}.")


def split_transformer_parser(prog, description, split_flag, split_default, split_help):
    """The flags of a benchmark that splits the Transformer over devices (`tfdist bench
    model-parallel`, `tensor-parallel`): `add_transformer_flags`, the split's own
    flag (an int >= 2), and `add_round_flags` with these benchmarks' defaults.

    Args:
        prog, description: the parser's.
        split_flag, split_default, split_help: the split's flag, e.g. "--shards".

    Example:

    >>> parser = split_transformer_parser("tfdist bench tensor-parallel", "...", "--shards", 2,
    ...                                   "K devices of the split setting (default 2)")
    >>> parser.parse_args(["--quick"]).shards
    2
    """
    result = argparse.ArgumentParser(prog=prog, description=description)
    add_transformer_flags(result)
    result.add_argument(split_flag, type=int_at_least(2), default=split_default, help=split_help)
    add_round_flags(result, rounds=3, steps=10, sequence_length=64, vocab_size=512,
                    quick="tiny data, batch 8, 1 round of 2 steps (for tests); flags given "
                          "with it win")
    return result
