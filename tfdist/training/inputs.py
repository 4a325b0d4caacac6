"""Turning what the user passes as data into a distributed dataset.

Three forms are accepted, whatever the strategy:

* a `tf.distribute.DistributedDataset` (already distributed by the caller);
* a function `dataset_fn(input_context) -> tf.data.Dataset` batched with the
  *per-replica* batch size (`input_context.get_per_replica_batch_size(B)`),
  given to `strategy.distribute_datasets_from_function`;
* a `tf.data.Dataset` batched with the *global* batch size, split across
  replicas (and workers) by `strategy.experimental_distribute_dataset`.

Elements are `(x, y)` or `(x, y, sample_weight)` for training and evaluation,
and `x`, `(x,)`, or any of the above for prediction.
"""

import keras
import tensorflow as tf

ALLOWED_INPUTS = (
    "a tf.data.Dataset batched with the global batch size, "
    "a function dataset_fn(input_context) -> tf.data.Dataset batched per replica, "
    "or a tf.distribute.DistributedDataset"
)


def distribute(strategy, data, argument="x"):
    """Returns `data` as a distributed dataset of `strategy`.

    Args:
        strategy: the `tf.distribute.Strategy` to distribute over.
        data: one of the three accepted forms (see module docstring).
        argument: name of the caller's argument, used in error messages.

    Returns:
        A `tf.distribute.DistributedDataset` (a plain `tf.data.Dataset` under
        the default strategy).

    Raises:
        TypeError: `data` is none of the accepted forms (numpy arrays, lists
            and generators must be wrapped in a `tf.data.Dataset` first).

    Example:

    >>> ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)  # global batch
    >>> dist = distribute(strategy, ds)
    """
    if isinstance(data, tf.distribute.DistributedDataset):
        return data
    if isinstance(data, tf.data.Dataset):
        return strategy.experimental_distribute_dataset(data)
    if callable(data):
        return strategy.distribute_datasets_from_function(data)
    raise TypeError(
        f"{argument} must be {ALLOWED_INPUTS}; got {type(data).__name__}. "
        "Wrap arrays with tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch)."
    )


def unpack(data, need_targets, argument="x"):
    """Splits one batch into `(x, y, sample_weight)` like Keras does.

    Args:
        data: a batch element: `(x,)`, `(x, y)`, `(x, y, sample_weight)` or
            a bare `x`.
        need_targets: raise when `y` is missing (training, evaluation).
        argument: name of the caller's argument, used in error messages.

    Returns:
        The tuple `(x, y, sample_weight)`; missing parts are None.

    Raises:
        ValueError: `need_targets` and the batch has no `y`.

    Example:

    >>> x, y, sw = unpack((features, labels), need_targets=True)
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if need_targets and y is None:
        raise ValueError(
            f"The elements of {argument} have no targets: training and evaluation "
            "need (x, y) or (x, y, sample_weight) elements."
        )
    return x, y, sample_weight


def per_replica_spec(element_spec):
    """Returns the element spec of one replica's batch (drops `PerReplicaSpec`).

    Args:
        element_spec: `element_spec` of a dataset or distributed dataset.

    Example:

    >>> per_replica_spec(dist_dataset.element_spec)
    (TensorSpec(shape=(None, 4), ...), TensorSpec(shape=(None,), ...))
    """
    def one(spec):
        value_specs = getattr(spec, "_value_specs", None)
        return value_specs[0] if value_specs else spec

    return tf.nest.map_structure(one, element_spec)
