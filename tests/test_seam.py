"""The seam (`tfdist.seam`): each private TensorFlow/Keras hook tfdist relies
on is installed and does what it says, so an upgrade that moves one fails here
by name instead of deep inside a run."""

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops

import tfdist.data.input_pipeline  # noqa: F401 - importing tfdist's input code installs the hook
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


def test_join_predicted_batches_gives_numpy_for_dense_and_ragged_for_ragged_outputs():
    import numpy as np

    dense = seam.join_predicted_batches([tf.ones([2, 3]), tf.zeros([1, 3])])
    assert isinstance(dense, np.ndarray) and dense.tolist() == [[1.0] * 3] * 2 + [[0.0] * 3]
    ragged = seam.join_predicted_batches([tf.ragged.constant([[1], [2, 3]]),
                                          tf.ragged.constant([[4, 5, 6]])])
    assert isinstance(ragged, tf.RaggedTensor)
    assert ragged.to_list() == [[1], [2, 3], [4, 5, 6]]


def test_metrics_in_keras_order_follows_metrics_names():
    import keras

    inputs = keras.Input((2,))
    model = keras.Model(inputs, {"a": keras.layers.Dense(1, name="a")(inputs),
                                 "b": keras.layers.Dense(1, name="b")(inputs)})
    model.compile("sgd", loss={"a": "mse", "b": "mae"}, metrics={"b": ["mae"]})
    x = np.zeros((4, 2), "float32")
    y = {"a": np.zeros((4, 1), "float32"), "b": np.ones((4, 1), "float32")}
    logs = model.evaluate(x, y, verbose=0, return_dict=True)
    shuffled = dict(reversed(list(logs.items())))
    expected = model.evaluate(x, y, verbose=0)
    for got, want in zip(seam.metrics_in_keras_order(model, shuffled), expected, strict=True):
        assert got == want


def test_checkpoint_state_parses_the_index_tensorflow_writes(tmp_path):
    from google.protobuf import text_format

    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=2)
    manager.save()
    manager.save()
    state = seam.checkpoint_state()
    text_format.Parse((tmp_path / "checkpoint").read_text(), state)
    assert [p.rsplit("/", 1)[-1] for p in state.all_model_checkpoint_paths] == ["ckpt-1", "ckpt-2"]
