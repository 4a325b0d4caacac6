"""tfdist.tf_logging: TensorFlow's C++ logging quiet by default, shown when asked for."""

import os
import subprocess
import sys

import pytest

from tfdist.tf_logging import import_tensorflow, keep_line, tf_log_level

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
    code = ("from tfdist.tf_logging import import_tensorflow; import sys; "
            f"tf = import_tensorflow({level!r}); tf.config.list_logical_devices(); "
            "print('imported', tf.__version__, file=sys.stderr)")
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_is_quiet_by_default_and_says_everything_at_level_0():
    quiet = _import_in_fresh_process(None)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.splitlines() == [f"imported {quiet.stderr.split()[1]}"], quiet.stderr
    loud = _import_in_fresh_process(0)
    assert loud.returncode == 0, loud.stderr
    assert PREAMBLE in loud.stderr and "I0000" in loud.stderr


def test_an_already_imported_tensorflow_is_returned_as_it_is():
    import tensorflow

    assert import_tensorflow() is tensorflow
