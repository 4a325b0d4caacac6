"""The cross-entropy of logits split by vocabulary, without gathering them.

When the model's output projection is column-parallel (a `Dense(vocab)`
laid out `(None, "model")`, such as the decoder LM's `lm_head`), each device
holds the logits of its slice of the vocabulary, `[batch, seq, V/K]`. The
split layer also concatenates them on the first device for whatever reads
the whole tensor, but the loss need not: each shard reduces its slice to
four numbers per token, on its own device (forward and backward):

* `m_i`, the slice's largest logit (no gradient: it only keeps `exp` finite),
* `s_i = sum exp(logits_i - m_i)`,
* `t_i`, the target's logit when the target falls in the slice, else 0,
* `u_i = sum logits_i` (for label smoothing),

and the first device combines them: `logZ = m + log(sum_i s_i exp(m_i - m))`
with `m = max_i m_i`, the cross-entropy `logZ - sum_i t_i`, and with label
smoothing e, `(1 - e) (logZ - t) + e (logZ - sum_i u_i / V)`. So only
`4 x [batch, seq]` values per shard cross devices instead of the
`[batch, seq, V]` logits, and the gradient each shard receives is its
slice of `softmax - target`, computed on its device (Megatron-LM's
vocabulary-parallel cross-entropy). A graph that reads the whole logits
otherwise (a compiled accuracy metric) still gathers them for that.

`VocabParallelCrossEntropy` wraps the compiled loss of the split copy
(`keras.losses.SparseCategoricalCrossentropy(from_logits=True)` with or
without `ignore_class`, `tfdist.models.MaskedSparseCategoricalCrossentropy`
from logits, with label smoothing): same values, reduction and masks, from
the pieces when the predictions carry them, from the whole logits when not
(under a mixed policy the float32 output layer casts the logits and the
pieces are not carried through).

Example:

    loss = VocabParallelCrossEntropy(MaskedSparseCategoricalCrossentropy())
    per_token = loss.call(y_true, split_model(x))   # reads the shards' logits
"""

import keras
import tensorflow as tf

from tfdist.seam import set_keras_mask
from tfdist.training.tensor_parallel.layers import attach_pieces, on_device, pieces_of


def vocab_parallel_token_losses(pieces, labels, label_smoothing=0.0):
    """Per-token cross-entropy `[batch, seq]` from logits split by vocabulary.

    Args:
        pieces: the K logit slices `[..., V_i]`, in vocabulary order, each on
            its device (`tensor.device`).
        labels: int targets `[...]` in `[0, V)` (callers replace ignored
            targets by a valid class and mask the result).
        label_smoothing: e in [0, 1).

    Returns:
        A float tensor of the pieces' dtype on the first piece's device.

    Example:

    >>> losses = vocab_parallel_token_losses((logits[..., :4], logits[..., 4:]), labels)
    """
    widths = [int(piece.shape[-1]) for piece in pieces]
    vocab = sum(widths)
    offsets = [sum(widths[:i]) for i in range(len(widths))]
    first = pieces[0].device or None
    stats = []
    for piece, offset, width in zip(pieces, offsets, widths, strict=True):
        def reduce_slice(logits, targets=labels, offset=offset, width=width):
            peak = tf.stop_gradient(tf.reduce_max(logits, axis=-1))
            total = tf.reduce_sum(tf.exp(logits - peak[..., tf.newaxis]), axis=-1)
            local = targets - offset
            inside = tf.logical_and(local >= 0, local < width)
            picked = tf.gather(logits, tf.clip_by_value(local, 0, width - 1)[..., tf.newaxis],
                               batch_dims=len(targets.shape))[..., 0]
            target = tf.where(inside, picked, tf.zeros_like(picked))
            return peak, total, target, tf.reduce_sum(logits, axis=-1)
        stats.append(on_device(piece.device or first, reduce_slice, piece))
    with tf.device(first):
        peaks = tf.stack([s[0] for s in stats])
        peak = tf.reduce_max(peaks, axis=0)
        total = tf.add_n([s[1] * tf.exp(s[0] - peak) for s in stats])
        log_z = peak + tf.math.log(total)
        losses = log_z - tf.add_n([s[2] for s in stats])
        if label_smoothing:
            mean = tf.add_n([s[3] for s in stats]) / tf.cast(vocab, log_z.dtype)
            losses = (1.0 - label_smoothing) * losses + label_smoothing * (log_z - mean)
        return losses


@keras.saving.register_keras_serializable(package="tfdist")
class SliceKeepingLinear(keras.layers.Activation):
    """A linear `Activation` (such as a model's float32 `logits` layer) that casts each
    vocabulary slice on its device and keeps the slices on its output.

    Under a mixed policy the column-parallel output projection computes its
    slices in the compute dtype; a float32 `logits` layer would cast the
    gathered logits into a new tensor without them, and the loss would read
    the gathered logits. This layer does the same cast slice by slice.

    Example:

    >>> layer = SliceKeepingLinear.from_activation(model.get_layer("logits"))
    """

    def __init__(self, **kwargs):
        kwargs.pop("activation", None)
        kwargs["autocast"] = False  # the cast is done here, slice by slice
        super().__init__("linear", **kwargs)

    @classmethod
    def from_activation(cls, layer):
        """The replacement of a linear `keras.layers.Activation` (same name, dtype policy).

        Example:

        >>> SliceKeepingLinear.from_activation(keras.layers.Activation("linear", name="logits"))
        <SliceKeepingLinear name=logits, built=False>
        """
        return cls(name=layer.name, dtype=layer.dtype_policy, trainable=layer.trainable)

    def call(self, inputs):
        pieces = pieces_of(inputs)
        output = tf.cast(inputs, self.compute_dtype)
        if pieces is not None:
            cast = []
            for piece in pieces:
                with tf.device(piece.device or None):
                    cast.append(tf.cast(piece, self.compute_dtype))
            attach_pieces(output, cast)  # an eager tensor takes none: the loss reads it whole
        return output

    def get_config(self):
        config = super().get_config()
        config.pop("activation", None)
        return config


def vocab_parallel_loss_of(loss):
    """`VocabParallelCrossEntropy(loss)` when `loss` is a cross-entropy from logits it can
    compute from vocabulary slices, else None.

    Example:

    >>> vocab_parallel_loss_of(keras.losses.MeanSquaredError()) is None
    True
    """
    if isinstance(loss, keras.losses.SparseCategoricalCrossentropy) and loss.from_logits:
        return VocabParallelCrossEntropy(loss)
    return None


@keras.saving.register_keras_serializable(package="tfdist")
class VocabParallelCrossEntropy(keras.losses.Loss):
    """A sparse cross-entropy from logits that reads vocabulary-split logits shard by shard.

    Args:
        loss: the wrapped `keras.losses.SparseCategoricalCrossentropy(from_logits=True)`
            (or its subclass `tfdist.models.MaskedSparseCategoricalCrossentropy`); its
            name, reduction, dtype, ignored class and label smoothing are kept.

    Example:

    >>> loss = VocabParallelCrossEntropy(keras.losses.SparseCategoricalCrossentropy(
    ...     from_logits=True))
    >>> loss.call(y_true, split_model(x)).shape   # per token, from the pieces
    TensorShape([8, 16])
    """

    def __init__(self, loss):
        if isinstance(loss, dict):
            loss = keras.saving.deserialize_keras_object(loss)
        super().__init__(name=loss.name, reduction=loss.reduction, dtype=loss.dtype)
        self.wrapped = loss

    def call(self, y_true, y_pred):
        pieces = pieces_of(y_pred)
        if pieces is None:
            return self.wrapped.call(y_true, y_pred)
        labels = tf.cast(tf.convert_to_tensor(y_true), tf.int32)
        if labels.shape.rank == len(pieces[0].shape) and labels.shape[-1] == 1:
            labels = tf.squeeze(labels, -1)
        ignored = getattr(self.wrapped, "pad_id", getattr(self.wrapped, "ignore_class", None))
        smoothing = getattr(self.wrapped, "label_smoothing", 0.0)
        if ignored is None:
            return vocab_parallel_token_losses(pieces, labels, smoothing)
        valid = tf.not_equal(labels, ignored)
        losses = vocab_parallel_token_losses(
            pieces, tf.where(valid, labels, tf.zeros_like(labels)), smoothing)
        losses = tf.where(valid, losses, tf.zeros_like(losses))
        set_keras_mask(losses, valid)
        return losses

    def get_config(self):
        return {"loss": keras.saving.serialize_keras_object(self.wrapped)}
