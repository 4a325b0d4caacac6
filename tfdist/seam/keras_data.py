"""The seam to Keras's data adapters (`keras.src.trainers.data_adapters`).

tfdist feeds in-memory data exactly as Keras's `fit` does: same checks, same
packing of `(x, y, sample_weight)`, same dtypes, same validation split, same
`class_weight` rule. None of these helpers is exported by Keras.

Example:

    from tfdist.seam import keras_train_validation_split

    train, validation = keras_train_validation_split((x, y, None), 0.2)
"""


def keras_class_weight_map_fn(class_weight):
    """Keras's `(x, y) -> (x, y, weight)` map for `class_weight` on a `tf.data.Dataset`.

    Private: `keras.src.trainers.data_adapters.tf_dataset_adapter.make_class_weight_map_fn`.

    Example:

    >>> dataset.map(keras_class_weight_map_fn({0: 1.0, 1: 3.0}))
    """
    from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn

    return make_class_weight_map_fn(class_weight)


def keras_can_convert_arrays(x):
    """Whether Keras's `ArrayDataAdapter` accepts `x` (numpy, tensors, pandas, ...).

    Private: `keras.src.trainers.data_adapters.array_data_adapter.can_convert_arrays`.

    Example:

    >>> keras_can_convert_arrays((np.zeros((4, 2)),))
    True
    """
    from keras.src.trainers.data_adapters import array_data_adapter

    return array_data_adapter.can_convert_arrays(x)


def keras_array_adapter(x, y, sample_weight, batch_size, class_weight):
    """Keras's `ArrayDataAdapter` for in-memory data, unshuffled (`num_batches` is public).

    Keras's input checks, `sample_weight` per output and `class_weight` turned
    into per-sample weights.

    Private: `keras.src.trainers.data_adapters.array_data_adapter.ArrayDataAdapter`.

    Example:

    >>> keras_array_adapter(np.zeros((10, 2)), np.zeros(10), None, 4, None).num_batches
    3
    """
    from keras.src.trainers.data_adapters import array_data_adapter

    return array_data_adapter.ArrayDataAdapter(
        x, y, sample_weight=sample_weight, batch_size=batch_size, shuffle=False,
        class_weight=class_weight)


def keras_packed_arrays(adapter):
    """The `(x, y, sample_weight)` arrays as a `keras_array_adapter` packed them.

    Private: `ArrayDataAdapter._inputs` (no public accessor in Keras 3.15).

    Example:

    >>> keras_packed_arrays(keras_array_adapter(x, y, None, 32, {0: 1.0, 1: 2.0}))[2]
    """
    return adapter._inputs  # noqa: SLF001 - the seam


def keras_sliceable(inputs):
    """`inputs` converted as Keras converts arrays for tf.data (floats to `floatx`, pandas, sparse).

    Private: `keras.src.trainers.data_adapters.array_slicing.convert_to_sliceable`.

    Example:

    >>> keras_sliceable((np.zeros((2, 1), "float64"),))[0].dtype
    dtype('float32')
    """
    from keras.src.trainers.data_adapters import array_slicing

    return array_slicing.convert_to_sliceable(inputs, target_backend="tensorflow")


def keras_train_validation_split(arrays, validation_split):
    """Keras's `validation_split`: the last rows are the validation part (before shuffling).

    Private: `keras.src.trainers.data_adapters.array_slicing.train_validation_split`.

    Example:

    >>> train, validation = keras_train_validation_split((np.arange(10.0),), 0.2)
    >>> len(train[0]), len(validation[0])
    (8, 2)
    """
    from keras.src.trainers.data_adapters import array_slicing

    return array_slicing.train_validation_split(arrays, validation_split=validation_split)


def keras_python_input_dataset(x, shuffle, class_weight):
    """The `tf.data.Dataset` Keras's `fit` makes from a Python generator or `PyDataset`.

    Private: `keras.src.trainers.data_adapters.get_data_adapter`.

    Example:

    >>> keras_python_input_dataset(generator(), shuffle=False, class_weight=None)
    """
    from keras.src.trainers import data_adapters

    return data_adapters.get_data_adapter(
        x, shuffle=shuffle, class_weight=class_weight).get_tf_dataset()


def keras_sparse_rows(array, rows):
    """Rows of a Keras sparse-array wrapper, or None when `array` is not one.

    Private: `array_slicing.TensorflowSparseWrapper` and
    `slice_tensorflow_sparse_wrapper` (what Keras's own `grab_batch` uses).

    Example:

    >>> keras_sparse_rows(np.zeros(3), [0]) is None
    True
    """
    from keras.src.trainers.data_adapters import array_slicing

    if isinstance(array, array_slicing.TensorflowSparseWrapper):
        return array_slicing.slice_tensorflow_sparse_wrapper(array, rows)
    return None
