"""The suite's own set-up (tests/conftest.py): the processes the tests start see no
matplotlib, as in tfdist's default install, while the tests themselves do, and
read tfdist's bytecode instead of compiling it; the tf.data iterators a test
leaves alive are collected after it, once, while young
(tests/helpers/young_iterators.py)."""

import importlib.util
import os
import subprocess
import sys
import weakref

import pytest
from helpers.paths import REPO_ROOT, WITHOUT_BENCH_EXTRA
from helpers.young_iterators import YoungIterators


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


def test_child_processes_read_tfdist_bytecode_without_writing_any():
    # As on the project's test machines: no process writes bytecode on import.
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run([sys.executable, "-v", "-c", "import tfdist.recipes.recipe_runner"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    source = os.path.join(REPO_ROOT, "tfdist", "recipes", "recipe_runner.py")
    # What `python -v` says when an import reads a source's up-to-date bytecode.
    read = f"# {importlib.util.cache_from_source(source)} matches {source}"
    assert read in result.stderr.splitlines(), [line for line in result.stderr.splitlines()
                                                if "recipe_runner" in line]


@pytest.fixture
def watcher():
    """A `YoungIterators` of its own, with automatic collection off in between,
    so only its own collections free cycles."""
    import gc

    own = YoungIterators()
    own.watch()
    gc.disable()
    try:
        yield own
    finally:
        gc.enable()
        own.unwatch()


def _autotuned_pipeline():
    import tensorflow as tf

    return tf.data.Dataset.range(100).map(lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE
                                          ).prefetch(tf.data.AUTOTUNE)


def _catch_an_error_raised_while_iterating():
    """Iterates an autotuned pipeline part way, raises, catches it as a test does;
    returns a weak reference to the iterator."""
    def train():
        iterator = iter(_autotuned_pipeline())
        next(iterator)
        observed.append(weakref.ref(iterator))
        raise RuntimeError("the loss is nan")

    observed = []
    with pytest.raises(RuntimeError, match="nan") as caught:
        train()
    assert "nan" in str(caught.value)
    return observed[0]


def test_an_iterator_a_caught_error_holds_is_freed_after_its_test(watcher):
    iterator = _catch_an_error_raised_while_iterating()
    # Still alive after its test frame returned: held in a reference cycle.
    assert iterator() is not None
    assert watcher.collect_if_left_alive(module_ends=False)
    assert iterator() is None
    assert [why for why, _ in watcher.collections] == ["a test"]


def test_a_test_that_leaves_no_iterator_alive_costs_no_collection(watcher):
    iterator = iter(_autotuned_pipeline())
    next(iterator)
    seen = weakref.ref(iterator)
    del iterator
    assert seen() is None
    assert not watcher.collect_if_left_alive(module_ends=False)
    assert not watcher.collect_if_left_alive(module_ends=True)
    assert watcher.collections == []


def test_an_iterator_held_on_purpose_costs_one_collection_and_one_at_its_modules_end(watcher):
    held = iter(_autotuned_pipeline())
    assert watcher.collect_if_left_alive(module_ends=False)      # made by this test: collect once
    assert not watcher.collect_if_left_alive(module_ends=False)  # held: not again per test
    assert watcher.collect_if_left_alive(module_ends=True)       # its module ends: once more
    assert not watcher.collect_if_left_alive(module_ends=True)   # outlived it: the session's
    assert len(watcher.collections) == 2
    assert next(held).numpy() == 0


def test_the_multi_device_iterator_of_a_distributed_dataset_is_watched(watcher):
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(4))
    iterator = iter(dataset)
    kinds = [type(made).__name__ for made in watcher.made_and_alive()]
    assert kinds.count("OwnedMultiDeviceIterator") == 1, kinds
    assert watcher.collect_if_left_alive(module_ends=False)
    assert sorted(strategy.experimental_local_results(next(iterator))[0].numpy()) == [0, 1]
