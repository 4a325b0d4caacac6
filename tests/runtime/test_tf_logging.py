"""tfdist.runtime.tf_logging: TensorFlow's C++ logging quiet by default, shown when asked for."""

import io
import os
import subprocess
import sys

import pytest

from tfdist.launch.output import Sink
from tfdist.runtime.tf_logging import (WorkerLineFilter, import_tensorflow, keep_line, keep_worker_line,
                               tf_log_level, worker_stderr_sink)

INFO = ("I0000 00:00:1795408920.439815    6466 port.cc:153] oneDNN custom operations are on.")
ERROR = ("E0000 00:00:1795408922.883809    6466 cuda_platform.cc:52] failed call to cuInit: "
         "UNKNOWN ERROR (303)")
PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def test_level_is_quiet_unless_the_environment_or_a_request_says_otherwise():
    assert tf_log_level(environ={}) == 3
    assert tf_log_level(environ={"TF_CPP_MIN_LOG_LEVEL": " 1 "}) == 1
    assert tf_log_level(0, environ={"TF_CPP_MIN_LOG_LEVEL": "3"}) == 0


@pytest.mark.parametrize("requested, environ, fragment", [
    (None, {"TF_CPP_MIN_LOG_LEVEL": "loud"}, "$TF_CPP_MIN_LOG_LEVEL='loud'"),
    (7, {}, "TensorFlow log level 7"),
])
def test_bad_levels_name_the_value_and_the_allowed_ones(requested, environ, fragment):
    with pytest.raises(ValueError) as error:
        tf_log_level(requested, environ=environ)
    assert fragment in str(error.value) and "0 (everything)" in str(error.value)


def test_lines_are_kept_by_severity_and_other_text_always():
    assert [keep_line(INFO, level) for level in range(4)] == [True, False, False, False]
    assert [keep_line(ERROR, level) for level in range(4)] == [True, True, True, False]
    assert [keep_line(PREAMBLE, level) for level in range(4)] == [True, False, False, False]
    assert keep_line("Fatal Python error: Segmentation fault", 3)


def _import_in_fresh_process(level):
    code = ("from tfdist.runtime.tf_logging import import_tensorflow; import sys; "
            f"tf = import_tensorflow({level!r}); tf.config.list_logical_devices(); "
            "print('imported', tf.__version__, file=sys.stderr)")
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_says_everything_at_level_0():
    """(Quiet by default: see the tfdist-first program below, the same filter.)"""
    loud = _import_in_fresh_process(0)
    assert loud.returncode == 0, loud.stderr
    assert PREAMBLE in loud.stderr and "I0000" in loud.stderr


def test_an_already_imported_tensorflow_is_returned_as_it_is():
    import tensorflow

    assert import_tensorflow() is tensorflow


# The start-up lines TensorFlow's C++ runtime prints on a CPU machine (the
# issue's list); none may reach a program that imports tfdist first.
STARTUP_LINES = ("All log messages before absl::InitializeLog()", "oneDNN custom operations",
                 "Could not find cuda drivers", "cpu_feature_guard", "failed call to cuInit",
                 "XLA service", "I0000", "E0000", "W0000")
TF_PROGRAM = ("import tfdist, tensorflow as tf, sys; tf.constant(1.0) + 1; "
              "tf.function(lambda x: 2 * x, jit_compile=True)(tf.constant(1.0)); "
              "print('done', file=sys.stderr)")


def _run_program(code, level=None):
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=180)


def test_a_program_importing_tfdist_first_sees_no_tensorflow_startup_lines():
    quiet = _run_program(TF_PROGRAM)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.splitlines() == ["done"], quiet.stderr
    asked = _run_program(TF_PROGRAM, level="0")  # the user's explicit choice is honoured
    assert asked.returncode == 0, asked.stderr
    assert PREAMBLE in asked.stderr and "XLA service" in asked.stderr


def test_worker_lines_are_filtered_only_when_they_are_tensorflows():
    absl_python = "I1126 13:53:09.123456 140 train.py:12] step 3"  # absl-py: a real date
    assert [keep_worker_line(INFO, level) for level in range(4)] == [True, False, False, False]
    assert [keep_worker_line(ERROR, level) for level in range(4)] == [True, True, True, False]
    assert [keep_worker_line(PREAMBLE, level) for level in range(4)] == [True, False, False,
                                                                          False]
    assert all(keep_worker_line(absl_python, level) for level in range(4))
    assert keep_worker_line("Traceback (most recent call last):", 3)


def test_the_worker_filter_keeps_the_label_and_everything_at_level_0():
    out = io.StringIO()
    sink = Sink(out)
    assert worker_stderr_sink(sink, "[worker 0] ", {"TF_CPP_MIN_LOG_LEVEL": "0"}) is sink
    assert worker_stderr_sink(sink, "[worker 0] ", {"TF_CPP_MIN_LOG_LEVEL": "x"}) is sink
    filtered = worker_stderr_sink(sink, "[worker 0] ", {})
    assert isinstance(filtered, WorkerLineFilter) and filtered.level == 3
    for line in (INFO, ERROR, PREAMBLE, "loss 0.3"):
        filtered.write_line("[worker 0] " + line)
    assert out.getvalue() == "[worker 0] loss 0.3\n"
