"""Turning what the user passes as data into a distributed dataset.

`fit`, `evaluate` and `predict` take Keras's arguments: numpy arrays (or
lists / dicts of them) with `y`, `batch_size` (the global batch),
`sample_weight`, `class_weight`, `shuffle` and `validation_split` become a
`tf.data.Dataset` of global batches (`tfdist.training.arrays`), which is then
distributed like any other dataset. Three dataset forms are accepted,
whatever the strategy:

* a `tf.distribute.DistributedDataset` (already distributed by the caller);
* a function `dataset_fn(input_context) -> tf.data.Dataset` batched with the
  *per-replica* batch size (`input_context.get_per_replica_batch_size(B)`),
  given to `strategy.distribute_datasets_from_function`;
* a `tf.data.Dataset` batched with the *global* batch size, split across
  replicas (and workers) by `strategy.experimental_distribute_dataset`.

Elements are `(x, y)` or `(x, y, sample_weight)` for training and evaluation,
and `x`, `(x,)`, or any of the above for prediction.
"""

import os
import types

import keras
import tensorflow as tf

from tfdist.seam import (install_quiet_device_iterators, keras_class_weight_map_fn,
                         leave_tfdist_code_unconverted, per_replica_value_spec)
from tfdist.distribute.collectives import agreed_seed
from tfdist.distribute.introspection import is_multi_worker
from tfdist.training import arrays

# Multi-device iterators end without waiting for a tuner they do not use (see the seam).
install_quiet_device_iterators()
# tfdist's graph code is traced as written, without AutoGraph's rewrite (see the seam).
leave_tfdist_code_unconverted()

ALLOWED_INPUTS = (
    "numpy arrays (or lists / dicts of them) with y and batch_size, "
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
        TypeError: `data` is none of the accepted forms (arrays are turned
            into a dataset first, by `training_inputs` / `evaluation_inputs`).

    Example:

    >>> ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)  # global batch
    >>> dist = distribute(strategy, ds)
    """
    if isinstance(data, tf.distribute.DistributedDataset):
        return data
    if isinstance(data, tf.data.Dataset):
        return strategy.experimental_distribute_dataset(without_autotune_model(data))
    if callable(data):
        make_dataset = data
        return strategy.distribute_datasets_from_function(
            lambda context: without_autotune_model(make_dataset(context)))
    raise TypeError(f"{argument} must be {ALLOWED_INPUTS}; got {type(data).__name__}.")


def without_autotune_model(dataset):
    """`dataset` without tf.data's autotune thread, unless its options ask for it.

    A tf.data iterator whose options leave `autotune.enabled` unset runs an
    autotune thread that sleeps between optimisation passes, its period
    doubling up to 60 s; deleting the iterator (at the end of `fit`,
    `evaluate` or `predict`, at a preemption stop) waits until that sleep
    ends. Measured on TF 2.21 with the recipes: 0.3 s from the last step to
    exit in some runs, 5-15 s in others, up to a minute possible. So the
    datasets tfdist iterates have autotune off, with every `AUTOTUNE`
    parallelism fixed at the machine's core count (`initial_parallelism`,
    which is the parallelism tf.data gives `AUTOTUNE` without its tuner; the
    tuner never goes above the core count either) and prefetch buffers that
    still grow as the consumer waits. What each step computes, and which
    examples it gets, do not change.

    A dataset whose options set `autotune.enabled` (True or False) or
    `autotune.initial_parallelism` is returned as it is: set
    `options.autotune.enabled = True` to keep tf.data's tuner (and the wait
    when its iterator is deleted).

    Example:

    >>> ds = without_autotune_model(tf.data.Dataset.range(8).batch(4))
    >>> ds.options().autotune.enabled
    False
    """
    autotune = dataset.options().autotune
    if autotune.enabled is not None or autotune.initial_parallelism is not None:
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = False
    options.autotune.initial_parallelism = os.cpu_count() or 1
    return dataset.with_options(options)


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
            f"The elements of {argument} have no targets, which the compiled loss "
            "needs: give (x, y) or (x, y, sample_weight) elements (for arrays, pass y)."
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
    return tf.nest.map_structure(per_replica_value_spec, element_spec)


def training_inputs(strategy, x, y=None, *, batch_size=None, sample_weight=None,
                    class_weight=None, shuffle=True, validation_split=0.0,
                    validation_data=None, validation_batch_size=None):
    """Returns `(train, validation)` from `fit`'s arguments, as `distribute` accepts them.

    Array inputs become datasets of global batches (shuffled alike on every
    worker: the seed is agreed across the cluster); datasets pass through
    (with `class_weight` mapped onto a `tf.data.Dataset` as Keras does).

    Args:
        strategy: the trainer's strategy (to agree on a shuffle seed).
        x, y, batch_size, sample_weight, class_weight, shuffle,
        validation_split, validation_data, validation_batch_size: as in
            `keras.Model.fit`.

    Returns:
        `(train, validation)`; `validation` is None without validation data.

    Raises:
        ValueError: an argument that has no meaning for the form of `x`
            (e.g. `y` or `batch_size` with a dataset), both
            `validation_split` and `validation_data`, or a bad value.

    Example:

    >>> train, val = training_inputs(strategy, x, y, batch_size=64, validation_split=0.1)
    """
    if validation_split and validation_data is not None:
        raise ValueError(
            f"Both validation_split={validation_split!r} and validation_data were given; "
            "Keras would silently use validation_data only. Pass one of them.")
    if arrays.is_array_input(x):
        batch_size = _or_default(batch_size)
        train_part, validation_part = arrays.split_validation(x, y, sample_weight,
                                                              validation_split or 0.0)
        seed = agreed_seed(strategy, arrays.shuffle_seed()) if shuffle else None
        train = arrays.array_dataset(*train_part, batch_size=batch_size, shuffle=shuffle,
                                     class_weight=class_weight, seed=seed)
        if validation_part is not None:
            validation_data = validation_part
    else:
        _check_dataset_arguments(x, y=y, batch_size=batch_size, sample_weight=sample_weight,
                                 validation_split=validation_split)
        train = _dataset_input(strategy, x, shuffle, class_weight)
    validation = None
    if validation_data is not None:
        validation = _validation_inputs(
            validation_data, batch_size if validation_batch_size is None else validation_batch_size)
    return train, validation


def evaluation_inputs(x, y=None, *, batch_size=None, sample_weight=None):
    """Returns `evaluate`'s / `predict`'s data as `distribute` accepts it (never shuffled).

    Example:

    >>> data = evaluation_inputs(x_test, y_test, batch_size=128)
    """
    if arrays.is_array_input(x):
        return arrays.array_dataset(x, y, sample_weight,
                                    batch_size=_or_default(batch_size), shuffle=False)
    _check_dataset_arguments(x, y=y, batch_size=batch_size, sample_weight=sample_weight)
    return x


def _or_default(batch_size):
    """Keras's default batch size (32) when none was given; a given one is checked later."""
    return arrays.DEFAULT_BATCH_SIZE if batch_size is None else batch_size


def _validation_inputs(validation_data, batch_size):
    if isinstance(validation_data, (list, tuple)) and arrays.is_array_input(validation_data):
        if len(validation_data) not in (2, 3):
            raise ValueError(
                "validation_data as arrays must be (x_val, y_val) or (x_val, y_val, "
                f"sample_weight_val); got a {type(validation_data).__name__} of "
                f"{len(validation_data)} items.")
        return arrays.array_dataset(*validation_data,
                                    batch_size=_or_default(batch_size), shuffle=False)
    return validation_data  # a dataset: validation_batch_size applies to arrays only, as in Keras


def _check_dataset_arguments(x, **arguments):
    """Refuses array-only arguments given with a dataset (Keras refuses them too)."""
    if x is None:
        raise ValueError("x is required: arrays (with y), a tf.data.Dataset, a "
                         "dataset_fn(input_context) or a DistributedDataset.")
    given = [name for name, value in arguments.items()
             if value is not None and not (isinstance(value, (int, float)) and value == 0)]
    if given:
        raise ValueError(
            f"{', '.join(given)} cannot be used when x is a {type(x).__name__}: a dataset "
            "already yields batches of (x, y) or (x, y, sample_weight). Put the targets "
            "and weights in the dataset's elements and batch it with the global batch "
            "size (validation_split: split the dataset yourself, e.g. with "
            "take()/skip()).")


def _dataset_input(strategy, x, shuffle, class_weight):
    """Datasets as they are (with `class_weight` mapped on a `tf.data.Dataset`);
    generators and `keras.utils.PyDataset` through Keras's adapters (one worker only)."""
    if isinstance(x, (types.GeneratorType, keras.utils.PyDataset)):
        if is_multi_worker(strategy):
            raise ValueError(
                f"x is a {type(x).__name__}, which every worker would read in full: under "
                "MultiWorkerMirroredStrategy the input must be shardable. Use arrays, a "
                "tf.data.Dataset, or a dataset_fn(input_context) that reads this worker's "
                "share (input_context.input_pipeline_id).")
        return arrays.python_input_dataset(x, shuffle=shuffle, class_weight=class_weight)
    if class_weight is None:
        return x
    if not isinstance(x, tf.data.Dataset):
        raise ValueError(
            f"class_weight needs arrays or a tf.data.Dataset as x, got {type(x).__name__}. "
            "Apply the weights in your dataset_fn instead (map (x, y) to (x, y, weight)).")
    return x.map(keras_class_weight_map_fn(class_weight))
