"""Adam and AdamW whose per-variable update is one TensorFlow kernel.

Keras's `Adam.update_step` builds about fifteen element-wise ops for every
variable, and under `MirroredStrategy` once more on every device. TensorFlow
has the same update as one kernel, `ResourceApplyAdam` (the one `tf.keras`'s
Adam ran, with an XLA lowering too): `FusedAdam` and `FusedAdamW` are Keras's
`Adam` and `AdamW` with that kernel in `update_step`. Everything else is
Keras's: the weight decay, the schedules, gradient clipping and accumulation,
the variables, `get_config`, and checkpoints (a backup of one loads into the
other). The recipes' `--optimizer adam` and `adamw` build these.

The formula is Keras's, operation for operation, except where the constants
are rounded: the kernel computes `1 - beta` in float32 from float32 betas,
Keras rounds `1 - beta` from Python's double. For `beta_2=0.999` the two
differ by 1.3e-5 of `1 - beta_2`; `tests/schedules/test_fused_adam.py` bounds
what that does to the weights over many steps.

The kernel runs for dense gradients of float32 and float64 variables whose
moments sit on the variable's device, without `amsgrad`; any other update
(an embedding's sparse gradient among them) is Keras's own, so nothing is
refused and nothing else changes.

    from tfdist.schedules.fused_adam import FusedAdamW

    optimizer = FusedAdamW(learning_rate=1e-3, weight_decay=0.01)
    model.compile(optimizer, loss="sparse_categorical_crossentropy")
"""

import keras
import tensorflow as tf

from tfdist.seam import adam_moments

FUSED_DTYPES = (tf.float32, tf.float64)
"""Variable dtypes the fused kernel updates (Keras's update takes the others)."""


def fused_adam_update(optimizer, gradient, variable, learning_rate):
    """Applies one Adam step to `variable` with TensorFlow's `ResourceApplyAdam`.

    Call it where Keras calls `update_step` (inside `optimizer.apply`, per
    device under a strategy).

    Args:
        optimizer: a built `keras.optimizers.Adam` (or subclass).
        gradient: the variable's dense gradient.
        variable: the Keras or TensorFlow variable to update.
        learning_rate: the rate for this step (Keras passes it).

    Returns:
        True if the kernel ran; False, with nothing done, when it cannot
        give Keras's result: `amsgrad`, a `tf.IndexedSlices` gradient (an
        embedding's: Keras squares each slice before it sums the repeated
        rows, the kernel would square the sum), a dtype outside
        `FUSED_DTYPES`, a variable without a resource handle, or moments on
        another device. The caller then runs Keras's update.

    Example:

    >>> if not fused_adam_update(optimizer, gradient, variable, learning_rate):
    ...     keras.optimizers.Adam.update_step(optimizer, gradient, variable, learning_rate)
    """
    if optimizer.amsgrad or isinstance(gradient, tf.IndexedSlices):
        return False
    target = variable.value if isinstance(variable, keras.Variable) else variable
    m, v = (moment.value if isinstance(moment, keras.Variable) else moment
            for moment in adam_moments(optimizer, variable))
    dtype = target.dtype
    if (dtype not in FUSED_DTYPES or not hasattr(target, "handle")
            or not all(hasattr(moment, "handle") for moment in (m, v))
            or not m.device == v.device == target.device):
        return False
    beta_1 = tf.cast(optimizer.beta_1, dtype)
    beta_2 = tf.cast(optimizer.beta_2, dtype)
    local_step = tf.cast(optimizer.iterations + 1, dtype)
    tf.raw_ops.ResourceApplyAdam(
        var=target.handle, m=m.handle, v=v.handle,
        beta1_power=tf.pow(beta_1, local_step), beta2_power=tf.pow(beta_2, local_step),
        lr=tf.cast(learning_rate, dtype), beta1=beta_1, beta2=beta_2,
        epsilon=tf.cast(optimizer.epsilon, dtype),
        grad=tf.cast(gradient, dtype))
    return True


class _FusedUpdateStep:
    """`update_step` through `fused_adam_update`, falling back to the Keras class's own."""

    def update_step(self, gradient, variable, learning_rate):
        if not fused_adam_update(self, gradient, variable, learning_rate):
            super().update_step(gradient, variable, learning_rate)


@keras.saving.register_keras_serializable(package="tfdist")
class FusedAdam(_FusedUpdateStep, keras.optimizers.Adam):
    """Keras's `Adam`, each variable updated by one `ResourceApplyAdam` kernel.

    Takes Keras's `Adam` arguments; see the module docstring for what differs.

    Example:

    >>> optimizer = FusedAdam(learning_rate=1e-3)
    >>> optimizer.apply([tf.ones((2,))], [keras.Variable([1.0, 2.0])])
    """


@keras.saving.register_keras_serializable(package="tfdist")
class FusedAdamW(_FusedUpdateStep, keras.optimizers.AdamW):
    """Keras's `AdamW`, each variable updated by one `ResourceApplyAdam` kernel.

    Takes Keras's `AdamW` arguments; the decoupled weight decay is Keras's.
    See the module docstring for what differs.

    Example:

    >>> optimizer = FusedAdamW(learning_rate=1e-3, weight_decay=0.01)
    >>> optimizer.apply([tf.ones((2,))], [keras.Variable([1.0, 2.0])])
    """
