"""Batch normalization as one TensorFlow kernel: `FusedBatchNormalization`.

Keras's `BatchNormalization` computes its statistics and its normalization
with separate element-wise ops (casts, `moments`, subtract, multiply, add)
and so does its gradient: each is a full pass over the activations, and
on a CPU in bfloat16 each converts every element on its own. TensorFlow
has the whole of it, forward and backward, as one kernel each
(`FusedBatchNormV3` and its gradient, with an XLA lowering and a oneDNN
kernel on CPUs). `FusedBatchNormalization` is Keras's layer, with the same
weights, names, arguments, checkpoints and `get_config`, whose `call` runs
that kernel whenever it can: 4-D channels-last inputs (a convolution's),
float16, bfloat16 or float32, no mask, not `synchronized`, no `renorm`,
and an `epsilon` of at least 1.001e-5 (the cuDNN kernel's smallest). Any
other call is Keras's own.

What it computes is Keras's batch norm: statistics in float32 over the
batch and spatial axes, the moving averages updated with `momentum` from
the biased batch variance as Keras does (the kernel returns the unbiased
one; it is rescaled by `(n - 1) / n`), inference from the moving averages.
The results differ from Keras's ops by rounding only (tested). One forward
and backward of batch norm and ReLU over a `[128, 32, 32, 64]` tensor on an
AMX Xeon took 32 ms against Keras's 89 ms in bfloat16 (24 against 71 ms in
float32), and a whole training step of the `resnet_tiny` CNN at batch 128
ran 1.9x (bfloat16) and 1.5x (float32) faster; see the experiment notes.

Example:
    x = keras.layers.Conv2D(64, 3, use_bias=False)(x)
    x = FusedBatchNormalization(epsilon=1.001e-5)(x)
"""

import keras
import tensorflow as tf

SMALLEST_FUSED_EPSILON = 1.001e-5
"""The smallest `epsilon` the fused kernel takes on every device (cuDNN's limit)."""

_FUSED_DTYPES = frozenset({tf.float16, tf.bfloat16, tf.float32})


@keras.saving.register_keras_serializable(package="tfdist")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """Keras's `BatchNormalization` run as TensorFlow's fused batch-norm kernel.

    Takes Keras's arguments and has Keras's weights (`gamma`, `beta`,
    `moving_mean`, `moving_variance`), so checkpoints of either load into
    the other. See the module docstring for when the kernel runs.

    Example:

    >>> layer = FusedBatchNormalization(epsilon=1.001e-5)
    >>> x = tf.random.normal([8, 4, 4, 3])
    >>> layer.fuses(x)
    True
    >>> tuple(layer(x, training=True).shape)
    (8, 4, 4, 3)
    """

    def fuses(self, inputs, mask=None):
        """Whether a call on `inputs` (and `mask`) runs the fused kernel.

        Example:

        >>> FusedBatchNormalization().fuses(tf.zeros([2, 3]))  # not 4-D
        False
        """
        axis = self.axis if isinstance(self.axis, int) else None
        return (mask is None and not self.synchronized and not self.renorm
                and len(inputs.shape) == 4 and axis in (-1, 3)
                and self.epsilon >= SMALLEST_FUSED_EPSILON
                and tf.as_dtype(inputs.dtype) in _FUSED_DTYPES)

    def call(self, inputs, training=None, mask=None):
        if not self.fuses(inputs, mask):
            return super().call(inputs, training=training, mask=mask)
        x = tf.convert_to_tensor(inputs)
        if x.dtype != self.compute_dtype:
            x = tf.cast(x, self.compute_dtype)
        channels = x.shape[-1]
        scale = self.gamma if self.scale else tf.ones([channels], tf.float32)
        offset = self.beta if self.center else tf.zeros([channels], tf.float32)
        scale, offset = tf.cast(scale, tf.float32), tf.cast(offset, tf.float32)
        training = bool(training and self.trainable)  # as Keras: a frozen layer infers
        if training:  # the kernel computes the batch's statistics
            mean = variance = tf.constant([], tf.float32)
        else:
            mean = tf.cast(self.moving_mean, tf.float32)
            variance = tf.cast(self.moving_variance, tf.float32)
        y, batch_mean, batch_variance = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=scale, offset=offset, mean=mean, variance=variance,
            epsilon=self.epsilon, exponential_avg_factor=1.0, data_format="NHWC",
            is_training=training)[:3]
        if training:
            # The kernel's batch variance is the unbiased one; Keras's moving
            # variance averages the biased one (what the normalization used).
            count = tf.cast(tf.size(x, out_type=tf.int64) // channels, tf.float32)
            batch_variance = tf.math.multiply_no_nan(batch_variance, (count - 1.0) / count)
            self.moving_mean.assign(
                tf.cast(self.moving_mean, tf.float32) * self.momentum
                + batch_mean * (1.0 - self.momentum))
            self.moving_variance.assign(
                tf.cast(self.moving_variance, tf.float32) * self.momentum
                + batch_variance * (1.0 - self.momentum))
        return y
