"""The ResNet family for tfdist's CNN recipe: named depths, ImageNet and
CIFAR stems, optional synchronised batch norm, and an analytic FLOP count.

Architecture (He et al. 2015, "Deep Residual Learning for Image
Recognition", Table 1), post-activation ("v1") blocks with the stride of a
bottleneck block on its 3x3 convolution ("v1.5", as in torchvision and NVIDIA's
reference), convolutions without bias (each is followed by batch norm),
"same" padding, and a projection shortcut (1x1 conv + BN) wherever the shape
changes. The trainable parameter counts equal torchvision's exactly
(resnet18 11,689,512; resnet34 21,797,672; resnet50 25,557,032 with 1000
classes).

Batch norm under a `tf.distribute` strategy (measured on TF 2.21 + Keras
3.15.1, 2-replica MirroredStrategy): the moving mean/variance are
`MirroredVariable`s with aggregation NONE, and a training-mode call in
`strategy.run` updates each replica's copy with that replica's own batch
statistics, so the copies silently diverge; reading the variable (checkpoints,
`model.predict` outside the strategy) gives replica 0's copy, which has seen
only replica 0's data. With `synchronized_bn=True` (Keras's
`BatchNormalization(synchronized=True)`, which all-reduces the sum, the sum of
squares and the count over replicas) every replica normalises with, and
stores, the statistics of the whole global batch, and the copies stay equal.

Every batch norm is a `FusedBatchNormalization` (`tfdist.models.batch_norm`):
Keras's layer, run as TensorFlow's fused kernel wherever it can (not when
synchronised), which made a `resnet_tiny` training step 1.5x (float32) to
1.9x (bfloat16) faster on an AMX Xeon.

Example:

    from tfdist.models.resnet import build_resnet, resnet_flops_per_example

    model = build_resnet("resnet_tiny", num_classes=10, input_shape=(32, 32, 3))
    flops = resnet_flops_per_example(model)    # training FLOPs per image
"""

import dataclasses
import numbers
import types

import keras

from tfdist.models.batch_norm import SMALLEST_FUSED_EPSILON, FusedBatchNormalization
from tfdist.runtime.argtypes import check_number

STEMS = ("auto", "imagenet", "cifar")
"""Valid values of `build_resnet(stem=...)`."""

CIFAR_STEM_MAX_SIZE = 64
"""With `stem="auto"`, inputs whose height and width are both at most this
many pixels get the CIFAR stem; larger (or unknown) sizes the ImageNet stem."""

_BN_EPSILON = SMALLEST_FUSED_EPSILON
"""Batch norm's epsilon, 1.001e-5: Keras Applications' ResNets', and the smallest
the fused batch-norm kernel takes on every device."""


@dataclasses.dataclass(frozen=True)
class _Spec:
    block: str            # "basic" (two 3x3 convs) or "bottleneck" (1x1, 3x3, 1x1)
    stage_blocks: tuple   # residual blocks per stage; stage i has width * 2**i
    width: int            # default width of the stem and the first stage
    depth: int            # weighted layers: stem conv + block convs + classifier


_SPECS = types.MappingProxyType({
    # He et al. 2015, section 4.2 (CIFAR-10), n=1: 3 stages of one basic
    # block at widths 16/32/64, about 78 k parameters. Trains in a couple of
    # minutes on 2 CPU cores on 32x32 images.
    "resnet_tiny": _Spec("basic", (1, 1, 1), 16, 8),
    "resnet18": _Spec("basic", (2, 2, 2, 2), 64, 18),
    "resnet34": _Spec("basic", (3, 4, 6, 3), 64, 34),
    "resnet50": _Spec("bottleneck", (3, 4, 6, 3), 64, 50),
    "resnet101": _Spec("bottleneck", (3, 4, 23, 3), 64, 101),
    "resnet152": _Spec("bottleneck", (3, 8, 36, 3), 64, 152),
})

RESNET_NAMES = tuple(_SPECS)
"""Names accepted by `build_resnet`: "resnet_tiny", "resnet18", "resnet34",
"resnet50", "resnet101", "resnet152". The depths 8, 18, 34, 50, 101 and 152
are accepted too (8 is "resnet_tiny")."""

_BY_DEPTH = types.MappingProxyType({spec.depth: name for name, spec in _SPECS.items()})


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def resnet_name(depth_or_name):
    """Returns the canonical name of a ResNet given by name or depth.

    Args:
        depth_or_name: one of `RESNET_NAMES`, or a depth (8, 18, 34, 50, 101,
            152; 8 is "resnet_tiny").

    Returns:
        A name in `RESNET_NAMES`.

    Raises:
        ValueError: an unknown name or depth, listing the valid ones.

    Example:

    >>> resnet_name(50)
    'resnet50'
    >>> resnet_name("resnet8")
    'resnet_tiny'
    """
    if _is_int(depth_or_name) and int(depth_or_name) in _BY_DEPTH:
        return _BY_DEPTH[int(depth_or_name)]
    if isinstance(depth_or_name, str):
        key = depth_or_name.strip().lower()
        if key in _SPECS:
            return key
        if key.startswith("resnet") and key[6:].isdigit() and int(key[6:]) in _BY_DEPTH:
            return _BY_DEPTH[int(key[6:])]
    raise ValueError(
        f"Unknown ResNet {depth_or_name!r}; choose a name in {list(RESNET_NAMES)} "
        f"or a depth in {sorted(_BY_DEPTH)}.")


def _check_args(num_classes, input_shape, width, bn_momentum, dropout, stem):
    if not _is_int(num_classes) or num_classes < 1:
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}.")
    if (not isinstance(input_shape, (tuple, list)) or len(input_shape) != 3
            or not all(d is None or (_is_int(d) and d >= 1) for d in input_shape[:2])
            or not (_is_int(input_shape[2]) and input_shape[2] >= 1)):
        raise ValueError(
            f"input_shape must be (height, width, channels) (channels-last) with "
            f"positive integer sizes (height and width may be None), got "
            f"{input_shape!r}.")
    if width is not None and (not _is_int(width) or width < 1):
        raise ValueError(f"width must be an integer >= 1 (or None for the "
                         f"variant's default), got {width!r}.")
    for label, value in (("bn_momentum", bn_momentum), ("dropout", dropout)):
        check_number(label, value, at_least=0, below=1)
    if stem not in STEMS:
        raise ValueError(f"Unknown stem {stem!r}; choose one of {list(STEMS)}.")


def _resolve_stem(stem, input_shape):
    if stem != "auto":
        return stem
    height, width = input_shape[:2]
    if height is not None and width is not None and max(height, width) <= CIFAR_STEM_MAX_SIZE:
        return "cifar"
    return "imagenet"


class _Builder:
    """Creates the layers of one model with consistent names and settings."""

    def __init__(self, synchronized_bn, bn_momentum):
        self.synchronized_bn = synchronized_bn
        self.bn_momentum = bn_momentum

    def conv(self, x, filters, kernel_size, strides, name):
        return keras.layers.Conv2D(
            filters, kernel_size, strides=strides, padding="same", use_bias=False,
            kernel_initializer="he_normal", name=name)(x)

    def bn(self, x, name):
        return FusedBatchNormalization(
            axis=-1, momentum=self.bn_momentum, epsilon=_BN_EPSILON,
            synchronized=self.synchronized_bn, name=name)(x)

    def conv_bn(self, x, filters, kernel_size, strides, prefix, suffix, relu):
        x = self.conv(x, filters, kernel_size, strides, f"{prefix}_conv{suffix}")
        x = self.bn(x, f"{prefix}_bn{suffix}")
        if relu:
            x = keras.layers.ReLU(name=f"{prefix}_relu{suffix}")(x)
        return x

    def stem(self, x, kind, width):
        if kind == "imagenet":
            x = self.conv_bn(x, width, 7, 2, "stem", "", relu=True)
            return keras.layers.MaxPooling2D(3, strides=2, padding="same",
                                             name="stem_pool")(x)
        return self.conv_bn(x, width, 3, 1, "stem", "", relu=True)

    def block(self, x, kind, width, strides, prefix):
        out_channels = width * 4 if kind == "bottleneck" else width
        shortcut = x
        if strides != 1 or x.shape[-1] != out_channels:
            shortcut = self.conv(x, out_channels, 1, strides, f"{prefix}_proj_conv")
            shortcut = self.bn(shortcut, f"{prefix}_proj_bn")
        if kind == "bottleneck":
            y = self.conv_bn(x, width, 1, 1, prefix, 1, relu=True)
            y = self.conv_bn(y, width, 3, strides, prefix, 2, relu=True)
            y = self.conv_bn(y, out_channels, 1, 1, prefix, 3, relu=False)
        else:
            y = self.conv_bn(x, width, 3, strides, prefix, 1, relu=True)
            y = self.conv_bn(y, width, 3, 1, prefix, 2, relu=False)
        y = keras.layers.Add(name=f"{prefix}_add")([y, shortcut])
        return keras.layers.ReLU(name=f"{prefix}_out")(y)


def resnet_stages(depth_or_name):
    """The number of stages (residual block groups) of a ResNet; the last one is the widest.

    Example:

    >>> resnet_stages("resnet_tiny"), resnet_stages(50)
    (3, 4)
    """
    return len(_SPECS[resnet_name(depth_or_name)].stage_blocks)


def build_resnet(depth_or_name, num_classes, input_shape, *, synchronized_bn=False,
                 width=None, bn_momentum=0.9, dropout=0.0, stem="auto", name=None):
    """Builds a ResNet image classifier (channels-last) that outputs logits.

    Stem, then stages of residual blocks (stage `i` has `width * 2**i`
    channels, times 4 at the output of bottleneck blocks; every stage after
    the first halves the resolution in its first block), global average
    pooling, optional dropout and a Dense classifier. Layers follow the global
    `keras.mixed_precision` policy, except the final `logits` Activation,
    which is float32 so that the softmax and the loss run in float32 under
    "mixed_bfloat16"/"mixed_float16". Batch-norm variables are always float32.

    Stems: "imagenet" is a 7x7 stride-2 conv + BN + ReLU + 3x3 stride-2 max
    pool (total stride 32 with 4 stages); "cifar" is a 3x3 stride-1 conv + BN
    + ReLU with no pooling, for small images. "auto" picks "cifar" when height
    and width are both at most `CIFAR_STEM_MAX_SIZE` (64) pixels.

    Args:
        depth_or_name: one of `RESNET_NAMES` ("resnet_tiny", "resnet18",
            "resnet34", "resnet50", "resnet101", "resnet152") or a depth
            (8, 18, 34, 50, 101, 152).
        num_classes: number of output logits, >= 1.
        input_shape: `(height, width, channels)`; height and width may be None
            (then `stem="auto"` picks the ImageNet stem).
        synchronized_bn: True to compute batch-norm statistics over the global
            batch of all replicas under a `tf.distribute` strategy (an
            all-reduce per BN layer and step); False for per-replica
            statistics. See the module docstring for what False does to the
            moving statistics.
        width: channels of the stem and the first stage; None for the
            variant's default (64; 16 for "resnet_tiny").
        bn_momentum: Keras batch-norm momentum, the weight of the old moving
            statistics (0.9 is PyTorch's `momentum=0.1`), in [0, 1).
        dropout: dropout rate before the classifier, in [0, 1).
        stem: "auto", "imagenet" or "cifar".
        name: the model's name; defaults to the canonical ResNet name.

    Returns:
        A functional `keras.Model` mapping float images `[batch, H, W, C]` to
        float32 logits `[batch, num_classes]`.

    Raises:
        ValueError: an unknown name/depth or stem, or an invalid argument,
            with the value received and what is allowed.

    Example:

    >>> model = build_resnet("resnet_tiny", 10, (32, 32, 3))
    >>> tuple(model(np.zeros((2, 32, 32, 3), "float32")).shape)
    (2, 10)
    >>> build_resnet(50, 1000, (224, 224, 3)).count_params() > 25_000_000
    True
    """
    canonical = resnet_name(depth_or_name)
    _check_args(num_classes, input_shape, width, bn_momentum, dropout, stem)
    spec = _SPECS[canonical]
    width = spec.width if width is None else int(width)
    builder = _Builder(bool(synchronized_bn), float(bn_momentum))

    images = keras.Input(shape=tuple(input_shape), name="images")
    x = builder.stem(images, _resolve_stem(stem, input_shape), width)
    for stage, num_blocks in enumerate(spec.stage_blocks):
        for block in range(num_blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = builder.block(x, spec.block, width * 2 ** stage, strides,
                              f"stage{stage + 1}_block{block + 1}")
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    if dropout > 0:
        x = keras.layers.Dropout(dropout, name="dropout")(x)
    x = keras.layers.Dense(num_classes, name="classifier")(x)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(x)
    return keras.Model(images, logits, name=name or canonical)


# ------------------------------------------------------------------ FLOPs

_CONV_TYPES = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)


def _layer_forward_flops(layer):
    """Forward FLOPs per example of one Conv or Dense layer (2 per multiply-add)."""
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        out_positions = _prod(layer.output.shape[1:-1])
        channels = layer.input.shape[-1]
        return (2 * out_positions * channels * layer.depth_multiplier
                * _prod(layer.kernel_size))
    if isinstance(layer, _CONV_TYPES):
        out_positions = _prod(layer.output.shape[1:-1])
        in_per_group = layer.input.shape[-1] // layer.groups
        return 2 * out_positions * layer.filters * _prod(layer.kernel_size) * in_per_group
    if isinstance(layer, keras.layers.Dense):
        positions = _prod(layer.input.shape[1:-1])
        return 2 * positions * layer.input.shape[-1] * layer.units
    return 0


def _prod(values):
    result = 1
    for value in values:
        result *= int(value)
    return result


def _walk_layers(model):
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _walk_layers(layer)
        else:
            yield layer


def _with_static_input(model, input_shape):
    model_shape = tuple(model.input_shape[1:]) if isinstance(model.input_shape, tuple) else None
    if model_shape is None:
        raise ValueError("resnet_flops_per_example needs a model with one image input, "
                         f"got input_shape={model.input_shape!r}.")
    if input_shape is None:
        if None in model_shape:
            raise ValueError(
                f"The model's input shape {model_shape} has unknown sizes; pass "
                "input_shape=(height, width, channels) to count its FLOPs.")
        return model
    input_shape = tuple(input_shape)
    compatible = len(input_shape) == len(model_shape) and all(
        m is None or m == i for m, i in zip(model_shape, input_shape))
    if not compatible or None in input_shape:
        raise ValueError(
            f"input_shape={input_shape} does not fit the model's input shape "
            f"{model_shape} (None in the model's shape matches any size; "
            "input_shape must be fully known).")
    if input_shape == model_shape:
        return model
    return keras.models.clone_model(model, input_tensors=keras.Input(shape=input_shape))


def resnet_flops_per_example(model_or_name, input_shape=None, *, training=True,
                             num_classes=1000, **build_kwargs):
    """Analytic model FLOPs per image of a ResNet (or any functional CNN), for MFU.

    Counts the multiply-adds of every convolution and Dense layer, 2 FLOPs
    each: a Conv layer costs `2 * H_out * W_out * C_out * k_h * k_w * C_in /
    groups`, a Dense layer `2 * d_in * d_out`. Training (forward + backward,
    the backward pass costing twice the forward: gradients with respect to
    the activations and to the weights) is 3x the forward count. Batch norm,
    ReLU, pooling, residual additions and bias additions are left out (about
    1% of a ResNet-50's forward count); this is the usual convention for
    ResNet FLOPs (He et al. 2015 and torchvision count multiply-adds: ResNet-50
    at 224x224 is 4.09 G multiply-adds, i.e. 8.18 GFLOPs forward and 24.5
    GFLOPs per trained image here).

    Args:
        model_or_name: a functional `keras.Model` whose layers are each called
            once (e.g. from `build_resnet`), or a name/depth accepted by
            `build_resnet`, which is then built (no training) to be counted.
        input_shape: `(height, width, channels)`. Required for a name, and
            for a model whose input has unknown sizes (a copy with this input
            shape is counted); otherwise optional and must match the model.
        training: True for forward + backward (x3), False for forward only.
        num_classes: classifier width when `model_or_name` is a name.
        **build_kwargs: other `build_resnet` arguments (`width`, `stem`, ...)
            when `model_or_name` is a name.

    Returns:
        FLOPs per example, an int. Multiply by images per second for model
        FLOP/s.

    Raises:
        ValueError: the shape is missing, unknown or does not fit the model.

    Example:

    >>> resnet_flops_per_example("resnet50", (224, 224, 3), training=False)
    8178368512
    """
    if isinstance(model_or_name, keras.Model):
        if build_kwargs:
            raise ValueError(f"Build arguments {sorted(build_kwargs)} only apply when a "
                             "ResNet name is given, not a model.")
        model = _with_static_input(model_or_name, input_shape)
    else:
        if input_shape is None:
            raise ValueError(f"input_shape is required to count the FLOPs of "
                             f"{model_or_name!r}, e.g. (224, 224, 3).")
        if None in tuple(input_shape):
            raise ValueError(f"input_shape must be fully known to count FLOPs, got "
                             f"{tuple(input_shape)}.")
        model = build_resnet(model_or_name, num_classes, input_shape, **build_kwargs)
    forward = sum(_layer_forward_flops(layer) for layer in _walk_layers(model))
    return 3 * forward if training else forward
