"""The seam to `keras.Model`'s and Keras callbacks' internals: the compile
configuration, the symbolic build, the resume epoch, the model's strategy,
the functional layer graph, `predict`'s join and `evaluate`'s order.

Example:

    from tfdist.seam import model_initial_epoch

    start = model_initial_epoch(model) or 0   # set by a backup callback's restore
"""


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


def model_compile_config(model):
    """The arguments of the model's last `compile()` (`.config` is the dict), or None.

    Keras makes a new one at every `compile()`.

    Private: `keras.Model._compile_config`.

    Example:

    >>> model.compile("sgd", "mse"); model_compile_config(model).config["loss"]
    'mse'
    """
    return getattr(model, "_compile_config", None)


def symbolic_build(model, data_batch):
    """Builds the model, its compiled loss, metrics and optimizer from a batch spec, as `fit` does.

    Private: `keras.Model._symbolic_build`.

    Example:

    >>> symbolic_build(model, data_batch=dataset.element_spec)
    """
    model._symbolic_build(data_batch=data_batch)  # noqa: SLF001 - the seam


def model_initial_epoch(model):
    """The epoch a restoring backup callback told `fit` to start at (None when none did).

    Private: `keras.Model._initial_epoch` (what `BackupAndRestore` sets and `fit` reads).

    Example:

    >>> model_initial_epoch(keras.Sequential()) is None
    True
    """
    return getattr(model, "_initial_epoch", None)


def set_model_initial_epoch(model, epoch):
    """Tells `fit` (Keras's and tfdist's) to start at `epoch` (None: where the call says).

    Private: `keras.Model._initial_epoch`.

    Example:

    >>> set_model_initial_epoch(model, 3)
    >>> model_initial_epoch(model)
    3
    """
    model._initial_epoch = epoch  # noqa: SLF001 - the seam


def model_strategy(model):
    """The `tf.distribute` strategy the model was created under (None when none was recorded).

    Private: `keras.Model._distribute_strategy`.

    Example:

    >>> model_strategy(model) is strategy
    True
    """
    return getattr(model, "_distribute_strategy", None)


def callback_model(callback):
    """The model set on a Keras callback (None before `set_model`), without Keras's backend sync.

    Private: `keras.callbacks.Callback._model`.

    Example:

    >>> callback_model(keras.callbacks.Callback()) is None
    True
    """
    return callback._model  # noqa: SLF001 - the seam


def backup_and_restore_position(callback):
    """`(epoch, batch)`: where a `keras.callbacks.BackupAndRestore` last saw training.

    Private: `BackupAndRestore._current_epoch` and `_last_batch_seen`.

    Example:

    >>> backup_and_restore_position(keras.callbacks.BackupAndRestore("/tmp/b"))
    (0, 0)
    """
    return callback._current_epoch, callback._last_batch_seen  # noqa: SLF001 - the seam


def sequential_graph(model):
    """The functional model behind a built `keras.Sequential` (None before it is built).

    Private: `keras.Sequential._functional`.

    Example:

    >>> sequential_graph(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])).inputs
    """
    return getattr(model, "_functional", None)


def has_layer_graph(model):
    """Whether `model` carries a functional layer graph (a Functional model, not a subclassed one).

    Private: `Functional._nodes_by_depth` and `_outputs_struct`.

    Example:

    >>> has_layer_graph(keras.Model(inputs, outputs))
    True
    """
    return hasattr(model, "_nodes_by_depth") and hasattr(model, "_outputs_struct")


def nodes_by_depth(graph):
    """The functional graph's nodes, `{depth: [node, ...]}` (depth 0: the outputs).

    Private: `Functional._nodes_by_depth`.

    Example:

    >>> sorted(nodes_by_depth(model))
    [0, 1, 2]
    """
    return graph._nodes_by_depth  # noqa: SLF001 - the seam


def outputs_structure(graph):
    """The nesting of the functional graph's outputs as its `call` returns them.

    Private: `Functional._outputs_struct`.

    Example:

    >>> keras.tree.pack_sequence_as(outputs_structure(model), flat_outputs)
    """
    return graph._outputs_struct  # noqa: SLF001 - the seam


def standardized_inputs(graph, x):
    """`x` as the flat list of input tensors in `graph.inputs` order, as the graph's `call` does.

    Private: `Functional._standardize_inputs`.

    Example:

    >>> standardized_inputs(model, {"token_ids": ids})
    [<tf.Tensor ...>]
    """
    return graph._standardize_inputs(x)  # noqa: SLF001 - the seam


def producing_layer_name(tensor):
    """The name of the layer whose call made the symbolic `tensor`.

    Private: `KerasTensor._keras_history`.

    Example:

    >>> producing_layer_name(keras.layers.Dense(1, name="d")(keras.Input((2,))))
    'd'
    """
    return tensor._keras_history.operation.name  # noqa: SLF001 - the seam


def direct_sublayers(layer):
    """The layers `layer` holds directly (not itself, not their own sub-layers).

    Private: `keras.layers.Layer._flatten_layers`.

    Example:

    >>> direct_sublayers(keras.layers.Dense(1))
    []
    """
    return layer._flatten_layers(include_self=False, recursive=False)  # noqa: SLF001 - the seam


def variable_storage(variable):
    """The backend object holding a `keras.Variable`'s value (a `tf.Variable`; None before one).

    Private: `keras.Variable._value`.

    Example:

    >>> variable_storage(keras.Variable(1.0)).device
    '/job:localhost/replica:0/task:0/device:CPU:0'
    """
    return variable._value  # noqa: SLF001 - the seam


def set_variable_storage(variable, storage):
    """Makes `storage` (a `tf.Variable`) hold the `keras.Variable`'s value from now on.

    Keras's TensorFlow backend accepts a `tf.Variable` as a variable's
    storage; checkpoints, `get_weights` and the layers all go through the
    Keras variable, so they follow.

    Private: `keras.Variable._value`.

    Example:

    >>> set_variable_storage(layer.kernel, new_resource_variable(initial_value=kernel_value))
    """
    variable._value = storage  # noqa: SLF001 - the seam
