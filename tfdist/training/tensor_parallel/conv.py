"""`ShardedConv`: a `Conv1D`, `Conv2D` or `Conv3D` (or a transposed one) split over K
devices, by output channels (filters) or by input channels.

Example:

    layer = ShardedConv.from_conv(model.get_layer("conv"), ["/device:CPU:0", "/device:CPU:1"],
                                  "input_channels")
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.training.tensor_parallel.layers import (attach_pieces, build_on_channel_slices,
                                                    channel_pieces, config_and_identity,
                                                    on_device, sum_partial_products)

FILTERS = "filters"
"""Style of a convolution split by output channels (filters; kernel's last axis, bias split too)."""
INPUT_CHANNELS = "input_channels"
"""Style of a convolution split by input channels (kernel axis -2, bias added after the sum)."""
CONV_CLASSES = {"Conv1D": keras.layers.Conv1D, "Conv2D": keras.layers.Conv2D,
                "Conv3D": keras.layers.Conv3D, "Conv1DTranspose": keras.layers.Conv1DTranspose,
                "Conv2DTranspose": keras.layers.Conv2DTranspose,
                "Conv3DTranspose": keras.layers.Conv3DTranspose}
"""The convolutions tfdist splits (by class name; subclasses are not split)."""


def conv_kernel_axes(conv_class):
    """`(filters axis, input channels axis)` of a convolution class's kernel: a convolution's
    kernel is `(..., in, filters)`, a transposed one's `(..., filters, in)`.

    Example:

    >>> conv_kernel_axes("Conv2D"), conv_kernel_axes("Conv2DTranspose")
    ((-1, -2), (-2, -1))
    """
    return (-2, -1) if conv_class.endswith("Transpose") else (-1, -2)


def add_channel_bias(outputs, bias, channel_axis=-1):
    """`outputs + bias` along the channel axis of a convolution's outputs, in their dtype
    (as Keras's convolutions add theirs).

    Example:

    >>> add_channel_bias(tf.zeros((1, 2, 2, 3)), tf.constant([1., 2., 3.]))[0, 0, 0]
    <tf.Tensor: shape=(3,), dtype=float32, numpy=array([1., 2., 3.], dtype=float32)>
    """
    rank = len(outputs.shape) - 2
    shape = ((1,) * (rank + 1) + (-1,) if channel_axis == -1 else (1, -1) + (1,) * rank)
    return keras.ops.add(outputs, keras.ops.reshape(keras.ops.cast(bias, outputs.dtype), shape))


@keras.saving.register_keras_serializable(package="tfdist")
class ShardedConv(keras.layers.Layer):
    """A `keras.layers.Conv1D`, `Conv2D` or `Conv3D` (or a transposed one) split over K
    devices, by output channels (filters) or by input channels.

    By filters (`style="filters"`): shard i is a convolution of the same class
    with `filters / K` filters on device i (kernel `(..., in, filters/K)`, its
    bias entries, the activation), computing its channels of the output from
    the whole input there. The K pieces are concatenated on the channel axis on
    the first device, so the next layer, not split, sees the whole output (the
    pieces also travel with it: a convolution split by input channels called on
    it directly takes each piece on its own device). Backward, each shard's
    input gradient is computed on its device and the K are summed where the
    input lives.

    By input channels (`style="input_channels"`): shard i holds the kernel rows
    of input channels `i*C/K .. (i+1)*C/K` (`(..., in/K, filters)`), convolves
    those channels of the input on device i, and the K partial outputs are
    summed on the first device (in float32 under a mixed policy, see
    `sum_partial_products`); the bias is added once after the sum, then the
    activation, as in the convolution it splits.

    Args:
        config: the `get_config()` of the convolution to split.
        devices: the K device names.
        style: `"filters"` or `"input_channels"`.
        conv_class: the convolution's class name, a key of `CONV_CLASSES`
            (`"Conv2D"`, `"Conv2DTranspose"`, ...).
        **kwargs: `keras.layers.Layer` arguments (`name`, ...).

    Example:

    >>> conv = keras.layers.Conv2D(8, 3, padding="same", name="conv")
    >>> layer = ShardedConv.from_conv(conv, ["/device:CPU:0", "/device:CPU:1"])
    >>> layer(tf.ones((2, 5, 5, 3))).shape
    TensorShape([2, 5, 5, 8])
    >>> [tuple(shard.kernel.shape) for shard in layer.convs]
    [(3, 3, 3, 4), (3, 3, 3, 4)]
    """

    classes = CONV_CLASSES
    """The layer classes this class splits, by name."""

    def __init__(self, config, devices, style=FILTERS, conv_class="Conv2D", **kwargs):
        super().__init__(**kwargs)
        if style not in (FILTERS, INPUT_CHANNELS):
            raise ValueError(f"style must be {FILTERS!r} or {INPUT_CHANNELS!r}, got {style!r}.")
        if conv_class not in self.classes:
            raise ValueError(f"conv_class must be one of {sorted(self.classes)}, got "
                             f"{conv_class!r}.")
        self.devices = tuple(devices)
        self.conv_config = dict(config)
        self.style = style
        self.conv_class = conv_class
        k = len(self.devices)
        filters = int(config["filters"])
        if style == FILTERS and filters % k:
            raise ValueError(f"{filters} filters do not divide by {k} devices.")
        if int(config.get("groups", 1)) != 1:
            raise ValueError("A grouped convolution (groups > 1) is not split yet.")
        self.filters = filters
        self.channel_axis = 1 if config.get("data_format") == "channels_first" else -1
        self.activation = keras.activations.get(config.get("activation"))
        self.use_bias = bool(config.get("use_bias", True))
        self.bias = None
        shard_config = (dict(config, filters=filters // k) if style == FILTERS else
                        dict(config, use_bias=False, activation=None))  # bias, activation after
        prefix = "filters" if style == FILTERS else "channels"
        self.convs = [self.classes[conv_class].from_config(
            dict(shard_config, name=f"{prefix}_{index}",
                 dtype=self.dtype_policy))  # the layer's policy (mixed precision)
            for index in range(k)]

    @classmethod
    def from_conv(cls, conv, devices, style=FILTERS):
        """The split of the convolution `conv` (same name; weights loaded later).

        Example:

        >>> ShardedConv.from_conv(conv, devices, "input_channels").name
        'conv'
        """
        config, identity = config_and_identity(conv)
        return cls(config, devices, style=style, conv_class=type(conv).__name__, **identity)

    @property
    def num_shards(self):
        """K, the number of devices."""
        return len(self.devices)

    def build(self, input_shape):
        if self.style == FILTERS:
            for device, conv in zip(self.devices, self.convs, strict=True):
                with tf.device(device):
                    conv.build(input_shape)
            return
        build_on_channel_slices(self, self.convs, input_shape, self.channel_axis)
        if self.use_bias:
            with tf.device(self.devices[0]):
                self.bias = self.add_weight(
                    name="bias", shape=(self.filters,),
                    initializer=self.conv_config.get("bias_initializer", "zeros"))

    def call(self, inputs):
        if self.style == FILTERS:
            pieces = [on_device(device, conv, inputs)
                      for device, conv in zip(self.devices, self.convs, strict=True)]
            with tf.device(self.devices[0]):
                output = keras.ops.concatenate(pieces, axis=self.channel_axis)
            return attach_pieces(output, pieces) if self.channel_axis == -1 else output
        return self._input_channels(inputs)

    def _input_channels(self, x):
        pieces = channel_pieces(x, self.devices, self.channel_axis)
        partial = [on_device(device, conv, piece)
                   for device, conv, piece in zip(self.devices, self.convs, pieces, strict=True)]
        with tf.device(self.devices[0]):
            y = sum_partial_products(partial)
            if self.use_bias:
                y = add_channel_bias(y, self.bias, self.channel_axis)
            if self.activation is not None:
                y = self.activation(y)
        return y

    def compute_output_shape(self, input_shape):
        if self.style == INPUT_CHANNELS:
            shape = list(input_shape)
            shape[self.channel_axis] = int(shape[self.channel_axis]) // self.num_shards
            return tuple(self.convs[0].compute_output_shape(tuple(shape)))
        shape = list(self.convs[0].compute_output_shape(input_shape))
        shape[self.channel_axis] = self.filters
        return tuple(shape)

    @property
    def _kernel_axis(self):
        filters_axis, input_axis = conv_kernel_axes(self.conv_class)
        return filters_axis if self.style == FILTERS else input_axis

    def load_from(self, conv):
        """Loads the weights of `conv`, the convolution this layer splits (each shard its
        filters, or its input channels).

        Example:

        >>> split.get_layer("conv").load_from(model.get_layer("conv"))
        """
        k = self.num_shards
        kernels = np.split(np.asarray(conv.kernel), k, axis=self._kernel_axis)
        for shard, kernel in zip(self.convs, kernels, strict=True):
            shard.kernel.assign(kernel)
        if not conv.use_bias:
            return
        if self.style == FILTERS:
            for shard, bias in zip(self.convs, np.split(np.asarray(conv.bias), k), strict=True):
                shard.bias.assign(bias)
        else:
            self.bias.assign(np.asarray(conv.bias))

    def gather_into(self, conv):
        """Writes this layer's gathered weights into `conv` (the convolution it splits).

        Example:

        >>> split.get_layer("conv").gather_into(model.get_layer("conv"))
        """
        conv.kernel.assign(np.concatenate([np.asarray(s.kernel) for s in self.convs],
                                          axis=self._kernel_axis))
        if conv.use_bias:
            conv.bias.assign(np.concatenate([np.asarray(s.bias) for s in self.convs])
                             if self.style == FILTERS else np.asarray(self.bias))

    def get_config(self):
        config = super().get_config()
        config.update(config=self.conv_config, devices=list(self.devices), style=self.style,
                      conv_class=self.conv_class)
        return config


ShardedConv2D = ShardedConv
"""The name `ShardedConv` had while it split only a `Conv2D` by filters."""
