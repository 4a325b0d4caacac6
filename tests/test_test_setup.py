"""The suite's own set-up (tests/conftest.py): the processes the tests start see no
matplotlib, as in tfdist's default install, while the tests themselves do; the
collection behind the `frees_caught_training_errors` fixture frees the tf.data
iterators a caught error keeps (tests/helpers/caught_errors.py)."""

import importlib.util
import os
import subprocess
import sys

from helpers.paths import WITHOUT_BENCH_EXTRA


def test_child_processes_start_without_matplotlib():
    result = subprocess.run([sys.executable, "-c", "import matplotlib"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "ModuleNotFoundError" in result.stderr, result.stderr
    assert "tests/helpers/without_bench_extra" in result.stderr, result.stderr


def test_the_test_process_keeps_matplotlib_for_the_plot_tests():
    assert WITHOUT_BENCH_EXTRA not in sys.path
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == WITHOUT_BENCH_EXTRA
    spec = importlib.util.find_spec("matplotlib")
    assert spec is not None and WITHOUT_BENCH_EXTRA not in spec.origin, spec


def _catch_an_error_raised_while_iterating():
    """Iterates an autotuned pipeline part way, raises, catches it as a test does;
    returns a weak reference to the iterator."""
    import weakref

    import pytest
    import tensorflow as tf

    def train():
        dataset = tf.data.Dataset.range(100).map(lambda x: x * 2,
                                                 num_parallel_calls=tf.data.AUTOTUNE)
        iterator = iter(dataset.prefetch(tf.data.AUTOTUNE))
        next(iterator)
        observed.append(weakref.ref(iterator))
        raise RuntimeError("the loss is nan")

    observed = []
    with pytest.raises(RuntimeError, match="nan") as caught:
        train()
    assert "nan" in str(caught.value)
    return observed[0]


def test_an_iterator_a_caught_error_holds_is_freed_by_the_fixtures_collection():
    import gc

    from helpers.caught_errors import free_what_caught_errors_hold

    gc.disable()  # no automatic collection between the catch and the check
    try:
        iterator = _catch_an_error_raised_while_iterating()
        # Still alive after its test frame returned: held in a reference cycle.
        assert iterator() is not None
        free_what_caught_errors_hold()
        assert iterator() is None
    finally:
        gc.enable()
