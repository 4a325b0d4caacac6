"""The `tfdist` command: one entry point for the recipes and tools.

    tfdist transformer --strategy mirrored --devices 2
    tfdist launch --workers 2 -- tfdist transformer --strategy multi_worker_mirrored

Each sub-command is the module of the same name run with `python -m`.
"""

import importlib
import sys

COMMANDS = {
    "transformer": ("tfdist.recipes.transformer", "train the Transformer recipe"),
    "cnn": ("tfdist.recipes.cnn", "train the CNN (ResNet) recipe"),
    "launch": ("tfdist.launch", "run a command as N local workers"),
    "bench": ("tfdist.bench", "benchmark and scaling report"),
}


def usage():
    """The command list shown for `tfdist --help` or a bad sub-command."""
    lines = ["usage: tfdist COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<12} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run `tfdist COMMAND --help` for a command's flags."]
    return "\n".join(lines)


def main(argv=None):
    """Dispatches `tfdist COMMAND ARGS...` to the command's `main(ARGS)`.

    Example:

    >>> main(["transformer", "--help"])  # prints the recipe's flags
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
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
