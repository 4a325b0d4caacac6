"""Token-level loss and accuracy that ignore padding, with exact
multi-replica semantics.

Every sequence batch carries pad targets (id 0 by default). A per-replica
mean over that replica's own non-pad tokens, averaged over replicas, is NOT
the mean over the global batch when replicas hold different numbers of real
tokens. The loss therefore exposes its per-replica sum and token count, so a
training step can divide by the global count; the metric keeps sums, which
add up exactly across replicas.
"""

import numbers

import keras
import tensorflow as tf
from keras import ops

from tfdist.runtime.argtypes import check_number
from tfdist.seam import declare_metric_direction, set_keras_mask


def _check_pad_id(pad_id):
    if isinstance(pad_id, bool) or not isinstance(pad_id, numbers.Integral) or pad_id < 0:
        raise ValueError(f"pad_id must be a token id, an integer >= 0, got {pad_id!r}.")
    return int(pad_id)


def _token_weights(y_true, pad_id, sample_weight, dtype):
    """Float weights `[batch, seq]`: 0 at pad targets, else 1 (x sample_weight)."""
    y_true = ops.convert_to_tensor(y_true)
    weights = ops.cast(ops.not_equal(y_true, ops.cast(pad_id, y_true.dtype)), dtype)
    if sample_weight is not None:
        sample_weight = ops.cast(ops.convert_to_tensor(sample_weight), dtype)
        while len(sample_weight.shape) < len(weights.shape):
            sample_weight = ops.expand_dims(sample_weight, -1)
        weights = weights * sample_weight
    return weights


def masked_token_losses(y_true, logits, pad_id, label_smoothing=0.0, dtype=None):
    """Per-token cross-entropy from logits, 0 at pad targets, and the mask of real tokens.

    One fused TensorFlow kernel over the logits
    (`tf.nn.sparse_softmax_cross_entropy_with_logits`); pad targets are
    replaced by class 0 for it and their losses set to 0 afterwards, so the
    logits themselves are never copied or masked (Keras's `ignore_class`
    writes a masked copy of the whole `[batch, seq, vocab]` tensor first).
    Gradients at pad targets are exactly 0.

    With `label_smoothing` e > 0 the target distribution is `(1 - e) *
    one_hot(y) + e / V` over the V classes (as
    `SparseLabelSmoothingCrossentropy` and Keras's
    `CategoricalCrossentropy(label_smoothing=e)`), computed as `(1 - e) *
    cross_entropy + e * (logsumexp(logits) - mean(logits))` without a one-hot
    tensor.

    Args:
        y_true: int targets `[batch, seq]`.
        logits: float logits `[batch, seq, vocab]`.
        pad_id: the target id to ignore.
        label_smoothing: e in [0, 1); 0 is the plain cross-entropy.
        dtype: the float type to compute in (the logits are cast to it
            first, and their gradient cast back); None: the logits' own.
            Cast here, inside the compiled kernel, bfloat16 logits are read
            once instead of being written out in float32 first (see
            `MaskedSparseCategoricalCrossentropy`).

    Returns:
        `(losses, valid)`: float `[batch, seq]` and bool `[batch, seq]`.

    Example:

    >>> losses, valid = masked_token_losses(tf.constant([[3, 0]]), tf.zeros([1, 2, 4]), 0)
    >>> [round(float(v), 4) for v in losses[0]], valid.numpy().tolist()
    ([1.3863, 0.0], [[True, False]])
    """
    if dtype is not None:
        logits = tf.cast(logits, dtype)
    valid = tf.not_equal(y_true, pad_id)
    labels = tf.where(valid, y_true, tf.zeros_like(y_true))
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    if label_smoothing:
        losses = (1.0 - label_smoothing) * losses + label_smoothing * uniform_cross_entropy(logits)
    return tf.where(valid, losses, tf.zeros_like(losses)), valid


@tf.custom_gradient
def uniform_cross_entropy(logits):
    """Cross-entropy of the softmax of `logits` against the uniform distribution over the
    last axis, `logsumexp(logits) - mean(logits)`, with its gradient `softmax(logits) -
    1 / V` written out.

    The written-out gradient keeps this kernel's backward pass free of tensor shapes
    computed in its forward pass: TensorFlow's own gradients of `reduce_logsumexp`
    and `reduce_mean` pass such shapes from the forward to the backward function,
    and inside an XLA-compiled training step XLA then needs every input of this
    function (the batch, the weights) as compile-time constants, so it recompiled
    the step at every batch (seen as 12-15 s per step of the tiny translation model
    with `--xla on` on 2 CPU cores, instead of 0.2 s).

    Example:

    >>> round(float(uniform_cross_entropy(tf.zeros([4]))), 4)  # log(4): already uniform
    1.3863
    """
    value = tf.reduce_logsumexp(logits, axis=-1) - tf.reduce_mean(logits, axis=-1)

    def gradient(upstream):
        classes = tf.cast(tf.shape(logits)[-1], logits.dtype)
        return upstream[..., tf.newaxis] * (tf.nn.softmax(logits) - 1.0 / classes)

    return value, gradient


_compiled_masked_token_losses = tf.function(masked_token_losses, jit_compile=True, autograph=False)


@keras.saving.register_keras_serializable(package="tfdist")
class MaskedSparseCategoricalCrossentropy(keras.losses.SparseCategoricalCrossentropy):
    """Sparse categorical cross-entropy over non-pad target tokens only.

    Keras's own `SparseCategoricalCrossentropy(ignore_class=pad_id)`, with
    `from_logits=True` by default and helpers for distributed training.
    Per-token losses are zero at pad targets and carry a Keras mask, so the
    Keras reductions mean:

    * `"sum_over_batch_size"` (default) / `"mean"`: sum over non-pad tokens
      divided by their number (0 when there are none). Under a
      `tf.distribute` strategy Keras also divides by the number of replicas
      (`keras.losses.loss.scale_loss_for_distribution`), which gives the
      global mean only if every replica holds the same number of real tokens.
    * `"sum"`: sum over non-pad tokens, never rescaled.
    * `None` / `"none"`: per-token losses `[batch, seq]`, zeros at pads.

    Exact global mean on N replicas (what a distributed training step
    should do): in each replica compute `loss_sum, count =
    loss.sum_and_count(y, logits)`, all-reduce (SUM) `count` to
    `global_count`, and differentiate `loss_sum / global_count`. Summed over
    replicas, both that value and its gradient equal the single-device mean
    over the whole global batch, for any split of pad tokens:
    `sum_r loss_sum_r / sum_r count_r`. (Keras 3 optimizers sum gradients
    across replicas in `apply`: `keras/src/backend/tensorflow/optimizer.py`.)

    Speed: from logits, the per-token losses come from `masked_token_losses`
    (one fused kernel, no masked copy of the logits), by default compiled
    with XLA on its own (`jit_compile=True`), so that the softmax, the
    cross-entropy, the masking and their gradient run as a few fused loops
    over the `[batch, seq, vocab]` logits even when the rest of the step is
    not compiled (bfloat16 on CPUs, where TensorFlow's own matmul kernels
    beat XLA's). Over an 8,000-token vocabulary that takes the loss's
    forward and backward from 119 to 59 ms for 4,096 tokens (README,
    Performance); values agree with the uncompiled kernel to float32
    rounding (tested to 1e-6 relative, gradients to 1e-5). A batch of a new
    shape compiles once more; `jit_compile=False` keeps the plain kernel.
    Logits of a narrower type (bfloat16 under `mixed_bfloat16`) are cast to
    `dtype` inside that kernel, and their gradient cast back there
    (`casts_logits_itself`): tfdist's engine hands them over as the model
    made them, so the `[batch, seq, vocab]` logits and their gradient are
    never written out in float32: the same bits, and 100 instead of 110 ms
    for the forward and backward of a `[4096, 256] x [256, 8000]` bfloat16
    output layer and this loss on an AMD EPYC Zen 5 (Experiment notes).
    tfdist's own language models end in a float32 `logits` layer, as
    Keras's mixed-precision guide advises, so they hand it float32 logits
    and do not take this path.

    Args:
        pad_id: target id to ignore. Defaults to 0.
        from_logits: whether `y_pred` holds logits (True, the default, for
            tfdist's models) or probabilities.
        reduction: a Keras reduction, see above.
        name: name of the loss.
        dtype: dtype of the loss computation; defaults to `keras.backend.floatx()`
            (float32), also under a mixed-precision policy.
        jit_compile: compile the per-token loss with XLA (see Speed).
        label_smoothing: probability mass e in [0, 1) spread uniformly over
            the vocabulary at each non-pad target (pad targets still count
            0); needs `from_logits=True`. The Transformer's 0.1 for
            translation.

    Example:

    >>> loss = MaskedSparseCategoricalCrossentropy()
    >>> y_true = np.array([[5, 6, 0]])          # the last token is padding
    >>> logits = np.random.randn(1, 3, 8).astype("float32")
    >>> value = loss(y_true, logits)           # mean over the 2 real tokens
    >>> loss_sum, count = loss.sum_and_count(y_true, logits)  # count == 2.0
    """

    def __init__(self, pad_id=0, from_logits=True, reduction="sum_over_batch_size",
                 name="masked_sparse_categorical_crossentropy", dtype=None, jit_compile=True,
                 label_smoothing=0.0):
        pad_id = _check_pad_id(pad_id)
        check_number("label_smoothing", label_smoothing, at_least=0, below=1,
                     hint="0 turns it off, 0.1 is the Transformer's")
        if label_smoothing and not from_logits:
            raise ValueError("label_smoothing needs from_logits=True (the loss smooths the "
                             "softmax of logits); pass logits, or label_smoothing=0.")
        super().__init__(from_logits=from_logits, ignore_class=pad_id,
                         reduction=reduction, name=name, dtype=dtype)
        self.pad_id = pad_id
        self.jit_compile = bool(jit_compile)
        self.label_smoothing = float(label_smoothing)

    @property
    def casts_logits_itself(self):
        """Whether `call` takes logits of any float type and casts them to `dtype`
        itself, inside its kernel (so from logits): then tfdist's engine
        (`tfdist.training.loss.GlobalLoss`) passes them in their own type.

        Example:

        >>> MaskedSparseCategoricalCrossentropy().casts_logits_itself
        True
        """
        return self.from_logits

    def call(self, y_true, y_pred):
        """Per-token losses `[batch, seq]` (0 at pads, with a Keras mask of real tokens).

        Example:

        >>> MaskedSparseCategoricalCrossentropy().call(np.array([[3, 0]]), np.zeros((1, 2, 4)))
        """
        if not self.from_logits:
            return super().call(y_true, y_pred)
        y_pred = tf.convert_to_tensor(y_pred)
        y_true = tf.cast(tf.convert_to_tensor(y_true), tf.int32)
        if y_true.shape.rank == y_pred.shape.rank and y_true.shape[-1] == 1:
            y_true = tf.squeeze(y_true, -1)
        compute = _compiled_masked_token_losses if self.jit_compile else masked_token_losses
        losses, valid = compute(y_true, y_pred, self.pad_id, self.label_smoothing, self.dtype)
        set_keras_mask(losses, valid)
        return losses

    def per_token(self, y_true, y_pred):
        """Per-token losses `[batch, seq]`, zeros at pad targets.

        Args:
            y_true: int targets `[batch, seq]`.
            y_pred: logits (or probabilities) `[batch, seq, vocab]`.

        Example:

        >>> losses = MaskedSparseCategoricalCrossentropy().per_token(
        ...     np.array([[3, 0]]), np.zeros((1, 2, 4), "float32"))
        >>> [round(float(v), 4) for v in np.asarray(losses)[0]]  # [log 4, 0]
        [1.3863, 0.0]
        """
        y_pred = ops.convert_to_tensor(y_pred, dtype=None if self.from_logits else self.dtype)
        y_true = ops.convert_to_tensor(y_true, dtype=self.dtype)
        return self.call(y_true, y_pred)

    def count_tokens(self, y_true, sample_weight=None):
        """Number of non-pad target tokens (their summed `sample_weight` if given).

        Args:
            y_true: int targets `[batch, seq]`.
            sample_weight: optional weights `[batch]` or `[batch, seq]`.

        Returns:
            A scalar in `self.dtype`.

        Example:

        >>> float(MaskedSparseCategoricalCrossentropy().count_tokens(np.array([[4, 5, 0]])))
        2.0
        """
        return ops.sum(_token_weights(y_true, self.pad_id, sample_weight, self.dtype))

    def sum_and_count(self, y_true, y_pred, sample_weight=None):
        """Summed loss over non-pad tokens and the number of those tokens.

        `loss_sum / count` is the default (mean) reduction on one device; for
        the exact global mean on several replicas divide each replica's
        `loss_sum` by the all-reduced sum of the `count`s (see the class
        docstring).

        Args:
            y_true: int targets `[batch, seq]`.
            y_pred: logits (or probabilities) `[batch, seq, vocab]`.
            sample_weight: optional weights `[batch]` or `[batch, seq]`,
                applied to both the sum and the count.

        Returns:
            `(loss_sum, count)`, two scalars in `self.dtype`.

        Example:

        >>> loss = MaskedSparseCategoricalCrossentropy()
        >>> loss_sum, count = loss.sum_and_count(np.array([[3, 0]]),
        ...                                      np.zeros((1, 2, 4), "float32"))
        >>> float(count)
        1.0
        """
        weights = _token_weights(y_true, self.pad_id, sample_weight, self.dtype)
        losses = self.per_token(y_true, y_pred)
        return ops.sum(losses * weights), ops.sum(weights)

    def get_config(self):
        config = keras.losses.Loss.get_config(self)
        config.update({"pad_id": self.pad_id, "from_logits": self.from_logits,
                       "jit_compile": self.jit_compile,
                       "label_smoothing": self.label_smoothing})
        return config


@keras.saving.register_keras_serializable(package="tfdist")
class MaskedAccuracy(keras.metrics.Metric):
    """Token accuracy (`argmax(y_pred) == y_true`) over non-pad targets only.

    Keeps two sums, correct tokens and counted tokens, in variables that
    Keras creates with `aggregation="sum"` (SyncOnRead under a
    `tf.distribute` strategy), so `result()` is exactly
    `sum_r correct_r / sum_r count_r` over replicas: the single-device value
    of the global batch, whatever the split of pad tokens.

    Args:
        pad_id: target id to ignore. Defaults to 0.
        name: name of the metric.
        dtype: dtype of the sums and the result; defaults to float32.

    Example:

    >>> metric = MaskedAccuracy()
    >>> logits = np.eye(6, dtype="float32")[[[4, 5, 1]]]  # predicts 4, 5, 1
    >>> metric.update_state(np.array([[4, 2, 0]]), logits)
    >>> float(metric.result())                             # 1 of 2 real tokens
    0.5
    """

    def __init__(self, pad_id=0, name="masked_accuracy", dtype=None):
        pad_id = _check_pad_id(pad_id)
        super().__init__(name=name, dtype=dtype)
        self.pad_id = pad_id
        declare_metric_direction(self, "up")
        self.correct = self.add_variable(shape=(), initializer="zeros", dtype=self.dtype,
                                         aggregation="sum", name="correct")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype=self.dtype,
                                       aggregation="sum", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        """Adds a batch.

        Args:
            y_true: int targets `[batch, seq]` (or `[batch, seq, 1]`).
            y_pred: scores `[batch, seq, vocab]` (logits or probabilities).
            sample_weight: optional weights `[batch]` or `[batch, seq]`.

        Example:

        >>> MaskedAccuracy().update_state(np.array([[4]]), np.ones((1, 1, 6)))
        """
        y_pred = ops.convert_to_tensor(y_pred)
        y_true = ops.cast(ops.convert_to_tensor(y_true), "int32")
        if len(y_true.shape) == len(y_pred.shape) and y_true.shape[-1] == 1:
            y_true = ops.squeeze(y_true, -1)
        # tf.argmax, not keras.ops.argmax: Keras first rewrites -0.0 in a
        # float32 copy of all the scores (four passes over [batch, seq, vocab],
        # 3x the time of the argmax itself); for accuracy -0.0 == 0.0 is fine.
        predicted = tf.argmax(y_pred, axis=-1, output_type=tf.int32)
        weights = _token_weights(y_true, self.pad_id, sample_weight, self.dtype)
        matches = ops.cast(ops.equal(predicted, y_true), self.dtype)
        self.correct.assign_add(ops.sum(matches * weights))
        self.count.assign_add(ops.sum(weights))

    def result(self):
        """Correct / counted tokens so far (0 before any real token).

        Example:

        >>> float(MaskedAccuracy().result())
        0.0
        """
        return ops.divide_no_nan(self.correct, self.count)

    def get_config(self):
        return {"pad_id": self.pad_id, "name": self.name, "dtype": self.dtype}
