"""TensorFlow's own logging, quiet unless asked for.

TensorFlow's C++ runtime logs through absl: at import it prints a block of
`I0000 ...` lines (oneDNN, CUDA stubs, CPU features) before its log level is
even read, and later `W`/`E`/`I` lines (`failed call to cuInit` on a machine
without a GPU, `XLA service ... initialized`) that read like failures and
splice into progress bars. `TF_CPP_MIN_LOG_LEVEL` set before TensorFlow is
imported silences the later lines, but not the import-time block: absl writes
that to stderr before TensorFlow applies the level ("All log messages before
absl::InitializeLog() is called are written to STDERR"), and no environment
variable reaches it. So tfdist

* holds back stderr while TensorFlow is imported and replays only the lines
  at or above the level, and anything that is not TensorFlow's log output (a
  Python warning, a crash message);
* sets `TF_CPP_MIN_LOG_LEVEL` (3, nothing, by default) for the rest of the
  process; an explicit environment value, or a `--tf-log-level` flag, is
  respected (0 shows everything, as TensorFlow does by default).

`import tfdist` arranges this for the program's first `import tensorflow`
(`quiet_tensorflow_import`); tfdist's entry points call `import_tensorflow()`.
A program that imports TensorFlow *before* tfdist has printed the block
already, and its later lines follow whatever `TF_CPP_MIN_LOG_LEVEL` was then.
The launcher filters the import-time lines of its workers the same way
(`keep_worker_line`).

Levels are TensorFlow's: 0 everything, 1 warnings and errors, 2 errors,
3 nothing.

Example:

    from tfdist.runtime.tf_logging import import_tensorflow
    tf = import_tensorflow()          # quiet
    tf = import_tensorflow(level=0)   # everything TensorFlow says
"""

import contextlib
import os
import re
import sys
import tempfile

from tfdist.runtime.first_import import FirstImportHook

LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = 3
TF_LOG_LEVELS = (0, 1, 2, 3)

# absl's line format: severity letter, MMDD, time, thread, file:line].
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:[\d.]+\s+\d+ [^ \]]+:\d+\] ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
# TensorFlow's C++ lines: absl's format with the date absl writes before
# absl::InitializeLog() (TensorFlow never calls it): "I0000 00:00:<epoch seconds>".
_TF_CPP_LINE = re.compile(r"^([IWEF])0000 00:00:\d+\.\d+\s+\d+ [^ \]]+:\d+\] ")
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
    return _kept(line, level, _ABSL_LINE)


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
    _IMPORT_HOOK.remove()
    os.environ[LOG_LEVEL_ENV] = str(level)
    with tensorflow_lines_filtered(level):
        import tensorflow
    return tensorflow


@contextlib.contextmanager
def tensorflow_lines_filtered(level):
    """Holds back what is written to stderr (file descriptor 2, so C++ output
    too) inside the block, then writes the lines `keep_line` keeps at `level`;
    everything, unfiltered, if the block raises. Nothing is held at level 0.

    Example:

    >>> with tensorflow_lines_filtered(3):
    ...     import tensorflow
    """
    if level == 0:
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as held:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        failed = True
        try:
            yield
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


def keep_worker_line(line, level):
    """Whether the launcher shows a line from a worker's stderr, at the worker's level.

    Only TensorFlow's own C++ log lines are filtered (absl's format as
    TensorFlow writes it, with the date `0000 00:00`, and the preamble lines
    of its import-time block); they are kept from `level` up, as TensorFlow
    itself keeps the lines it logs after start-up. Anything else a worker
    writes, including Python's `absl.logging` lines (which carry a real
    date), is always shown.

    Example:

    >>> keep_worker_line("I0000 00:00:1795.5  42 cudart_stub.cc:31] Could not find cuda", 3)
    False
    >>> keep_worker_line("I1126 13:53:09.123456 42 train.py:12] step 3", 3)
    True
    """
    return _kept(line, level, _TF_CPP_LINE)


def _kept(line, level, log_line):
    """Log lines matching `log_line` kept from `level` up, the preamble only at
    level 0, anything else always."""
    match = log_line.match(line)
    if match:
        return _SEVERITY[match.group(1)] >= level
    if line.startswith(_ABSL_PREAMBLE):
        return level == 0
    return True


class WorkerLineFilter:
    """Passes a worker's stderr lines on to `sink`, without TensorFlow's C++ lines
    below the worker's level (see `keep_worker_line`), for the launcher.

    Args:
        sink: what receives the kept lines (anything with `write_line(text)`).
        prefix: the worker's label the lines carry, e.g. "[worker 1] ".
        level: the worker's TensorFlow log level (0-3).

    Example:

    >>> import io, sys
    >>> out = WorkerLineFilter(Sink(sys.stderr), "[worker 0] ", 3)
    >>> out.write_line("[worker 0] I0000 00:00:17.5  42 port.cc:153] oneDNN custom operations")
    >>> out.write_line("[worker 0] loss 0.3")
    [worker 0] loss 0.3
    """

    def __init__(self, sink, prefix, level):
        self.sink = sink
        self.prefix = prefix
        self.level = level

    def write_line(self, text):
        """Writes `text` to the sink unless it is a TensorFlow line below the level.

        Example:

        >>> out.write_line("[worker 0] step 1")
        """
        line = text[len(self.prefix):] if text.startswith(self.prefix) else text
        if keep_worker_line(line, self.level):
            self.sink.write_line(text)


def worker_stderr_sink(sink, prefix, environ):
    """The sink for a launched worker's stderr: `sink` itself when the worker's
    environment asks for everything (`TF_CPP_MIN_LOG_LEVEL=0`, or a value that
    is not a level), else a `WorkerLineFilter` at its level.

    Example:

    >>> worker_stderr_sink(err, "[worker 1] ", {"TF_CPP_MIN_LOG_LEVEL": "3"})
    <tfdist.runtime.tf_logging.WorkerLineFilter object at ...>
    """
    level = requested_level(environ)
    if not level:
        return sink
    return WorkerLineFilter(sink, prefix, level)


def requested_level(environ=None):
    """The level an environment asks for: `$TF_CPP_MIN_LOG_LEVEL` when it is a
    valid level, `QUIET_LEVEL` when it is unset, None when it is not a level
    (TensorFlow is then left to read it as it does).

    Example:

    >>> requested_level({}), requested_level({"TF_CPP_MIN_LOG_LEVEL": "0"})
    (3, 0)
    """
    try:
        return tf_log_level(environ=environ)
    except ValueError:
        return None


@contextlib.contextmanager
def quiet_tensorflow_start_up():
    """TensorFlow's import-time lines filtered at the level the environment asks
    for at that moment (`requested_level`), which becomes the process's
    `TF_CPP_MIN_LOG_LEVEL` unless one is set; nothing is filtered when the
    environment's value is not a level. `quiet_tensorflow_import` runs the
    process's first `import tensorflow` inside it.

    Example:

    >>> with quiet_tensorflow_start_up():
    ...     import tensorflow
    """
    level = requested_level()
    if level is None:
        yield
        return
    os.environ.setdefault(LOG_LEVEL_ENV, str(level))
    with tensorflow_lines_filtered(level):
        yield


_IMPORT_HOOK = FirstImportHook("tensorflow", quiet_tensorflow_start_up)


def quiet_tensorflow_import():
    """Makes the process's first `import tensorflow` quiet (see the module
    docstring): `import tfdist` calls it. Does nothing once TensorFlow is
    imported, or with an explicit `TF_CPP_MIN_LOG_LEVEL=0`; an explicit level
    1-3 filters the import-time lines at that level.

    Example:

    >>> import tfdist  # then:
    >>> import tensorflow  # no start-up lines
    """
    if requested_level() != 0:
        _IMPORT_HOOK.install()
