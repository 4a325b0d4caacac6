"""In-memory data, as passed to Keras `fit(x, y, ...)`, turned into a dataset of global batches.

`Trainer.fit(x, y, batch_size=..., validation_split=..., shuffle=...,
class_weight=..., sample_weight=...)`, `evaluate(x, y, ...)` and
`predict(x, ...)` accept what Keras 3's `Model.fit/evaluate/predict` accept:
numpy arrays, tensors, pandas objects and nested lists, tuples and dicts of
them. This module turns them into a `tf.data.Dataset` of *global* batches,
which the trainer distributes with `strategy.experimental_distribute_dataset`
(each global batch is split across replicas and workers).

What Keras does is reused, not re-implemented: the input checks, the
`sample_weight` and `class_weight` handling and the packing of `ArrayDataAdapter`
(`tfdist.seam.keras_array_adapter`), its dtype rules
(`tfdist.seam.keras_sliceable`: floats become `keras.config.floatx()`,
a pandas Series becomes a column), and Keras's validation split
(`tfdist.seam.keras_train_validation_split`). The batches are the ones Keras's
adapter yields (same rows, same last shorter batch, same structure), with one
difference: the shuffled order is drawn from an explicit `seed` at every pass,
independent of TensorFlow's global seed, so that every worker of a
multi-worker job, and a job resumed mid-training, sees the same orders.

Generators and `keras.utils.PyDataset` go through Keras's own adapters
(`python_input_dataset`); they cannot be split consistently across workers.
"""

import numbers
import types
from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from tfdist.seam import (keras_array_adapter, keras_can_convert_arrays, keras_packed_arrays,
                         keras_python_input_dataset, keras_sliceable, keras_sparse_rows,
                         keras_train_validation_split)
from tfdist.runtime.argtypes import check_int_at_least, check_number

SHUFFLE_CHOICES = (False, True, "batch")
"""The values of `shuffle`: input order, a new permutation of all rows at every
pass, or (Keras's "batch") batches in input order with rows shuffled inside
each batch."""

DEFAULT_BATCH_SIZE = 32
"""Keras's batch size when `fit`, `evaluate` or `predict` get none."""

ALLOWED_ARRAYS = (
    "numpy arrays, tf.Tensors, pandas DataFrames/Series or other array-likes "
    "(objects with __array__), or lists, tuples and dicts of them"
)

# First half of the seed pair of the per-pass random stream (the second half is
# the user's seed). Any fixed non-zero value works; this is TensorFlow's
# DEFAULT_GRAPH_SEED, what `Dataset.random(seed)` uses when no global seed is set.
_SEED_SALT = 87654321


def is_array_input(x):
    """True when `x` is in-memory data that Keras's array adapter accepts.

    That is numpy arrays, `tf.Tensor`s (eager, ragged, sparse), pandas
    DataFrames and Series (when pandas is installed), any object with
    `__array__`, and lists, tuples and dicts (nested) of these, with at least
    one array. Datasets, distributed datasets, `dataset_fn` callables,
    generators and `keras.utils.PyDataset` are not array input; neither are
    lists of Python numbers (Keras refuses those too: wrap them in
    `np.array`).

    Args:
        x: what the user passed as `x` (or `y`, `sample_weight`).

    Returns:
        A bool.

    Example:

    >>> is_array_input({"tokens": np.zeros((8, 5)), "mask": tf.ones((8, 5))})
    True
    >>> is_array_input(tf.data.Dataset.range(3))
    False
    """
    if x is None or isinstance(x, (tf.data.Dataset, tf.distribute.DistributedDataset,
                                   types.GeneratorType, keras.utils.PyDataset)):
        return False
    leaves = [leaf for leaf in keras.tree.flatten(x) if leaf is not None]
    if not leaves:
        return False
    if any(isinstance(leaf, (tf.data.Dataset, tf.distribute.DistributedDataset))
           for leaf in leaves):
        return False
    return bool(keras_can_convert_arrays(x))


def shuffle_seed(seed=None):
    """Returns the seed `array_dataset` shuffles with: `seed` itself, or one drawn now.

    A drawn seed comes from numpy's global random state, so a program that
    calls `keras.utils.set_random_seed(s)` (or `np.random.seed(s)`) first
    draws the same seed at every run and on every worker; otherwise it differs
    from run to run. Under `MultiWorkerMirroredStrategy` pass an explicit
    seed (or set the same global seed on every worker): the workers must
    shuffle alike. A job that resumes after a restart needs the same seed
    as the interrupted run to replay its orders: keep the seed with the
    checkpoint, or pass one.

    Args:
        seed: None, or an int (returned unchanged).

    Raises:
        ValueError: `seed` is neither None nor an int.

    Example:

    >>> shuffle_seed(7)
    7
    """
    if seed is None:
        return int(np.random.randint(0, 2**31 - 1))
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an int or None, got {seed!r}.")
    return int(seed)


def array_dataset(x, y=None, sample_weight=None, *, batch_size, shuffle=False,
                  class_weight=None, seed=None):
    """Returns a `tf.data.Dataset` of the global batches Keras's `fit` would make.

    Elements are `x`, `(x, y)` or `(x, y, sample_weight)` batches of
    `batch_size` rows; the last batch holds the remaining rows and is kept, as
    in Keras. When `x` is a list or tuple and there is no `y`, elements are
    `(x,)`, as in Keras (`keras.utils.pack_x_y_sample_weight`); lists become
    tuples. Each array is placed in the dataset once (as in Keras's
    `ArrayDataAdapter`: `from_tensors(arrays).repeat()` zipped with batches of
    row indices, then `tf.gather`), floats are cast to `keras.config.floatx()`
    like Keras does, and the auto-shard policy is DATA, so
    `strategy.experimental_distribute_dataset` splits every global batch
    across replicas and workers.

    Shuffled orders depend on `seed` only (not on `tf.random.set_seed` or
    `keras.utils.set_random_seed`): the k-th `iter()` of the dataset gives the
    k-th order of that seed, in every process that builds it with the same
    seed. So all workers of a multi-worker job agree on every pass, and a
    rebuilt dataset iterated k times is where the first one was.

    Args:
        x: input data: an array or a list, tuple or dict (nested) of arrays
            (see `is_array_input`).
        y: targets, the same kinds as `x`, or None.
        sample_weight: per-sample weights, an array (or one per output, with
            the structure of `y`), or None. A single array with a nested `y`
            is used for every output, as in Keras.
        batch_size: rows per global batch, an int >= 1 (Keras's default is
            `DEFAULT_BATCH_SIZE`).
        shuffle: False (input order), True (a new permutation of all rows at
            every pass, i.e. at every `iter()`), or "batch" (as in Keras:
            batches in input order, the rows inside each batch shuffled anew
            at every pass).
        class_weight: None or a dict `{class index: weight}`, turned into
            per-sample weights from `y` (integer labels, or one-hot / one
            probability per class, whose argmax is the class) as Keras does;
            classes not in the dict weigh 1. Needs a single-output `y` and no
            `sample_weight`.
        seed: an int that determines the shuffled orders, or None to draw one
            now (see `shuffle_seed`). Unused without shuffling.

    Returns:
        A `tf.data.Dataset` with known cardinality (the number of batches).

    Raises:
        TypeError: `x`, `y` or `sample_weight` is not array data.
        ValueError: a bad `batch_size`, `shuffle`, `seed` or `class_weight`;
            arrays whose row counts differ; `class_weight` with
            `sample_weight`, without `y` or with several outputs; a
            `sample_weight` structure that does not match `y`.

    Example:

    >>> x, y = np.random.rand(103, 4), np.random.randint(0, 3, size=103)
    >>> ds = array_dataset(x, y, batch_size=10, shuffle=True, seed=1)
    >>> [int(xb.shape[0]) for xb, yb in ds][-2:]
    [10, 3]
    >>> dist = strategy.experimental_distribute_dataset(ds)
    """
    _check_batch_size(batch_size)
    shuffle = _check_shuffle(shuffle)
    if seed is not None or shuffle is not False:
        seed = shuffle_seed(seed)  # checks it, or draws one
    _require_arrays(x, y, sample_weight, lambda name, value: (
        f"array_dataset: {name} must be {ALLOWED_ARRAYS}; got {type(value).__name__}."))
    _check_class_weight(class_weight, y, sample_weight)
    num_rows = _row_count(x, y, sample_weight)
    _check_sample_weights(sample_weight)

    # Keras's own checks and packing: sample_weight per output, class_weight
    # to per-sample weights, (x, y, sample_weight) structure.
    adapter = keras_array_adapter(x, y, sample_weight, batch_size, class_weight)
    inputs = keras_packed_arrays(adapter)
    # Keras's conversion for tf.data: dtypes, pandas, sparse, lists to tuples.
    inputs = keras_sliceable(inputs)
    inputs = keras.tree.lists_to_tuples(inputs)

    indices = _index_batches(num_rows, batch_size, shuffle, seed)
    dataset = tf.data.Dataset.zip((indices, tf.data.Dataset.from_tensors(inputs).repeat()))
    dataset = dataset.map(_gather_rows, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(adapter.num_batches))

    options = tf.data.Options()
    # As Keras: no default graph optimisations (their serialisation costs more
    # than they bring here); DATA sharding: each worker takes its part of every
    # global batch (there are no files to shard).
    options.experimental_optimization.apply_default_optimizations = False
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True  # the order must be the same on every worker
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def split_validation(x, y, sample_weight, validation_split):
    """Splits array data into training and validation parts as Keras's `fit` does.

    The validation part is the last `validation_split` fraction of the rows
    (`floor(n * (1 - validation_split))` rows are kept for training), taken
    before any shuffling, by Keras's own
    `train_validation_split` (`tfdist.seam.keras_train_validation_split`)
    (which also casts floats to `keras.config.floatx()`).

    Args:
        x: input arrays (see `is_array_input`).
        y: targets, or None.
        sample_weight: per-sample weights, or None.
        validation_split: a float in [0, 1); 0 means no validation part.

    Returns:
        `((x, y, sample_weight), (x_val, y_val, sample_weight_val))`; the
        second part is None when `validation_split` is 0, and the first is
        then the input unchanged.

    Raises:
        ValueError: `validation_split` is not a float in [0, 1), or leaves no
            row for training or for validation (Keras's message).
        TypeError: the data is not array data (a dataset or generator cannot
            be split: pass `validation_data`).

    Example:

    >>> (x_train, y_train, _), (x_val, y_val, _) = split_validation(
    ...     np.zeros((10, 2)), np.zeros(10), None, 0.2)
    >>> len(x_train), len(x_val)
    (8, 2)
    """
    if (isinstance(validation_split, (bool, np.bool_))
            or not isinstance(validation_split, numbers.Real)
            or not 0 <= validation_split < 1):
        raise ValueError(
            f"validation_split must be a float in [0, 1) (0: no validation data), "
            f"got {validation_split!r}.")
    if not validation_split:
        return (x, y, sample_weight), None
    _require_arrays(x, y, sample_weight, lambda name, value: (
        f"validation_split needs array data ({ALLOWED_ARRAYS}); {name} is a "
        f"{type(value).__name__}. Pass validation_data instead."))
    _row_count(x, y, sample_weight)
    train, validation = keras_train_validation_split(
        (x, y, sample_weight), float(validation_split))
    return tuple(train), tuple(validation)


def python_input_dataset(x, *, shuffle=False, class_weight=None):
    """Returns a `tf.data.Dataset` of the batches of a generator or `keras.utils.PyDataset`.

    A thin wrapper of Keras's adapters (`get_data_adapter(...).get_tf_dataset()`,
    the path of Keras's own `fit`): the elements are the batches as `x`
    yields them. `shuffle` shuffles the batch order of a `PyDataset` of
    known length (Keras warns and ignores it otherwise); `class_weight` works
    with a `PyDataset` only (Keras raises for generators).

    Such data cannot be split consistently across workers (every worker would
    run its own generator), so use it with one worker only; the `Trainer`
    refuses it under `MultiWorkerMirroredStrategy`. Under a one-worker
    strategy each batch is still split across the replicas.

    Args:
        x: a Python generator or a `keras.utils.PyDataset`.
        shuffle: passed to Keras (bool).
        class_weight: None or a dict `{class index: weight}` (PyDataset only).

    Raises:
        TypeError: `x` is neither a generator nor a `PyDataset`.
        ValueError: from Keras, e.g. `class_weight` with a generator.

    Example:

    >>> def batches():
    ...     for _ in range(3):
    ...         yield np.zeros((8, 4), "float32"), np.zeros((8,), "float32")
    >>> ds = python_input_dataset(batches())
    """
    if not isinstance(x, (types.GeneratorType, keras.utils.PyDataset)):
        raise TypeError(
            "python_input_dataset: x must be a Python generator or a "
            f"keras.utils.PyDataset; got {type(x).__name__}.")
    if isinstance(class_weight, Mapping):
        _check_class_weights(class_weight)
    return keras_python_input_dataset(x, shuffle=shuffle, class_weight=class_weight)


def _check_batch_size(batch_size):
    check_int_at_least("batch_size", batch_size, 1)


def _check_shuffle(shuffle):
    if not (isinstance(shuffle, (bool, np.bool_)) or
            (isinstance(shuffle, str) and shuffle == "batch")):
        raise ValueError(
            f"shuffle must be one of {SHUFFLE_CHOICES} (False: input order; True: a new "
            "permutation of all rows every pass; \"batch\": rows shuffled within each "
            f"batch), got {shuffle!r}.")
    return shuffle if isinstance(shuffle, str) else bool(shuffle)


def _require_arrays(x, y, sample_weight, message):
    """Raises `TypeError(message(name, value))` for the first of `x` (always) and
    `y`, `sample_weight` (when given) that is not array data."""
    for name, value in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        if (value is not None or name == "x") and not is_array_input(value):
            raise TypeError(message(name, value))


def _check_class_weight(class_weight, y, sample_weight):
    """The conditions under which Keras 3.15 refuses `class_weight`, with clearer messages."""
    if class_weight is None:
        return
    if not isinstance(class_weight, Mapping):
        raise ValueError(
            "class_weight must be a dict {class index: weight}, got "
            f"{type(class_weight).__name__}: {class_weight!r}.")
    _check_class_weights(class_weight)
    if sample_weight is not None:
        raise ValueError(
            "class_weight and sample_weight cannot be used together (as in Keras); "
            f"got class_weight={class_weight!r} and a sample_weight.")
    if y is None:
        raise ValueError(
            f"class_weight={class_weight!r} needs targets y to weigh by class; y is None.")
    if keras.tree.is_nested(y):
        raise ValueError(
            "class_weight is only supported for a single output (as in Keras); y is a "
            f"{type(y).__name__} of {len(keras.tree.flatten(y))} arrays. Pass one "
            "sample_weight array per output instead.")


def _check_class_weights(class_weight):
    """Each weight finite and >= 0: NaN or inf makes the loss NaN, a negative weight
    trains its class away."""
    for label, weight in class_weight.items():
        check_number(f"class_weight[{label!r}]", weight, at_least=0,
                     hint="a class's weight multiplies its examples' loss")


def _check_sample_weights(sample_weight):
    """Every sample weight finite and >= 0 (a NaN one makes the epoch's loss NaN)."""
    for path, leaf in keras.tree.flatten_with_path(sample_weight):
        if leaf is None:
            continue
        try:
            weights = np.asarray(leaf, dtype=np.float64)
        except (TypeError, ValueError):
            continue  # Keras names what it cannot convert
        if weights.ndim == 0:
            continue  # _row_count names a scalar
        rows = weights.reshape(len(weights), -1)
        bad = np.flatnonzero(~(np.isfinite(rows) & (rows >= 0)).all(axis=1))
        if len(bad):
            where = "sample_weight" + "".join(f"[{p!r}]" for p in path)
            raise ValueError(
                f"{where} must hold finite weights >= 0; {len(bad)} row(s) do not, the first is "
                f"row {bad[0]}: {weights[bad[0]].tolist()!r}. A NaN or infinite weight makes the "
                "loss NaN, a negative one trains its example away.")


def _row_count(x, y, sample_weight):
    """The common number of rows of every array, or a ValueError listing them."""
    sizes = {}
    for name, value in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        for path, leaf in keras.tree.flatten_with_path(value):
            if leaf is None:
                continue
            shape = getattr(leaf, "shape", None)
            if shape is None:
                shape = np.shape(leaf)
            where = name + "".join(f"[{p!r}]" for p in path)
            if len(shape) == 0:
                raise ValueError(
                    f"{where} is a scalar; every array needs a first (batch) dimension.")
            sizes[where] = int(shape[0])
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{where}: {count}" for where, count in sizes.items())
        raise ValueError(
            "Data cardinality is ambiguous: all arrays in x, y and sample_weight must "
            f"have the same number of rows (samples). Got {listed}.")
    return next(iter(sizes.values()))


def _pass_seeds(seed):
    """A dataset of one element, a seed pair (int64 [2]) that is new at every `iter()`.

    The k-th iterator of the dataset gets the k-th pair of a stream determined
    by `seed` alone. The stream is a `Dataset.random` built from the raw op
    with both seeds explicit: `Dataset.random(seed)` and
    `Dataset.shuffle(seed=...)` would mix in the global seed of
    `tf.random.set_seed`, so processes (or one process after
    `keras.utils.set_random_seed`) with different global seeds would disagree.
    """
    variant = tf.raw_ops.RandomDatasetV2(
        seed=tf.constant(_SEED_SALT, tf.int64),
        seed2=tf.constant(seed % (2**63 - 1), tf.int64),
        seed_generator=tf.raw_ops.DummySeedGenerator(),
        rerandomize_each_iteration=True,
        output_types=[tf.int64], output_shapes=[[]])
    stream = tf.data.experimental.from_variant(variant, tf.TensorSpec([], tf.int64))
    return stream.batch(2, drop_remainder=True).take(1)


def _index_batches(num_rows, batch_size, shuffle, seed):
    """A dataset of int64 row-index batches, one pass per iteration (Keras's layout)."""
    num_full = num_rows // batch_size
    in_full = num_full * batch_size

    def pass_order(pass_seed):
        order = tf.range(num_rows, dtype=tf.int64)
        if shuffle is True:
            order = tf.random.experimental.stateless_shuffle(order, seed=pass_seed)
        return pass_seed, order

    def batches(pass_seed, order):
        out = tf.data.Dataset.from_tensor_slices(
            tf.reshape(order[:in_full], [num_full, batch_size]))
        if num_rows > in_full:  # the last, shorter batch
            out = out.concatenate(tf.data.Dataset.from_tensors(order[in_full:]))
        if shuffle == "batch":
            out = out.enumerate().map(
                lambda i, rows: tf.random.experimental.stateless_shuffle(
                    rows, seed=tf.random.experimental.stateless_fold_in(pass_seed, i)))
        return out

    if shuffle is False:
        seeds = tf.data.Dataset.from_tensors(tf.zeros([2], tf.int64))
    else:
        seeds = _pass_seeds(seed)
    # As Keras: a pass's permutation is computed in the background as soon as
    # its iterator exists (a large one takes a while).
    return seeds.map(pass_order).prefetch(1).flat_map(batches)


def _gather_rows(rows, data):
    """Keras's `grab_batch`: the rows of every array (sparse ones through Keras's wrapper)."""
    def one(array):
        sparse = keras_sparse_rows(array, rows)
        if sparse is not None:
            return sparse
        if isinstance(array, (list, tuple, dict)):
            return None  # traverse into it
        if tf.is_tensor(array):
            return tf.gather(array, rows, axis=0)
        return array

    return keras.tree.traverse(one, data)

