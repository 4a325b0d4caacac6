"""The seam to Keras's optimizer internals: its cross-replica gradient sum,
its step counter, its strategy, its weight decay, its held learning rate
(read, or replaced while a step is traced).

Example:

    from tfdist.seam import gradient_sum_skipped

    with gradient_sum_skipped(optimizers):   # tfdist summed them already
        optimizer.apply(grads, variables)
"""

import contextlib


@contextlib.contextmanager
def gradient_sum_skipped(optimizers):
    """Context in which each of `optimizers` applies its gradients as given, with no cross-replica sum.

    Optimizers without the sum (not the TensorFlow backend's) are left alone.

    Private (a monkey-patch of instances): Keras's TensorFlow-backend
    `TFOptimizer._all_reduce_sum_gradients`.

    Example:

    >>> with gradient_sum_skipped([optimizer]):
    ...     strategy.run(replica_fn, args=(data,))
    """
    patched = []
    for opt in optimizers:
        if hasattr(opt, "_all_reduce_sum_gradients"):
            object.__setattr__(opt, "_all_reduce_sum_gradients", _unchanged)
            patched.append(opt)
    try:
        yield
    finally:
        for opt in patched:
            object.__delattr__(opt, "_all_reduce_sum_gradients")


def _unchanged(grads_and_vars):
    return grads_and_vars


@contextlib.contextmanager
def gradient_sum_wrapped(wrap):
    """Context in which every TensorFlow-backend Keras optimizer sums through `wrap(original)`.

    Class-wide, so optimizers a model keeps in its own attributes are covered.
    `wrap` receives Keras's method `original(optimizer, grads_and_vars)` and
    returns the replacement with the same signature; on exit the original is
    put back.

    Private (a monkey-patch of the class):
    `keras.src.backend.tensorflow.optimizer.TFOptimizer._all_reduce_sum_gradients`.

    Example:

    >>> def halved(original):
    ...     return lambda self, gv: original(self, [(g * 0.5, v) for g, v in gv])
    >>> with gradient_sum_wrapped(halved):
    ...     strategy.run(model.train_step, args=(batch,))
    """
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    original = TFOptimizer._all_reduce_sum_gradients  # noqa: SLF001 - the seam
    TFOptimizer._all_reduce_sum_gradients = wrap(original)  # noqa: SLF001
    try:
        yield
    finally:
        TFOptimizer._all_reduce_sum_gradients = original  # noqa: SLF001


def optimizer_iterations_variable(optimizer):
    """The optimizer's own step-counter variable (None before it has one).

    `optimizer.iterations` may be a read-only view; tfdist adds to the variable.

    Private: `keras.optimizers.Optimizer._iterations`.

    Example:

    >>> optimizer_iterations_variable(keras.optimizers.SGD()).numpy()
    0
    """
    return getattr(optimizer, "_iterations", None)


def set_optimizer_strategy(optimizer, strategy):
    """Makes the optimizer update its variables through `strategy`'s `extended.update`.

    Private: the TensorFlow-backend `Optimizer._distribution_strategy`.

    Example:

    >>> set_optimizer_strategy(optimizer, default_strategy())
    """
    optimizer._distribution_strategy = strategy  # noqa: SLF001 - the seam


def optimizer_weight_decay_method(optimizer):
    """The optimizer's (bound) method that applies decoupled weight decay to a list of variables.

    Private: `keras.optimizers.Optimizer._apply_weight_decay`.

    Example:

    >>> decay = optimizer_weight_decay_method(keras.optimizers.AdamW())
    """
    return optimizer._apply_weight_decay  # noqa: SLF001 - the seam


def override_weight_decay_method(optimizer, method):
    """Makes this optimizer instance apply weight decay with `method(variables)`; undo with
    `restore_weight_decay_method`.

    Private: `keras.optimizers.Optimizer._apply_weight_decay`.

    Example:

    >>> override_weight_decay_method(optimizer, lambda variables: None)
    >>> restore_weight_decay_method(optimizer)
    """
    object.__setattr__(optimizer, "_apply_weight_decay", method)


def restore_weight_decay_method(optimizer):
    """Removes the instance's weight-decay override (see `override_weight_decay_method`).

    Example:

    >>> restore_weight_decay_method(optimizer)
    """
    object.__delattr__(optimizer, "_apply_weight_decay")


def optimizer_trainable_variables(optimizer):
    """The variables the optimizer was built for (empty before it is built).

    Private: `keras.optimizers.Optimizer._trainable_variables`.

    Example:

    >>> optimizer_trainable_variables(keras.optimizers.SGD())
    ()
    """
    return getattr(optimizer, "_trainable_variables", ())


def held_learning_rate(optimizer):
    """The optimizer's held learning rate: a variable, a schedule or a callable (None if absent).

    `optimizer.learning_rate` evaluates a schedule; this is the held object.

    Private: `keras.optimizers.Optimizer._learning_rate`.

    Example:

    >>> type(held_learning_rate(keras.optimizers.SGD(0.1))).__name__
    'Variable'
    """
    return getattr(optimizer, "_learning_rate", None)


@contextlib.contextmanager
def held_learning_rate_replaced(optimizer, schedule):
    """Context in which this optimizer instance holds `schedule` as its learning rate.

    `optimizer.learning_rate` (which Keras evaluates for the update and, with
    decoupled weight decay, once more for every variable on every device)
    calls `schedule(iterations)` inside; on exit the held object is put back,
    so `get_config`, checkpoints and later reads see the original.

    Private: `keras.optimizers.Optimizer._learning_rate`.

    Example:

    >>> with held_learning_rate_replaced(optimizer, cached_schedule):
    ...     optimizer.apply(grads, variables)   # while a step is traced
    """
    original = held_learning_rate(optimizer)
    object.__setattr__(optimizer, "_learning_rate", schedule)
    try:
        yield
    finally:
        object.__setattr__(optimizer, "_learning_rate", original)


def adam_moments(optimizer, variable):
    """The first- and second-moment variables (`m`, `v`) Keras's Adam keeps for `variable`.

    Keras's Adam offers no public way to reach a variable's moments; tfdist's
    fused Adam update (`tfdist.schedules.fused_adam`) hands them to
    TensorFlow's `ResourceApplyAdam` kernel.

    Private: `keras.optimizers.Adam._momentums`, `._velocities` and
    `BaseOptimizer._get_variable_index`.

    Example:

    >>> m, v = adam_moments(optimizer, model.trainable_variables[0])
    """
    index = optimizer._get_variable_index(variable)  # noqa: SLF001 - the seam
    return optimizer._momentums[index], optimizer._velocities[index]  # noqa: SLF001
