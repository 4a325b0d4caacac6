"""The seam: where tfdist reaches into TensorFlow's or Keras's private parts.

Everything tfdist needs from a private module or attribute belongs here, one
small function per need, each saying why the public API does not serve and
what breaks if the internal moves. A TensorFlow or Keras upgrade then means
reading this module (and its test, `tests/test_seam.py`), not grepping the
package.

Example:

    from tfdist import seam

    seam.install_quiet_device_iterators()   # idempotent; tfdist.data and tfdist.training call it
"""

import threading

_installed = set()
_lock = threading.Lock()


def install_quiet_device_iterators():
    """Turns tf.data autotuning off in the per-device datasets tf.distribute builds.

    A multi-device input iterator (`MultiDeviceIterator`, what
    `strategy.experimental_distribute_dataset` and
    `strategy.distribute_datasets_from_function` iterate with under
    `MirroredStrategy` and `MultiWorkerMirroredStrategy`) wraps each device's
    share of the input in a small dataset of its own: a generator reading the
    host pipeline and a fixed one-element prefetch. TensorFlow gives that
    dataset default options, so each per-device iterator runs a tf.data
    autotune thread, although nothing in it can be tuned. Deleting the
    iterator (at the end of `fit`, at a preemption stop, at exit) waits for
    that thread, which sleeps with a period that doubles up to 60 s: measured
    on TF 2.21, 0-60 s of idle time after the last step of multi-device runs
    (about 10 s in 3 of 7 deletions after 400 steps; none in 7 with this
    function installed). The user's own pipeline keeps its options; only the
    per-device wrapper loses a tuner it has no use for.

    Private: `tensorflow.python.data.ops.multi_device_iterator_ops.
    _create_device_dataset` (no public hook reaches those datasets;
    `tf.distribute.InputOptions` does not carry tf.data options). If it
    moves, this function raises at import of `tfdist.data`, and
    `tests/test_seam.py` names the missing attribute.

    Returns:
        True when installed by this call, False when it already was.

    Example:

    >>> install_quiet_device_iterators()
    False
    """
    with _lock:
        if "quiet_device_iterators" in _installed:
            return False
        import tensorflow as tf
        from tensorflow.python.data.ops import multi_device_iterator_ops

        create = multi_device_iterator_ops._create_device_dataset  # noqa: SLF001 - the seam

        def create_without_autotune(*args, **kwargs):
            dataset = create(*args, **kwargs)
            options = tf.data.Options()
            options.autotune.enabled = False
            return dataset.with_options(options)

        create_without_autotune.tfdist_wraps = create
        multi_device_iterator_ops._create_device_dataset = create_without_autotune  # noqa: SLF001
        _installed.add("quiet_device_iterators")
        return True


def wait_for_peers_at_exit(timeout_seconds=20.0, name="tfdist/exit"):
    """Multi-worker runs: waits until every worker reached this point, or `timeout_seconds`.

    The chief hosts TensorFlow's coordination service. When it exits first,
    a worker still finishing its own stop keeps sending heartbeats to a
    closed port for ~10 s (`Failed to send RPC to coordination service`,
    `Connection refused`) before it leaves. A barrier just before exit lets
    the chief leave only once every worker is done with the service. A peer
    that is gone or late is not waited for beyond the deadline.

    Private: `tensorflow.python.eager.context.context().wait_at_barrier`
    (the coordination service's barrier has no public API in TF 2.21).

    Args:
        timeout_seconds: the longest wait (keep it below the grace period a
            cluster manager gives between SIGTERM and SIGKILL).
        name: the barrier's id; every worker must use the same one.

    Returns:
        True when every worker arrived, False when the service is not
        running (a single-process run) or the wait failed or timed out.

    Example:

    >>> wait_for_peers_at_exit(timeout_seconds=5)
    False
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    if not ctx.coordination_service:
        return False
    try:
        ctx.wait_at_barrier(name, int(timeout_seconds * 1000))
    except Exception:  # noqa: BLE001 - tf.errors.OpError: a peer is gone or late; leave anyway
        return False
    return True


def join_predicted_batches(outputs):
    """Joins `predict`'s per-batch outputs along the batch axis exactly as Keras does.

    Numpy arrays, or a `tf.RaggedTensor` for a ragged output (and for an output
    whose non-batch shape differs between batches), so that `Trainer.predict`
    returns what `keras.Model.predict` returns.

    Private: `keras.src.backend.tensorflow.trainer.potentially_ragged_concat`
    and `convert_to_np_if_not_ragged` (Keras's own `predict` joins with them;
    no public API does).

    Args:
        outputs: a list of per-batch output structures (tensors).

    Example:

    >>> join_predicted_batches([tf.ones([2, 3]), tf.ones([1, 3])]).shape
    (3, 3)
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow.trainer import (convert_to_np_if_not_ragged,
                                                      potentially_ragged_concat)

    joined = tf.nest.map_structure(lambda *parts: potentially_ragged_concat(list(parts)),
                                   *outputs)
    return tf.nest.map_structure(convert_to_np_if_not_ragged, joined)


def metrics_in_keras_order(model, logs):
    """`evaluate`'s values as the list (or lone float) Keras returns without `return_dict`.

    In `model.metrics_names` order: the loss, each output's loss, then the
    compiled metrics.

    Private: `keras.Model._flatten_metrics_in_order` (what Keras's own
    `evaluate` calls; no public API orders the logs).

    Example:

    >>> metrics_in_keras_order(model, {"loss": 0.5, "accuracy": 0.75})
    [0.5, 0.75]
    """
    return model._flatten_metrics_in_order(logs)  # noqa: SLF001 - the seam


def checkpoint_state():
    """An empty `CheckpointState` protocol buffer: the format of TensorFlow's
    `checkpoint` index file, parsed by tfdist's backup index reader.

    Private: `tensorflow.python.training.checkpoint_state_pb2` (the message
    has no public export).

    Example:

    >>> checkpoint_state().all_model_checkpoint_paths
    []
    """
    from tensorflow.python.training import checkpoint_state_pb2

    return checkpoint_state_pb2.CheckpointState()
