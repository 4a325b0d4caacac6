"""The `tfdist` command: one entry point for the recipes and tools.

    tfdist transformer --strategy mirrored --devices 2
    tfdist launch --workers 2 -- tfdist transformer --strategy multi_worker_mirrored
    tfdist doctor
    tfdist --version

Each sub-command is the module of the same name run with `python -m`. This
module imports no TensorFlow: `--help` and `--version` answer at once, and
each command imports TensorFlow itself (through
`tfdist.runtime.tf_logging.import_tensorflow`, quiet unless asked).
"""

import importlib
import sys

COMMANDS = {
    "transformer": ("tfdist.recipes.transformer", "train the Transformer recipe"),
    "cnn": ("tfdist.recipes.cnn", "train the CNN (ResNet) recipe"),
    "translation": ("tfdist.recipes.translation",
                    "train the encoder-decoder translation recipe (BLEU, chrF)"),
    "translate": ("tfdist.recipes.translate",
                  "translate sentences with a trained translation run (--model-dir)"),
    "launch": ("tfdist.launch", "run a command as N local workers (+ M ps tasks)"),
    "bench": ("tfdist.bench", "benchmark and scaling report"),
    "doctor": ("tfdist.cli.doctor", "versions, build, devices, auto choices; checks all-reduce"),
}


def usage():
    """The command list shown for `tfdist --help` or a bad sub-command.

    Example:

    >>> print(usage().splitlines()[0])
    usage: tfdist COMMAND [ARGS...]
    """
    lines = ["usage: tfdist COMMAND [ARGS...]", "       tfdist --version", "", "commands:"]
    lines += [f"  {name:<14} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "options:", f"  {'-h, --help':<14} show this list",
              f"  {'-V, --version':<14} show tfdist's version and the TensorFlow and Keras it finds",
              "", "Run `tfdist COMMAND --help` for a command's flags."]
    return "\n".join(lines)


def version_text():
    """The text of `tfdist --version`, read from package metadata (no TensorFlow import).

    Example:

    >>> print(version_text())
    tfdist 0.1.0
    TensorFlow 2.21.0, Keras 3.15.1, Python 3.11.7
    """
    from tfdist.cli.doctor import format_version

    return format_version()


def main(argv=None):
    """Dispatches `tfdist COMMAND ARGS...` to the command's `main(ARGS)`.

    Example:

    >>> main(["transformer", "--help"])  # prints the recipe's flags
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(version_text())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tfdist: unknown command {name!r}. Valid commands: {', '.join(COMMANDS)}.\n\n{usage()}",
              file=sys.stderr)
        return 2
    module_name = COMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        print(f"tfdist: command {name!r} is not available in this version.", file=sys.stderr)
        return 2
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
