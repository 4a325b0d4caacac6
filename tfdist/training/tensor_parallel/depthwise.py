"""`ShardedDepthwiseConv`: a `DepthwiseConv1D` or `DepthwiseConv2D` split by channels over K
devices; `ShardedSeparableConv`: a `SeparableConv1D` or `SeparableConv2D` split by its input
channels.

A depthwise convolution filters each input channel on its own (`depth_multiplier`
outputs per channel, output channel `c * M + m`), so splitting its channels
needs no sum: shard i holds the kernel `(..., C/K, M)` and the bias entries of
channels `i*C/K .. (i+1)*C/K`, filters those channels on device i, and its
outputs are the contiguous block `i*C/K*M .. (i+1)*C/K*M` of the layer's. The K
blocks are concatenated on the first device for a layer that is not split, and
travel with the output as pieces (channels last), so that the next split layer
takes each on its own device: after a convolution split by filters, and before
a 1x1 convolution split by input channels (a separable convolution's
pointwise half), a depthwise block then runs with no gather at all.

A separable convolution is a depthwise one followed by a 1x1 one in a single
layer; split by input channels, shard i runs both halves on its channels
(its depthwise kernel `(..., C/K, M)` and the pointwise rows of its
`C/K*M` depthwise outputs), and the K partial outputs are summed on the
first device, then the bias (not split) and the activation are applied.

Example:

    layer = ShardedDepthwiseConv.from_depthwise(model.get_layer("dw"),
                                                ["/device:CPU:0", "/device:CPU:1"])
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.training.tensor_parallel.conv import INPUT_CHANNELS, ShardedConv
from tfdist.training.tensor_parallel.layers import (attach_pieces, build_on_channel_slices,
                                                    channel_pieces, config_and_identity,
                                                    on_device)

CHANNELS = "channels"
"""Style of a depthwise convolution split by channels (kernel axis -2, bias split too)."""
DEPTHWISE_CLASSES = {"DepthwiseConv1D": keras.layers.DepthwiseConv1D,
                     "DepthwiseConv2D": keras.layers.DepthwiseConv2D}
"""The depthwise convolutions tfdist splits (by class name; subclasses are not split)."""
SEPARABLE = "separable"
"""Style of a separable convolution split by input channels (both kernels' axis -2)."""
SEPARABLE_CLASSES = {"SeparableConv1D": keras.layers.SeparableConv1D,
                     "SeparableConv2D": keras.layers.SeparableConv2D}
"""The separable convolutions tfdist splits (by class name; subclasses are not split)."""


@keras.saving.register_keras_serializable(package="tfdist")
class ShardedDepthwiseConv(keras.layers.Layer):
    """A `DepthwiseConv1D` / `DepthwiseConv2D` split by channels over K devices.

    Args:
        config: the `get_config()` of the depthwise convolution to split.
        devices: the K device names.
        depthwise_class: `"DepthwiseConv1D"` or `"DepthwiseConv2D"`.
        **kwargs: `keras.layers.Layer` arguments (`name`, ...).

    Example:

    >>> dw = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", name="dw")
    >>> layer = ShardedDepthwiseConv.from_depthwise(dw, ["/device:CPU:0", "/device:CPU:1"])
    >>> layer(tf.ones((2, 5, 5, 4))).shape
    TensorShape([2, 5, 5, 8])
    >>> [tuple(shard.kernel.shape) for shard in layer.convs]
    [(3, 3, 2, 2), (3, 3, 2, 2)]
    """

    def __init__(self, config, devices, depthwise_class="DepthwiseConv2D", **kwargs):
        super().__init__(**kwargs)
        if depthwise_class not in DEPTHWISE_CLASSES:
            raise ValueError(f"depthwise_class must be one of {sorted(DEPTHWISE_CLASSES)}, got "
                             f"{depthwise_class!r}.")
        self.devices = tuple(devices)
        self.depthwise_config = dict(config)
        self.depthwise_class = depthwise_class
        self.multiplier = int(config.get("depth_multiplier", 1))
        self.channel_axis = 1 if config.get("data_format") == "channels_first" else -1
        self.convs = [DEPTHWISE_CLASSES[depthwise_class].from_config(
            dict(config, name=f"channels_{index}", dtype=self.dtype_policy))
            for index in range(len(self.devices))]

    @classmethod
    def from_depthwise(cls, layer, devices):
        """The split of the depthwise convolution `layer` (same name; weights loaded later).

        Example:

        >>> ShardedDepthwiseConv.from_depthwise(dw, devices).name
        'dw'
        """
        config, identity = config_and_identity(layer)
        return cls(config, devices, depthwise_class=type(layer).__name__, **identity)

    @property
    def num_shards(self):
        """K, the number of devices."""
        return len(self.devices)

    def build(self, input_shape):
        build_on_channel_slices(self, self.convs, input_shape, self.channel_axis, "channels")

    def call(self, inputs):
        pieces = channel_pieces(inputs, self.devices, self.channel_axis)
        outputs = [on_device(device, conv, piece)
                   for device, conv, piece in zip(self.devices, self.convs, pieces, strict=True)]
        with tf.device(self.devices[0]):
            output = keras.ops.concatenate(outputs, axis=self.channel_axis)
        return attach_pieces(output, outputs) if self.channel_axis == -1 else output

    def compute_output_shape(self, input_shape):
        shape = list(input_shape)
        shape[self.channel_axis] = int(shape[self.channel_axis]) // self.num_shards
        shape = list(self.convs[0].compute_output_shape(tuple(shape)))
        shape[self.channel_axis] = int(input_shape[self.channel_axis]) * self.multiplier
        return tuple(shape)

    def load_from(self, layer):
        """Loads the weights of `layer`, the depthwise convolution this layer splits (each
        shard its channels).

        Example:

        >>> split.get_layer("dw").load_from(model.get_layer("dw"))
        """
        k = self.num_shards
        for shard, kernel in zip(self.convs, np.split(np.asarray(layer.kernel), k, axis=-2),
                                 strict=True):
            shard.kernel.assign(kernel)
        if layer.use_bias:
            for shard, bias in zip(self.convs, np.split(np.asarray(layer.bias), k), strict=True):
                shard.bias.assign(bias)

    def gather_into(self, layer):
        """Writes this layer's gathered weights into `layer` (the depthwise convolution it
        splits).

        Example:

        >>> split.get_layer("dw").gather_into(model.get_layer("dw"))
        """
        layer.kernel.assign(np.concatenate([np.asarray(s.kernel) for s in self.convs], axis=-2))
        if layer.use_bias:
            layer.bias.assign(np.concatenate([np.asarray(s.bias) for s in self.convs]))

    def get_config(self):
        config = super().get_config()
        config.update(config=self.depthwise_config, devices=list(self.devices),
                      depthwise_class=self.depthwise_class)
        return config


@keras.saving.register_keras_serializable(package="tfdist")
class ShardedSeparableConv(ShardedConv):
    """A `SeparableConv1D` / `SeparableConv2D` split by input channels over K devices.

    Shard i is a separable convolution without bias or activation over
    channels `i*C/K .. (i+1)*C/K` on device i (its depthwise kernel
    `(..., C/K, M)` and the pointwise rows of its `C/K*M` depthwise outputs);
    the K partial outputs are summed on the first device (in float32 under a
    mixed policy), then the bias is added once and the activation applied:
    `ShardedConv` split by input channels, with two kernels.

    Args:
        config: the `get_config()` of the separable convolution to split.
        devices: the K device names.
        separable_class: `"SeparableConv1D"` or `"SeparableConv2D"`.
        **kwargs: `keras.layers.Layer` arguments (`name`, ...).

    Example:

    >>> sep = keras.layers.SeparableConv2D(6, 3, padding="same", name="sep")
    >>> layer = ShardedSeparableConv.from_separable(sep, ["/device:CPU:0", "/device:CPU:1"])
    >>> layer(tf.ones((2, 5, 5, 4))).shape
    TensorShape([2, 5, 5, 6])
    """

    classes = SEPARABLE_CLASSES

    def __init__(self, config, devices, separable_class="SeparableConv2D", **kwargs):
        super().__init__(config, devices, style=INPUT_CHANNELS, conv_class=separable_class,
                         **kwargs)

    @classmethod
    def from_separable(cls, layer, devices):
        """The split of the separable convolution `layer` (same name; weights loaded later).

        Example:

        >>> ShardedSeparableConv.from_separable(sep, devices).name
        'sep'
        """
        config, identity = config_and_identity(layer)
        return cls(config, devices, separable_class=type(layer).__name__, **identity)

    def load_from(self, layer):
        """Loads the weights of `layer`, the separable convolution this layer splits (each
        shard its channels' depthwise kernel and pointwise rows).

        Example:

        >>> split.get_layer("sep").load_from(model.get_layer("sep"))
        """
        k = self.num_shards
        depthwise = np.split(np.asarray(layer.depthwise_kernel), k, axis=-2)
        pointwise = np.split(np.asarray(layer.pointwise_kernel), k, axis=-2)
        for shard, dw, pw in zip(self.convs, depthwise, pointwise, strict=True):
            shard.depthwise_kernel.assign(dw)
            shard.pointwise_kernel.assign(pw)
        if layer.use_bias:
            self.bias.assign(np.asarray(layer.bias))

    def gather_into(self, layer):
        """Writes this layer's gathered weights into `layer` (the separable convolution it
        splits).

        Example:

        >>> split.get_layer("sep").gather_into(model.get_layer("sep"))
        """
        for name in ("depthwise_kernel", "pointwise_kernel"):
            getattr(layer, name).assign(np.concatenate(
                [np.asarray(getattr(shard, name)) for shard in self.convs], axis=-2))
        if layer.use_bias:
            layer.bias.assign(np.asarray(self.bias))

    def get_config(self):
        config = super().get_config()
        config["separable_class"] = config.pop("conv_class")
        config.pop("style")
        return config
