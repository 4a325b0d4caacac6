"""TensorFlow's own logging, quiet unless asked for.

TensorFlow's C++ runtime logs through absl: at import it prints a block of
`I0000 ...` lines (oneDNN, CUDA stubs, CPU features) before its log level is
even read, and later `W`/`E` lines (such as `failed call to cuInit` on a
machine without a GPU) that read like failures and splice into progress bars.
tfdist's entry points call `import_tensorflow()` before anything else imports
TensorFlow: it sets `TF_CPP_MIN_LOG_LEVEL` (3, nothing, by default; an
explicit environment value or a `--tf-log-level` flag is respected), and
holds back the import-time block, replaying only lines at or above the level
and anything that is not TensorFlow's log output (a Python warning, a crash
message).

Levels are TensorFlow's: 0 everything, 1 warnings and errors, 2 errors,
3 nothing.

Example:

    from tfdist.tf_logging import import_tensorflow
    tf = import_tensorflow()          # quiet
    tf = import_tensorflow(level=0)   # everything TensorFlow says
"""

import os
import re
import sys
import tempfile

LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = 3
TF_LOG_LEVELS = (0, 1, 2, 3)

# absl's line format: severity letter, MMDD, time, thread, file:line].
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:[\d.]+\s+\d+ [^ \]]+:\d+\] ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
# Lines of TensorFlow's import-time output that carry no severity letter.
_ABSL_PREAMBLE = ("WARNING: All log messages before absl::InitializeLog() is called",
                  "To enable the following instructions:")


def tf_log_level(requested=None, environ=None):
    """The TensorFlow log level in force: the request, else the environment's, else quiet.

    Args:
        requested: a level from a flag (0-3), or None.
        environ: the environment to read (default `os.environ`).

    Returns:
        An int in `TF_LOG_LEVELS`.

    Raises:
        ValueError: `requested` or the environment's value is not 0-3.

    Example:

    >>> tf_log_level(environ={})
    3
    >>> tf_log_level(environ={"TF_CPP_MIN_LOG_LEVEL": "1"})
    1
    """
    environ = os.environ if environ is None else environ
    if requested is None:
        text = environ.get(LOG_LEVEL_ENV)
        if text is None or not text.strip():
            return QUIET_LEVEL
        source = f"${LOG_LEVEL_ENV}={text!r}"
        requested = text.strip()
    else:
        source = f"TensorFlow log level {requested!r}"
    try:
        level = int(requested)
    except (TypeError, ValueError):
        level = None
    if level not in TF_LOG_LEVELS:
        raise ValueError(f"{source} is not a TensorFlow log level; use 0 (everything), "
                         "1 (warnings and errors), 2 (errors) or 3 (nothing).")
    return level


def add_tf_log_level_flag(parser):
    """Adds `--tf-log-level {0,1,2,3}` (default None: the environment's, else quiet) to an
    `argparse` parser, for commands that import TensorFlow through `import_tensorflow`.

    Example:

    >>> parser = argparse.ArgumentParser()
    >>> add_tf_log_level_flag(parser)
    >>> parser.parse_args(["--tf-log-level", "0"]).tf_log_level
    0
    """
    parser.add_argument("--tf-log-level", type=int, choices=TF_LOG_LEVELS, default=None,
                        help="TensorFlow's C++ log level: 0 everything, 1 warnings, 2 errors, "
                             f"3 nothing (default: ${LOG_LEVEL_ENV}, else {QUIET_LEVEL})")


def keep_line(line, level):
    """Whether a line TensorFlow printed at import is shown at `level`.

    absl log lines are kept when their severity is at least `level`; the
    preamble lines that come with them are kept only at level 0; any other
    text (a Python warning, an error message) is always kept.

    Example:

    >>> keep_line("W0000 00:00:1.5   42 dataset.cc:997] Input ...", 2)
    False
    >>> keep_line("UserWarning: something", 3)
    True
    """
    match = _ABSL_LINE.match(line)
    if match:
        return _SEVERITY[match.group(1)] >= level
    if line.startswith(_ABSL_PREAMBLE):
        return level == 0
    return True


def import_tensorflow(level=None):
    """Imports TensorFlow with its C++ logging set to `level` (quiet by default).

    Call it before anything imports TensorFlow; once TensorFlow is imported
    the level can no longer change, and the call only returns the module.

    Args:
        level: 0-3, or None for `$TF_CPP_MIN_LOG_LEVEL` when set, else 3.

    Returns:
        The `tensorflow` module.

    Raises:
        ValueError: a bad level (the valid ones are named).

    Example:

    >>> tf = import_tensorflow()
    >>> tf.constant(1).numpy()
    1
    """
    level = tf_log_level(level)
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ[LOG_LEVEL_ENV] = str(level)
    if level == 0:
        import tensorflow
        return tensorflow
    with tempfile.TemporaryFile(mode="w+b") as held:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        failed = True
        try:
            import tensorflow
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", "replace")
            shown = text if failed else "".join(
                line for line in text.splitlines(keepends=True) if keep_line(line, level))
            if shown:
                sys.stderr.write(shown)
                sys.stderr.flush()
    return tensorflow
