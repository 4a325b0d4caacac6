"""The seam (`tfdist.seam`): each private TensorFlow/Keras hook tfdist relies
on is installed and does what it says, so an upgrade that moves one fails here
by name instead of deep inside a run."""

import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops

import tfdist.data  # noqa: F401 - importing tfdist's input code installs the hook
from tfdist import seam


def _per_device_datasets(distributed_iterator):
    """The per-device datasets behind a MirroredStrategy input iterator."""
    found = []
    for worker_iterator in distributed_iterator._iterators:  # noqa: SLF001 - inspecting TF
        device_iterators = worker_iterator._iterator._device_iterators  # noqa: SLF001
        found += [iterator._dataset for iterator in device_iterators]  # noqa: SLF001
    return found


def test_quiet_device_iterators_is_installed_once_by_importing_tfdist_data():
    assert hasattr(multi_device_iterator_ops._create_device_dataset, "tfdist_wraps")
    assert seam.install_quiet_device_iterators() is False  # already installed


def test_per_device_datasets_run_without_autotune_and_the_users_pipeline_keeps_it():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dataset = tf.data.Dataset.range(64).map(
        lambda x: tf.cast(x, tf.float32), num_parallel_calls=tf.data.AUTOTUNE).batch(8)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    first = next(iterator)
    per_device = _per_device_datasets(iterator)
    assert len(per_device) == 2
    assert [d.options().autotune.enabled for d in per_device] == [False, False]
    assert dataset.options().autotune.enabled is not False  # the user's options are untouched
    values = [t.numpy().tolist() for t in strategy.experimental_local_results(first)]
    assert values == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]  # data still flows per replica


def test_wait_for_peers_at_exit_returns_at_once_without_a_coordination_service():
    import time

    start = time.monotonic()
    assert seam.wait_for_peers_at_exit(timeout_seconds=5) is False  # one process, no service
    assert time.monotonic() - start < 1.0
