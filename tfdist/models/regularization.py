"""Regularisation for tfdist's models: weight decay that skips batch-norm and
bias parameters, and label smoothing on integer labels.

Weight decay in Keras 3 optimizers is decoupled: every step, before the
gradient update, each decayed variable becomes `v - learning_rate *
weight_decay * v` (Keras's decoupled weight-decay step), for SGD as for
AdamW, and it does not pass through momentum. PyTorch's `SGD(weight_decay=)`
instead adds `weight_decay * v` to the gradient (L2), which momentum then
amplifies by about `1 / (1 - momentum)`; the classic ResNet recipe (L2 1e-4,
momentum 0.9) therefore corresponds to a Keras `weight_decay` of roughly 1e-3,
not 1e-4. By default Keras decays every trainable variable, including batch
norm's gamma/beta and biases; `exclude_from_weight_decay` below restricts it
to the weight matrices and convolution kernels (Goyal et al. 2017, "Accurate,
Large Minibatch SGD", section 5.1 and its "no bias decay" practice).

Example:

    model = build_resnet("resnet_tiny", 10, (32, 32, 3))
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=1e-3)
    exclude_from_weight_decay(optimizer, model)     # before the first step
    model.compile(optimizer, loss=sparse_label_smoothing_loss(10, 0.1))
"""

import keras
from keras import ops

from tfdist.runtime.argtypes import check_int_at_least, check_number


def is_weight_decayed(variable):
    """Whether a variable should be weight-decayed: True for kernels (rank >= 2).

    Convolution kernels, Dense kernels and embeddings (rank >= 2) are decayed;
    biases and normalisation scales/offsets (gamma, beta: rank 1) and scalars
    are not. This is the common rank rule (e.g. timm, nanoGPT).

    Args:
        variable: a `keras.Variable` (or anything with a `shape`).

    Returns:
        A bool.

    Example:

    >>> layer = keras.layers.Dense(3); layer.build((None, 4))
    >>> is_weight_decayed(layer.kernel), is_weight_decayed(layer.bias)
    (True, False)
    """
    return len(variable.shape) >= 2


def decay_mask(model):
    """Maps each trainable variable's path to whether it is weight-decayed.

    Args:
        model: a built `keras.Model` (or Layer).

    Returns:
        A dict `{variable.path: bool}` in the order of
        `model.trainable_variables`; see `is_weight_decayed` for the rule.

    Example:

    >>> mask = decay_mask(build_resnet("resnet_tiny", 10, (32, 32, 3)))
    >>> mask["stem_conv/kernel"], mask["stem_bn/gamma"], mask["classifier/bias"]
    (True, False, False)
    """
    return {v.path: is_weight_decayed(v) for v in model.trainable_variables}


def no_decay_variables(model):
    """Returns the trainable variables of `model` that must not be weight-decayed.

    Args:
        model: a built `keras.Model` (or Layer).

    Returns:
        A list of variables: biases, batch/layer-norm gamma and beta, scalars.

    Example:

    >>> names = {v.name for v in no_decay_variables(model)}   # {"gamma", "beta", "bias"}
    """
    return [v for v in model.trainable_variables if not is_weight_decayed(v)]


def exclude_from_weight_decay(optimizer, model, var_names=None):
    """Makes `optimizer` skip the weight decay of `model`'s BN and bias parameters.

    Calls Keras's `optimizer.exclude_from_weight_decay(var_list=..., var_names=...)`
    with `no_decay_variables(model)`. Call it after the model is built and
    before the optimizer is built (before its first `apply`/training step),
    on the same objects the training uses (under a strategy: the model and
    optimizer created in `strategy.scope()`). Keras replaces, rather than
    extends, any previous exclusion; pass extra name fragments in `var_names`.

    Args:
        optimizer: a `keras.optimizers.Optimizer`, not yet built. With
            `weight_decay=None` there is nothing to exclude from, and this
            only records the list.
        model: a built `keras.Model` whose variables the optimizer will train.
        var_names: optional list of strings; variables whose name contains
            any of them are excluded as well.

    Returns:
        `optimizer`, for chaining.

    Raises:
        ValueError: the optimizer is already built (Keras 3.15's own check
            looks at an attribute that does not exist and lets this through,
            while a traced training step keeps its old decision), or the model
            has no variables yet.
        TypeError: `optimizer` is not a Keras optimizer.

    Example:

    >>> optimizer = keras.optimizers.SGD(0.1, weight_decay=1e-4)
    >>> exclude_from_weight_decay(optimizer, model) is optimizer
    True
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"Expected a keras.optimizers.Optimizer, got "
                        f"{type(optimizer).__name__}.")
    if getattr(optimizer, "built", False):
        raise ValueError(
            f"Optimizer {optimizer.name!r} is already built; call "
            "exclude_from_weight_decay(optimizer, model) before its first step "
            "(and before optimizer.build()).")
    if not model.trainable_variables:
        raise ValueError(f"Model {model.name!r} has no trainable variables; build it "
                         "(call it on data or give it an Input) first.")
    optimizer.exclude_from_weight_decay(var_list=no_decay_variables(model),
                                        var_names=list(var_names or []))
    return optimizer


# ------------------------------------------------------------ label smoothing


@keras.saving.register_keras_serializable(package="tfdist")
class SparseLabelSmoothingCrossentropy(keras.losses.Loss):
    """Categorical cross-entropy with label smoothing, on integer labels.

    `keras.losses.CategoricalCrossentropy(label_smoothing=...)` needs one-hot
    labels and `SparseCategoricalCrossentropy` has no smoothing. This loss
    takes integer class ids and computes, per example,

        loss = -sum_k q_k log p_k,   q = (1 - smoothing) * one_hot(y) + smoothing / K

    the same value as `CategoricalCrossentropy(label_smoothing=smoothing)` on
    `one_hot(y, K)`. It is computed in float32 (the loss dtype) also under a
    mixed-precision policy. Labels outside `[0, num_classes)` are not checked
    (their one-hot row is all zeros).

    Args:
        num_classes: K, the number of classes (last axis of `y_pred`), >= 2.
        label_smoothing: probability mass spread uniformly over all classes,
            in [0, 1); 0 is plain sparse cross-entropy.
        from_logits: whether `y_pred` holds logits (True, the default, for
            tfdist's models) or probabilities.
        reduction: a Keras reduction ("sum_over_batch_size", "sum", None, ...).
        name: name of the loss.
        dtype: dtype of the computation; defaults to `keras.backend.floatx()`.

    Example:

    >>> loss = SparseLabelSmoothingCrossentropy(num_classes=4, label_smoothing=0.1)
    >>> round(float(loss(np.array([2]), np.zeros((1, 4), "float32"))), 4)  # log 4
    1.3863
    """

    def __init__(self, num_classes, label_smoothing=0.1, from_logits=True,
                 reduction="sum_over_batch_size",
                 name="sparse_label_smoothing_crossentropy", dtype=None):
        check_int_at_least("num_classes", num_classes, 2)
        check_number("label_smoothing", label_smoothing, at_least=0, below=1)
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.num_classes = int(num_classes)
        self.label_smoothing = float(label_smoothing)
        self.from_logits = bool(from_logits)

    def call(self, y_true, y_pred):
        """Per-example losses, shape `y_pred.shape[:-1]`.

        Args:
            y_true: integer class ids, shape `[batch]` or `[batch, 1]` (any
                leading shape matching `y_pred` without its last axis).
            y_pred: logits or probabilities `[batch, num_classes]`.

        Example:

        >>> SparseLabelSmoothingCrossentropy(3).call(np.array([0]), np.zeros((1, 3)))
        """
        y_pred = ops.convert_to_tensor(y_pred)
        y_true = ops.convert_to_tensor(y_true)
        if y_pred.shape[-1] is not None and y_pred.shape[-1] != self.num_classes:
            raise ValueError(
                f"y_pred has {y_pred.shape[-1]} classes on its last axis (shape "
                f"{tuple(y_pred.shape)}) but the loss was made with num_classes="
                f"{self.num_classes}.")
        if len(y_true.shape) == len(y_pred.shape) and y_true.shape[-1] == 1:
            y_true = ops.squeeze(y_true, axis=-1)
        labels = ops.cast(y_true, "int32")
        if self.from_logits:
            log_probs = ops.log_softmax(y_pred, axis=-1)
        else:
            probs = y_pred / ops.sum(y_pred, axis=-1, keepdims=True)
            epsilon = keras.backend.epsilon()
            log_probs = ops.log(ops.clip(probs, epsilon, 1.0 - epsilon))
        one_hot = ops.one_hot(labels, self.num_classes, dtype=log_probs.dtype)
        targets = (one_hot * (1.0 - self.label_smoothing)
                   + self.label_smoothing / self.num_classes)
        return -ops.sum(targets * log_probs, axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update({"num_classes": self.num_classes,
                       "label_smoothing": self.label_smoothing,
                       "from_logits": self.from_logits})
        return config


def sparse_label_smoothing_loss(num_classes, smoothing, from_logits=True):
    """Returns a label-smoothed cross-entropy loss for integer labels.

    A shorthand for `SparseLabelSmoothingCrossentropy(num_classes,
    label_smoothing=smoothing, from_logits=from_logits)` (mean over the batch),
    usable in `model.compile(loss=...)` and serialisable with the model.

    Args:
        num_classes: number of classes, >= 2.
        smoothing: label smoothing in [0, 1), e.g. 0.1 (Szegedy et al. 2016).
        from_logits: whether the model outputs logits (tfdist's models do).

    Returns:
        A `SparseLabelSmoothingCrossentropy`.

    Example:

    >>> model.compile("sgd", loss=sparse_label_smoothing_loss(10, 0.1))
    """
    return SparseLabelSmoothingCrossentropy(num_classes, label_smoothing=smoothing,
                                            from_logits=from_logits)
