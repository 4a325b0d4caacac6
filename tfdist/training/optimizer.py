"""Applying already all-reduced gradients with a Keras 3 optimizer, once.

Keras 3's TensorFlow optimizer sums gradients across replicas itself, inside
`optimizer.apply` (see `tfdist.seam.gradient_sum_skipped`), and
runs clipping and gradient accumulation *before* that sum, i.e. on each
replica's partial gradient. tfdist's step sums the gradients itself (so it can
normalise by the global loss count, clip by the global norm and accumulate
locally), then hands the optimizer the finished gradient. To keep the
optimizer from summing a second time, `gradients_already_summed` turns its
cross-replica sum into the identity while the step is being traced. Everything
else in `apply` (loss-scale unscaling and the non-finite skip of
`LossScaleOptimizer`, weight decay, constraints, the iteration counter, the
mirrored update through `merge_call`) is Keras's own code.

Because `apply` now receives the global gradient, the optimizer's own
`clipnorm`, `global_clipnorm` and `clipvalue` act on the global gradient too,
so they are accepted. `gradient_accumulation_steps` is refused: it would
all-reduce every micro-batch and make learning-rate schedules count
micro-batches; use `Trainer(grad_accum_steps=K)`.
"""

import contextlib

import keras
import tensorflow as tf

from tfdist.seam import (gradient_sum_skipped, gradient_sum_wrapped, held_learning_rate,
                         held_learning_rate_replaced)


def optimizer_chain(optimizer):
    """Returns `[optimizer, inner, ...]`: the optimizer and any optimizers it wraps.

    Args:
        optimizer: a `keras.optimizers.Optimizer`, possibly a
            `keras.optimizers.LossScaleOptimizer`.

    Example:

    >>> lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    >>> [type(o).__name__ for o in optimizer_chain(lso)]
    ['LossScaleOptimizer', 'SGD']
    """
    chain = [optimizer]
    while hasattr(chain[-1], "inner_optimizer"):
        chain.append(chain[-1].inner_optimizer)
    return chain


def check_optimizer(optimizer, strategy, clip_norm=None):
    """Raises a teaching error when `optimizer` cannot be used by tfdist's step.

    Args:
        optimizer: the optimizer given to the `Trainer`.
        strategy: the `tf.distribute.Strategy` the trainer runs under.
        clip_norm: the trainer's global-norm clipping threshold, or None.

    Raises:
        TypeError: not a Keras 3 optimizer.
        ValueError: created outside `strategy.scope()`, uses Keras's own
            gradient accumulation, sets its own clipping while `clip_norm`
            is also given, or overwrites weights with their moving average
            every few steps under a Mirrored strategy.

    Example:

    >>> with strategy.scope():
    ...     opt = keras.optimizers.SGD(0.1)
    >>> check_optimizer(opt, strategy)
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"optimizer must be a Keras 3 optimizer instance (keras.optimizers.SGD, "
            f"Adam, AdamW, ..., or a LossScaleOptimizer), got {optimizer!r} of type "
            f"{type(optimizer).__name__}. Create it inside strategy.scope()."
        )
    for opt in optimizer_chain(optimizer):
        outside = variables_outside_scope(opt.variables, strategy)
        if outside:
            raise ValueError(
                f"The optimizer {opt.name!r} was created outside the scope of the "
                f"trainer's strategy ({type(strategy).__name__}); its variables "
                f"{outside} are not distributed by it. Keras optimizers capture the "
                "strategy when they are constructed: create the optimizer inside "
                "`with strategy.scope():` (the same strategy you give the Trainer)."
            )
        if opt.gradient_accumulation_steps:
            raise ValueError(
                f"The optimizer {opt.name!r} has gradient_accumulation_steps="
                f"{opt.gradient_accumulation_steps}. Keras accumulates inside "
                "`apply`, all-reducing every micro-batch, and its learning-rate "
                "schedule then counts micro-batches. Create the optimizer without "
                "it and pass Trainer(grad_accum_steps="
                f"{opt.gradient_accumulation_steps}) instead."
            )
        mirrored = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
        if opt.use_ema and opt.ema_overwrite_frequency and isinstance(strategy, mirrored):
            raise ValueError(
                f"The optimizer {opt.name!r} has use_ema=True with ema_overwrite_frequency="
                f"{opt.ema_overwrite_frequency}: Keras overwrites the weights inside a "
                f"conditional that needs a merge_call, which fails under "
                f"{type(strategy).__name__} (in Keras's own fit too). Drop "
                "ema_overwrite_frequency: with use_ema=True alone the averages are copied "
                "into the model when fit() ends.")
        own_clip = {name: getattr(opt, name)
                    for name in ("clipnorm", "global_clipnorm", "clipvalue")
                    if getattr(opt, name, None)}
        if clip_norm is not None and own_clip:
            raise ValueError(
                f"Both Trainer(clip_norm={clip_norm}) and the optimizer's own clipping "
                f"({', '.join(f'{k}={v}' for k, v in own_clip.items())}) are set; choose "
                "one. (In tfdist both act on the gradient summed over all replicas.)"
            )


@contextlib.contextmanager
def gradients_already_summed(optimizer):
    """Context in which `optimizer.apply` does not all-reduce the gradients.

    Use it around the code that *traces* a replica function calling
    `optimizer.apply(grads)` with gradients that are already summed across
    replicas. Inside, Keras's cross-replica gradient sum of the optimizer (and
    of any optimizer it wraps) is the identity (`tfdist.seam.gradient_sum_skipped`);
    on exit it is restored.

    Args:
        optimizer: a Keras 3 TensorFlow-backend optimizer.

    Example:

    >>> @tf.function
    ... def step(data):
    ...     with gradients_already_summed(opt):
    ...         strategy.run(replica_fn, args=(data,))
    """
    with gradient_sum_skipped(optimizer_chain(optimizer)):
        yield


@contextlib.contextmanager
def learning_rate_evaluated_once(optimizer):
    """Context in which a learning-rate schedule is put in the traced step once, not per variable.

    Keras reads `optimizer.learning_rate` once for the update and, with
    decoupled weight decay (`AdamW`, `weight_decay=...`), once more for every
    variable on every replica: a schedule with warmup was traced and run
    2 x 30 times per step for a 2-layer Transformer on 2 devices (4.5 s of
    its start-up here). Inside this context the schedule held by `optimizer`
    (and by any optimizer it wraps) is evaluated once per traced graph and
    the value reused; every read happens before the step counter moves, so
    the value is the same. On exit the optimizer holds its own schedule again.
    Use it around the code that *traces* a step calling `optimizer.apply`.

    Args:
        optimizer: a Keras 3 optimizer (a float or variable learning rate is
            left alone).

    Example:

    >>> @tf.function
    ... def step(data):
    ...     with learning_rate_evaluated_once(opt):
    ...         strategy.run(replica_fn, args=(data,))
    """
    with contextlib.ExitStack() as stack:
        for opt in optimizer_chain(optimizer):
            held = held_learning_rate(opt)
            if isinstance(held, keras.optimizers.schedules.LearningRateSchedule):
                stack.enter_context(held_learning_rate_replaced(opt, OncePerGraph(held)))
        yield


class OncePerGraph(keras.optimizers.schedules.LearningRateSchedule):
    """`schedule`, evaluated once per traced graph and step variable (every call when eager).

    See `learning_rate_evaluated_once`, which installs it while a step is traced.

    Args:
        schedule: a `keras.optimizers.schedules.LearningRateSchedule`.

    Example:

    >>> once = OncePerGraph(keras.optimizers.schedules.CosineDecay(0.1, 1000))
    >>> @tf.function
    ... def rates(step):
    ...     return once(step), once(step)   # one cosine in the graph
    """

    def __init__(self, schedule):
        super().__init__()
        self.schedule = schedule
        self._values = []  # (graph, step, value) of the graphs traced in this context

    def __call__(self, step):
        if tf.executing_eagerly():
            return self.schedule(step)
        graph = tf.compat.v1.get_default_graph()
        for seen_graph, seen_step, value in self._values:
            if seen_graph is graph and seen_step is step:
                return value
        value = self.schedule(step)
        self._values.append((graph, step, value))
        return value

    def get_config(self):
        return self.schedule.get_config()


@contextlib.contextmanager
def gradients_averaged():
    """Context in which every Keras optimizer averages gradients across replicas.

    Keras's `optimizer.apply` *sums* the replicas' gradients, because Keras
    divides each replica's loss by the number of replicas. A model's own
    `train_step` run by tfdist sees each replica's plain mean loss instead
    (`tfdist.training.model_hooks.keras_losses_unscaled`), so the optimizer
    must average: inside this context the gradient sum (`tfdist.seam.gradient_sum_wrapped`) of every
    TensorFlow-backend Keras optimizer (class-wide, so optimizers the model
    keeps in its own attributes are covered too) divides by the number of
    replicas before its sum. Use it around the code that *traces* the step.

    Example:

    >>> with gradients_averaged(), keras_losses_unscaled():
    ...     strategy.run(model.train_step, args=(batch,))
    """
    def averaging(original):
        def average(self, grads_and_vars):
            context = tf.distribute.get_replica_context()
            if context is None or context.num_replicas_in_sync == 1:
                return original(self, grads_and_vars)
            factor = 1.0 / context.num_replicas_in_sync
            return original(self, [(scale_gradient(g, factor), v) for g, v in grads_and_vars])
        return average

    with gradient_sum_wrapped(averaging):
        yield


def scale_gradient(grad, factor):
    """Returns `grad * factor` for a dense or `IndexedSlices` gradient (None stays None).

    Example:

    >>> scale_gradient(tf.constant([2.0, 4.0]), 0.5)
    <tf.Tensor: ... numpy=array([1., 2.], dtype=float32)>
    """
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def divide_gradient(grad, divisor):
    """Returns `grad / divisor` for a dense or `IndexedSlices` gradient, 0 where the divisor
    is 0 (`tf.math.divide_no_nan`).

    Example:

    >>> divide_gradient(tf.constant([2.0, 4.0]), 2.0)
    <tf.Tensor: ... numpy=array([1., 2.], dtype=float32)>
    """
    if isinstance(grad, tf.IndexedSlices):
        values = tf.math.divide_no_nan(grad.values, tf.cast(divisor, grad.values.dtype))
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return tf.math.divide_no_nan(grad, tf.cast(divisor, grad.dtype))


def sum_gradient_parts(parts):
    """The sum of one variable's gradients from several micro-batches (None if none).

    Sparse parts (`tf.IndexedSlices`, an embedding's) are joined, every slice
    kept, as one device's gradient of the whole batch holds one slice per
    looked-up row: Keras's optimizers square each slice (Adam's second
    moment), so summing them into one dense tensor first would change the
    update. Dense parts, or a mix, are added.

    Example:

    >>> sum_gradient_parts([tf.IndexedSlices(a, [0, 2]), tf.IndexedSlices(b, [2])]).indices
    <tf.Tensor: ... numpy=array([0, 2, 2], dtype=int32)>
    """
    if not parts:
        return None
    if all(isinstance(part, tf.IndexedSlices) for part in parts):
        if len(parts) == 1:
            return parts[0]
        return tf.IndexedSlices(tf.concat([part.values for part in parts], axis=0),
                                tf.concat([part.indices for part in parts], axis=0),
                                parts[0].dense_shape)
    return tf.add_n([tf.convert_to_tensor(part) for part in parts])


def loss_scale(optimizer):
    """Returns the factor the optimizer multiplies the loss by (a float32 tensor).

    1 for a plain optimizer, its `loss_scale_factor` if set, and the current
    dynamic scale of a `LossScaleOptimizer`.

    Args:
        optimizer: a Keras 3 optimizer.

    Example:

    >>> float(loss_scale(keras.optimizers.SGD()))
    1.0
    """
    return tf.cast(optimizer.scale_loss(tf.constant(1.0, tf.float32)), tf.float32)


def variables_outside_scope(variables, strategy):
    """The paths of `variables` (Keras or TF) that `strategy` did not create.

    Args:
        variables: Keras or `tf.Variable`s, e.g. `model.variables`.
        strategy: the `tf.distribute.Strategy` they should belong to.

    Example:

    >>> with strategy.scope():
    ...     model = build_model()
    >>> variables_outside_scope(model.variables, strategy)
    []
    """
    return [v.path for v in variables
            if not strategy.extended.variable_created_in_scope(_tf_variable(v))]


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable
