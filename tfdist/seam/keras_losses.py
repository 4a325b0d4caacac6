"""The seam to Keras's loss internals: masks, rank alignment, the compiled
loss's entries, the loss tracker, and the per-replica loss scaling.

Example:

    from tfdist.seam import get_keras_mask, keras_loss_scaling_disabled

    with keras_loss_scaling_disabled():
        value = model.compute_loss(x, y, y_pred)   # the replica's own mean
"""

import contextlib


def get_keras_mask(tensor):
    """The Keras mask carried by `tensor` (None when it has none).

    Private: `keras.src.backend.common.masking.get_keras_mask` (Keras reads
    masks this way in its losses and metrics; no public accessor).

    Example:

    >>> get_keras_mask(tf.ones([2])) is None
    True
    """
    from keras.src.backend.common.masking import get_keras_mask as keras_get_mask

    return keras_get_mask(tensor)


def set_keras_mask(tensor, mask):
    """Attaches `mask` to `tensor` as its Keras mask (what losses and metrics then honour).

    Private: `keras.src.backend.common.masking.set_keras_mask`.

    Example:

    >>> set_keras_mask(values, tf.constant([True, False]))
    >>> get_keras_mask(values).numpy().tolist()
    [True, False]
    """
    from keras.src.backend.common.masking import set_keras_mask as keras_set_mask

    keras_set_mask(tensor, mask)


def squeeze_or_expand_to_same_rank(x1, x2):
    """`(x1, x2)` with one squeezed or expanded to the other's rank, as Keras's losses do.

    Private: `keras.src.losses.loss.squeeze_or_expand_to_same_rank`.

    Example:

    >>> [t.shape for t in squeeze_or_expand_to_same_rank(tf.ones([4, 1]), tf.ones([4]))]
    [TensorShape([4]), TensorShape([4])]
    """
    from keras.src.losses.loss import squeeze_or_expand_to_same_rank as keras_align

    return keras_align(x1, x2)


def keras_loss_function_wrapper(function, name=None):
    """A `keras.losses.Loss` around a plain loss function, as `compile(loss=fn)` wraps it.

    Private: `keras.src.losses.losses.LossFunctionWrapper`.

    Example:

    >>> keras_loss_function_wrapper(keras.losses.mean_squared_error).reduction
    'sum_over_batch_size'
    """
    from keras.src.losses.losses import LossFunctionWrapper

    return LossFunctionWrapper(function, name=name)


@contextlib.contextmanager
def keras_loss_scaling_disabled():
    """Context in which Keras does not divide losses by the number of replicas.

    Inside, `keras.src.losses.loss.scale_loss_for_distribution` and
    `unscale_loss_for_distribution` are the identity; on exit they are put
    back. Only Python code running inside (tracing) sees the change.

    Private (a monkey-patch): the two functions of `keras.src.losses.loss`
    (Keras has no switch for this scaling).

    Example:

    >>> with keras_loss_scaling_disabled():
    ...     value = model.compute_loss(x, y, y_pred)  # the replica's own mean
    """
    from keras.src.losses import loss as keras_loss_module

    scale = keras_loss_module.scale_loss_for_distribution
    unscale = keras_loss_module.unscale_loss_for_distribution
    keras_loss_module.scale_loss_for_distribution = _identity
    keras_loss_module.unscale_loss_for_distribution = _identity
    try:
        yield
    finally:
        keras_loss_module.scale_loss_for_distribution = scale
        keras_loss_module.unscale_loss_for_distribution = unscale


def _identity(value):
    return value


def model_compile_loss(model):
    """The model's compiled loss (Keras's `CompileLoss`), or None when compiled without a loss.

    Private: `keras.Model._compile_loss`.

    Example:

    >>> model.compile("sgd", "mse"); model_compile_loss(model).built
    False
    """
    return model._compile_loss  # noqa: SLF001 - the seam


def compile_loss_entries(compile_loss):
    """The compiled loss's flat entries (`loss`, `loss_weights`, `name` per output).

    Private: `CompileLoss._flat_losses`.

    Example:

    >>> [entry.name for entry in compile_loss_entries(model_compile_loss(model))]
    ['priority', 'department']
    """
    return compile_loss._flat_losses  # noqa: SLF001 - the seam


@contextlib.contextmanager
def compile_loss_entries_replaced(compile_loss, entries):
    """Context in which the compiled loss computes with `entries` and updates no per-output tracker.

    Private: `CompileLoss._flat_losses` and `CompileLoss._metrics`.

    Example:

    >>> with compile_loss_entries_replaced(compile_loss, recorders):
    ...     compile_loss.call(y_true, y_pred, sample_weight)
    """
    saved = compile_loss._flat_losses, compile_loss._metrics  # noqa: SLF001 - the seam
    compile_loss._flat_losses = entries  # noqa: SLF001
    compile_loss._metrics = [None] * len(entries)  # noqa: SLF001
    try:
        yield
    finally:
        compile_loss._flat_losses, compile_loss._metrics = saved  # noqa: SLF001


def model_loss_value(model, **kwargs):
    """The model's loss as Keras's own steps compute it (with `training` where `compute_loss` takes it).

    Private: `keras.Model._compute_loss`.

    Example:

    >>> model_loss_value(model, x=x, y=y, y_pred=model(x), sample_weight=None, training=True)
    """
    return model._compute_loss(**kwargs)  # noqa: SLF001 - the seam


def model_loss_tracker(model):
    """The `Mean` metric behind the model's `"loss"` log.

    Private: `keras.Model._loss_tracker`.

    Example:

    >>> model_loss_tracker(model).update_state(0.5, sample_weight=32)
    """
    return model._loss_tracker  # noqa: SLF001 - the seam


def declare_metric_direction(metric, direction):
    """Tells Keras's callbacks whether larger (`"up"`) or smaller (`"down"`) values are better.

    `EarlyStopping`/`ModelCheckpoint` with `mode="auto"` read it.

    Private: `keras.metrics.Metric._direction`.

    Example:

    >>> declare_metric_direction(accuracy_metric, "up")
    """
    metric._direction = direction  # noqa: SLF001 - the seam
