"""A Keras loss split into per-replica pieces that add up to the global loss.

Keras reduces a loss on each replica's own slice of the batch and then divides
by the number of replicas. That is only the single-device value when every
replica sees the same number of loss elements. With a padding mask, sample
weights under `"mean_with_sample_weight"`, or a short last batch, replicas
count different numbers of elements and the average of per-replica means is
not the mean over the global batch.

`GlobalLoss` instead returns, for one replica, the *numerator* (the weighted,
masked sum of the loss elements) and the *count* that the loss's reduction
divides by. Summed over all replicas (and accumulation micro-batches) they give
exactly the value a single device computes on the whole batch:

    loss = sum(numerators) / sum(counts)    # "sum_over_batch_size", "mean",
                                            # "mean_with_sample_weight"
    loss = sum(numerators)                  # "sum"
"""

import keras
from keras import ops
from keras.src import tree
from keras.src.backend.common.masking import get_keras_mask
from keras.src.losses.loss import squeeze_or_expand_to_same_rank
from keras.src.losses.losses import LossFunctionWrapper

NORMALIZED_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")
SUPPORTED_REDUCTIONS = NORMALIZED_REDUCTIONS + ("sum",)


class GlobalLoss:
    """Wraps a Keras loss so that it can be reduced over the global batch.

    The wrapped loss's `call` gives the unreduced loss elements; Keras masking
    (the `_keras_mask` of the predictions or of the loss elements) and
    `sample_weight` are applied exactly as `keras.losses.Loss.__call__` does,
    but the reduction is split into a numerator and a count so that the engine
    can add them up across replicas, workers and accumulation steps.

    Args:
        loss: a `keras.losses.Loss` instance, the name of a Keras loss
            (e.g. `"mse"`, `"sparse_categorical_crossentropy"`), or a function
            `fn(y_true, y_pred)` returning per-sample (or per-element) losses.
            Its reduction must be one of `SUPPORTED_REDUCTIONS`.

    Raises:
        ValueError: the loss is missing or unknown, or its reduction is `None`
            / `"none"` (an unreduced loss has no global value).

    Example:

    >>> global_loss = GlobalLoss("mse")
    >>> numerator, count = global_loss.local_terms(y_true, y_pred)
    >>> # one device: numerator / count == keras.losses.get("mse")-style mean
    """

    def __init__(self, loss):
        if loss is None:
            raise ValueError(
                "A loss is required: pass a keras.losses.Loss instance, the name "
                "of a Keras loss such as 'sparse_categorical_crossentropy', or a "
                "function fn(y_true, y_pred)."
            )
        resolved = keras.losses.get(loss) if isinstance(loss, (str, dict)) else loss
        if resolved is None:
            raise ValueError(f"Unknown loss {loss!r}.")
        if isinstance(resolved, keras.losses.Loss):
            self.loss = resolved
        elif callable(resolved):
            self.loss = LossFunctionWrapper(resolved, name=getattr(resolved, "__name__", None))
        else:
            raise ValueError(
                f"Cannot use {loss!r} (type {type(loss).__name__}) as a loss: expected "
                "a keras.losses.Loss instance, a loss name, or a function "
                "fn(y_true, y_pred)."
            )
        reduction = self.loss.reduction
        if reduction not in SUPPORTED_REDUCTIONS:
            raise ValueError(
                f"The loss {self.loss.name!r} has reduction={reduction!r}, which has no "
                "value over a global batch. Allowed reductions: "
                f"{', '.join(SUPPORTED_REDUCTIONS)}."
            )

    @property
    def reduction(self):
        """The reduction of the wrapped Keras loss (a string)."""
        return self.loss.reduction

    @property
    def normalized(self):
        """True when the global loss is `sum(numerators) / sum(counts)`,
        False for `"sum"` (the global loss is `sum(numerators)`)."""
        return self.reduction in NORMALIZED_REDUCTIONS

    def local_terms(self, y_true, y_pred, sample_weight=None):
        """Returns `(numerator, count)` for one replica's slice of the batch.

        Args:
            y_true: targets of this replica's batch (a tensor or a structure
                matching `y_pred`).
            y_pred: the model's predictions; a Keras mask attached to them is
                honoured.
            sample_weight: optional weights, broadcast like Keras does.

        Returns:
            Two float32 scalars. `numerator` is the weighted, masked sum of
            the loss elements. `count` is what this replica contributes to the
            reduction's divisor: the number of (unmasked) elements for
            `"sum_over_batch_size"`/`"mean"`, the sum of the effective weights
            for `"mean_with_sample_weight"`, and 1 for `"sum"` (unused).

        Example:

        >>> n, c = GlobalLoss("mse").local_terms(y, model(x))
        """
        loss = self.loss
        in_mask = tree.map_structure(get_keras_mask, y_pred)
        in_mask = in_mask if not isinstance(in_mask, (list, tuple, dict)) else None
        dtype = loss.dtype
        with keras.name_scope(loss.name):
            y_pred = tree.map_structure(lambda t: ops.convert_to_tensor(t, dtype=dtype), y_pred)
            y_true = tree.map_structure(lambda t: ops.convert_to_tensor(t, dtype=dtype), y_true)
            values = loss.call(y_true, y_pred)
            out_mask = get_keras_mask(values)
            values = ops.convert_to_tensor(values, dtype=dtype)
            mask = _combine_masks(in_mask, out_mask)
            weights = None
            if sample_weight is not None:
                weights = ops.convert_to_tensor(sample_weight, dtype=dtype)
            if mask is not None:
                float_mask = ops.cast(mask, dtype)
                if weights is not None:
                    float_mask, weights = squeeze_or_expand_to_same_rank(float_mask, weights)
                    weights = weights * float_mask
                else:
                    weights = float_mask
            if weights is not None:
                values, weights = squeeze_or_expand_to_same_rank(values, weights)
                values = values * weights
            if len(values.shape) == 0:
                # The loss reduced itself: one value per replica.
                return _f32(values), _f32(ops.ones(()))
            numerator = ops.sum(values)
            if self.reduction == "sum":
                count = ops.ones(())
            elif self.reduction == "mean_with_sample_weight" and weights is not None:
                count = ops.sum(weights)
            elif mask is not None and self.reduction != "mean_with_sample_weight":
                count = ops.sum(ops.cast(mask, dtype))
            else:
                count = ops.cast(ops.size(values), dtype)
        return _f32(numerator), _f32(count)


def _combine_masks(in_mask, out_mask):
    if in_mask is not None and out_mask is not None:
        return ops.logical_and(ops.cast(in_mask, "bool"), ops.cast(out_mask, "bool"))
    return in_mask if in_mask is not None else out_mask


def _f32(x):
    return ops.cast(x, "float32")
