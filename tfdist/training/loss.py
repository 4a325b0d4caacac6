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

import collections

import keras
from keras import ops, tree

from tfdist.seam import (compile_loss_entries, compile_loss_entries_replaced, get_keras_mask,
                         keras_loss_function_wrapper, squeeze_or_expand_to_same_rank)

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
            self.loss = keras_loss_function_wrapper(resolved, name=getattr(resolved, "__name__", None))
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

    def local_terms(self, y_true, y_pred, sample_weight=None, return_kind=False):
        """Returns `(numerator, count)` for one replica's slice of the batch.

        Args:
            y_true: targets of this replica's batch (a tensor or a structure
                matching `y_pred`).
            y_pred: the model's predictions; a Keras mask attached to them is
                honoured. They are converted to the loss's dtype first, as
                Keras does, unless the loss says it casts them itself
                (`casts_logits_itself`, tfdist's masked cross-entropy).
            sample_weight: optional weights, broadcast like Keras does.
            return_kind: also return what the count is (a Python string
                known when tracing): `"size"` (the number of loss elements,
                proportional to the batch when the shapes are), `"mask"`
                (unmasked elements), `"weights"` (the sum of the sample
                weights) or `"one"` (`"sum"`, or a loss that reduced itself).

        Returns:
            Two float32 scalars. `numerator` is the weighted, masked sum of
            the loss elements. `count` is what this replica contributes to the
            reduction's divisor: the number of (unmasked) elements for
            `"sum_over_batch_size"`/`"mean"`, the sum of the effective weights
            for `"mean_with_sample_weight"`, and 1 for `"sum"` (unused).
            With `return_kind`, `(numerator, count, kind)`.

        Example:

        >>> n, c = GlobalLoss("mse").local_terms(y, model(x))
        """
        loss = self.loss
        in_mask = tree.map_structure(get_keras_mask, y_pred)
        in_mask = in_mask if not isinstance(in_mask, (list, tuple, dict)) else None
        dtype = loss.dtype
        # A loss that casts its logits itself (tfdist's masked cross-entropy, inside
        # its compiled kernel) gets them in the model's type: no float32 copy.
        pred_dtype = None if getattr(loss, "casts_logits_itself", False) is True else dtype
        with keras.name_scope(loss.name):
            y_pred = tree.map_structure(lambda t: ops.convert_to_tensor(t, dtype=pred_dtype),
                                        y_pred)
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
                numerator, count, kind = values, ops.ones(()), "one"
            else:
                numerator = ops.sum(values)
                if self.reduction == "sum":
                    count, kind = ops.ones(()), "one"
                elif self.reduction == "mean_with_sample_weight" and weights is not None:
                    count, kind = ops.sum(weights), "weights"
                elif mask is not None and self.reduction != "mean_with_sample_weight":
                    count, kind = ops.sum(ops.cast(mask, dtype)), "mask"
                else:
                    count, kind = ops.cast(ops.size(values), dtype), "size"
        if return_kind:
            return _f32(numerator), _f32(count), kind
        return _f32(numerator), _f32(count)


def _combine_masks(in_mask, out_mask):
    if in_mask is not None and out_mask is not None:
        return ops.logical_and(ops.cast(in_mask, "bool"), ops.cast(out_mask, "bool"))
    return in_mask if in_mask is not None else out_mask


def _f32(x):
    return ops.cast(x, "float32")


class LossTerm(collections.namedtuple("LossTerm", ["numerator", "count", "kind"])):
    """One compiled loss's share of a replica's batch (see `GlobalLoss.local_terms`).

    Example:

    >>> LossTerm(numerator, count, "size")
    """


class GlobalCompileLoss:
    """The loss a model was compiled with, split into per-replica terms.

    `model.compile(loss=..., loss_weights=...)` accepts one loss, or one per
    output as a list, a dict keyed by output name or a nested structure, and
    Keras's `CompileLoss` matches them to the outputs and the targets. This
    class reuses that matching (it runs `CompileLoss.call` with each of its
    resolved losses replaced by a recorder) and reduces every loss with
    `GlobalLoss`, so that each term can be summed across replicas, workers
    and accumulation steps. The global value of the compiled loss is then
    `sum_k weight_k * N_k / C_k` (Keras's total), and `N_k / C_k` is what
    Keras logs as `<output>_loss` when there are several losses.

    Args:
        compile_loss: the model's compiled loss, Keras's `CompileLoss`
            (`tfdist.seam.model_compile_loss(model)`), already built (the trainer builds it with
            the model).

    Raises:
        ValueError: a loss has a reduction without a global value (see
            `GlobalLoss`), or losses mix `"sum"` with a mean reduction.

    Example:

    >>> compiled = GlobalCompileLoss(seam.model_compile_loss(model))
    >>> compiled.names, compiled.weights
    (['priority', 'department'], [1.0, 0.2])
    >>> terms = compiled.local_terms(y_true, model(x), sample_weight=None)
    """

    def __init__(self, compile_loss):
        self.compile_loss = compile_loss
        flat = compile_loss_entries(compile_loss)
        self.losses = [GlobalLoss(entry.loss) for entry in flat]
        self.weights = [1.0 if entry.loss_weights is None else float(entry.loss_weights)
                        for entry in flat]
        self.names = [entry.name for entry in flat]
        self.trackers = list(compile_loss.metrics) if len(flat) > 1 else []
        kinds = {loss.normalized for loss in self.losses}
        if len(kinds) > 1:
            mixed = ", ".join(f"{name}: {loss.reduction!r}"
                              for name, loss in zip(self.names, self.losses))
            raise ValueError(
                f"The compiled losses mix the 'sum' reduction with a mean ({mixed}). "
                "Their total has no single divisor over the global batch; give every "
                "loss a mean reduction (the default 'sum_over_batch_size') or every "
                "loss reduction='sum'.")

    @property
    def normalized(self):
        """True when every loss divides by its count (no `"sum"` reduction)."""
        return self.losses[0].normalized

    def local_terms(self, y_true, y_pred, sample_weight=None):
        """Returns one `LossTerm` per compiled loss for this replica's batch.

        Args:
            y_true: the batch's targets, in any structure Keras's `fit`
                accepts for this model.
            y_pred: the model's outputs (Keras masks on them are honoured).
            sample_weight: a weight array, or one per output.

        Example:

        >>> [term.numerator for term in compiled.local_terms(y, model(x))]
        """
        terms = []

        def recorder(global_loss):
            def record(y_t, y_p, weights):
                terms.append(LossTerm(*global_loss.local_terms(y_t, y_p, weights,
                                                               return_kind=True)))
                return terms[-1].numerator
            return record

        compile_loss = self.compile_loss
        recorders = [entry._replace(loss=recorder(loss), loss_weights=None)
                     for entry, loss in zip(compile_loss_entries(compile_loss), self.losses)]
        # Keras's own per-output trackers would get per-replica values; the
        # trainer records the global ones instead.
        with compile_loss_entries_replaced(compile_loss, recorders):
            compile_loss.call(y_true, y_pred, sample_weight)
        return terms
