"""`tfdist doctor`'s oneDNN line: on or off, what decided it, and the way to change it."""

import pytest

from tfdist.runtime.onednn import ONEDNN_ENV, describe_onednn


@pytest.mark.parametrize("enabled, environ, expected", [
    (True, {}, "on (TensorFlow's default on this CPU; TF_ENABLE_ONEDNN_OPTS=0 turns it off)"),
    (False, {}, "off (TensorFlow's default on CPUs without AVX512-VNNI, AVX512-BF16 or AMX; "
                "TF_ENABLE_ONEDNN_OPTS=1 turns it on)"),
    (True, {ONEDNN_ENV: "1"}, "on (TF_ENABLE_ONEDNN_OPTS=1)"),
    (False, {ONEDNN_ENV: "0"}, "off (TF_ENABLE_ONEDNN_OPTS=0)"),
], ids=["cpu default on", "cpu default off", "env on", "env off"])
def test_the_line_names_the_state_and_what_decided_it(enabled, environ, expected):
    assert describe_onednn(enabled, environ) == expected


def test_without_an_answer_it_asks_this_process_tensorflow():
    from tfdist import seam

    line = describe_onednn(environ={})
    assert line.startswith("on (" if seam.onednn_enabled() else "off ("), line
