"""An `EinsumDense` split along one axis of its kernel over K devices.

`keras.layers.EinsumDense(equation, output_shape, bias_axes)` is the Dense
of keras-hub's and Keras's own attention and feed-forward layers. Its
kernel is split along one axis, named by a letter of the equation
`"<input>,<kernel>-><output>"`:

* a letter of the output and not of the input (an output feature, a head)
  is **column-parallel**: shard i computes its slice of the output from the
  whole input, and the K slices are concatenated on the first device (and
  handed over as they are to a following row-parallel layer when the letter
  is the output's last axis);
* a letter of the input and not of the output (a contracted feature) is
  **row-parallel**: shard i contracts its slice of the input with its slice
  of the kernel, and the K partial products are summed on the first device
  (`sum_partial_products`).

Each shard is an `EinsumDense` of its own on its device (same equation,
its slice of the kernel), whose forward and backward run there (`on_device`).
A bias over the split letter is split with the kernel; any other bias is
kept whole on the first device and added once, after the concatenation or
the sum, followed by the activation (so that one device's result is
reproduced exactly).

Example:

    layer = ShardedEinsumDense.from_einsum(model.get_layer("proj"), "d", devices)
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.training.tensor_parallel.layers import (COLUMN, ROW, attach_pieces, on_device,
                                                    pieces_of, sum_partial_products)


def einsum_specs(equation):
    """`(input, kernel, output)` letter strings of an EinsumDense equation, without `...`.

    Raises:
        ValueError: an equation tfdist cannot split (not `a,b->c`, or an
            ellipsis elsewhere than at the start of the input and output).

    Example:

    >>> einsum_specs("...b,bc->...c")
    ('b', 'bc', 'c')
    """
    match = equation.replace(" ", "").split("->")
    sides = match[0].split(",") if len(match) == 2 else []
    if len(sides) != 2:
        raise ValueError(f"The EinsumDense equation {equation!r} is not '<input>,<kernel>->"
                         "<output>'.")
    specs = (sides[0], sides[1], match[1])
    for spec in specs:
        if "..." in spec[3:] or ("..." in spec and not spec.startswith("...")):
            raise ValueError(f"The EinsumDense equation {equation!r} has an ellipsis that is "
                             "not at the start of its input and output; tfdist cannot split it.")
    return tuple(spec.replace("...", "") for spec in specs)


def split_style(equation, letter):
    """`COLUMN` when the kernel's `letter` is an output axis only, `ROW` when it is an input axis
    only (contracted), else None (it is both, or neither: a batch-like axis).

    Example:

    >>> split_style("abc,cd->abd", "d"), split_style("abc,cd->abd", "c")
    ('column', 'row')
    """
    inputs, _, outputs = einsum_specs(equation)
    if letter in outputs and letter not in inputs:
        return COLUMN
    if letter in inputs and letter not in outputs:
        return ROW
    return None


@keras.saving.register_keras_serializable(package="tfdist")
class ShardedEinsumDense(keras.layers.Layer):
    """A `keras.layers.EinsumDense` split along the kernel axis `letter` over K devices.

    Args:
        equation, output_shape, activation, bias_axes, kernel_initializer,
            bias_initializer: as in `keras.layers.EinsumDense` (the whole
            layer's output shape).
        letter: the equation letter of the kernel axis that is split.
        devices: the K device names; shard i lives and runs on `devices[i]`.
        **kwargs: `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Example:

    >>> layer = ShardedEinsumDense("abc,cd->abd", (None, 64), "d", devices, bias_axes="d")
    >>> layer(tf.ones((2, 3, 16))).shape
    TensorShape([2, 3, 64])
    """

    def __init__(self, equation, output_shape, letter, devices, activation=None, bias_axes=None,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.equation = equation
        self.full_output_shape = tuple(output_shape) if isinstance(
            output_shape, (list, tuple)) else (output_shape,)
        self.letter = letter
        self.devices = tuple(devices)
        self.activation = keras.activations.get(activation)
        self.bias_axes = bias_axes
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.style = split_style(equation, letter)
        if self.style is None:
            raise ValueError(
                f"The kernel axis {letter!r} of the EinsumDense {self.name!r} ({equation!r}) is "
                "in both its input and its output (or in neither): tfdist splits an output "
                "axis (column-parallel) or a contracted input axis (row-parallel).")
        self.inputs_spec, self.kernel_spec, self.outputs_spec = einsum_specs(equation)
        self.split_bias = self.style == COLUMN and bool(bias_axes) and letter in bias_axes
        self.shards = []
        self.bias = None

    @classmethod
    def from_einsum(cls, layer, letter, devices):
        """The split of `layer`, a built `keras.layers.EinsumDense`, along its kernel's `letter`.

        Example:

        >>> ShardedEinsumDense.from_einsum(model.get_layer("proj"), "d", devices).style
        'column'
        """
        config = layer.get_config()
        return cls(config["equation"], config["output_shape"], letter, devices,
                   activation=config["activation"], bias_axes=config["bias_axes"],
                   kernel_initializer=config["kernel_initializer"],
                   bias_initializer=config["bias_initializer"], name=layer.name,
                   dtype=layer.dtype_policy, trainable=layer.trainable)

    @property
    def num_shards(self):
        """K, the number of devices."""
        return len(self.devices)

    def _output_axis(self):
        return self.outputs_spec.index(self.letter) - len(self.outputs_spec)

    def _input_axis(self):
        return self.inputs_spec.index(self.letter) - len(self.inputs_spec)

    def _kernel_axis(self):
        return self.kernel_spec.index(self.letter)

    def _output_shape_index(self, letter):
        """The position of `letter`'s axis in `output_shape` (which leaves out the batch axis or
        the ellipsis: it lines up with the output's last axes)."""
        return len(self.full_output_shape) + self.outputs_spec.index(letter) - len(
            self.outputs_spec)

    def build(self, input_shape):
        k = self.num_shards
        shard_output = list(self.full_output_shape)
        shard_input = list(input_shape)
        if self.style == COLUMN:
            where, size = shard_output, self._output_shape_index(self.letter)
        else:
            where, size = shard_input, self._input_axis()
        if where[size] is None or where[size] % k:
            kind = "outputs" if self.style == COLUMN else "inputs"
            raise ValueError(f"The EinsumDense {self.name!r} has {where[size]} {kind} along "
                             f"{self.letter!r}, which do not divide by {k} devices.")
        where[size] //= k
        for index, device in enumerate(self.devices):
            with tf.device(device):
                shard = keras.layers.EinsumDense(
                    self.equation, tuple(shard_output),
                    bias_axes=self.bias_axes if self.split_bias else None,
                    activation=self.activation if self._activation_in_shards() else None,
                    kernel_initializer=self.kernel_initializer,
                    bias_initializer=self.bias_initializer, dtype=self.dtype_policy,
                    name=f"{self.name}_shard_{index}")
                shard.build(tuple(shard_input))
            self.shards.append(shard)
        if self.bias_axes and not self.split_bias:
            with tf.device(self.devices[0]):
                self.bias = self.add_weight(name="bias", shape=self._bias_shape(),
                                            initializer=self.bias_initializer)
        self.built = True

    def _first_bias_position(self):
        # Keras's bias covers the output axes from its first bias letter to the end.
        return min(self.outputs_spec.index(letter) for letter in self.bias_axes)

    def _bias_shape(self):
        """The whole layer's bias shape, as `keras.layers.EinsumDense` makes it: the output
        axes from the first bias letter on, 1 where the bias does not vary."""
        return tuple(self.full_output_shape[self._output_shape_index(letter)]
                     if letter in self.bias_axes else 1
                     for letter in self.outputs_spec[self._first_bias_position():])

    def _activation_in_shards(self):
        return self.style == COLUMN and (not self.bias_axes or self.split_bias)

    def call(self, inputs):
        if self.style == COLUMN:
            pieces = [on_device(device, shard, inputs)
                      for device, shard in zip(self.devices, self.shards, strict=True)]
            with tf.device(self.devices[0]):
                output = tf.concat(pieces, axis=self._output_axis())
                output = self._finish(output)
            if self._output_axis() == -1 and self._activation_in_shards():
                attach_pieces(output, pieces)
            return output
        axis = self._input_axis()
        width = int(inputs.shape[axis]) // self.num_shards
        given = pieces_of(inputs, self.num_shards, width) if axis == -1 else None
        if given is None:
            given = []
            for index, device in enumerate(self.devices):
                with tf.device(device):
                    given.append(tf.gather(inputs, tf.range(index * width, (index + 1) * width),
                                           axis=axis))
        partial = [on_device(device, shard, piece)
                   for device, shard, piece in zip(self.devices, self.shards, given, strict=True)]
        with tf.device(self.devices[0]):
            return self._finish(sum_partial_products(partial))

    def _finish(self, output):
        if self.bias is not None:
            output = output + tf.cast(self.bias, output.dtype)
        if self.activation is not None and not self._activation_in_shards():
            output = self.activation(output)
        return output

    def compute_output_shape(self, input_shape):
        return keras.layers.EinsumDense(self.equation, self.full_output_shape).\
            compute_output_shape(input_shape)

    def load_from(self, einsum):
        """Loads the weights of `einsum`, the `keras.layers.EinsumDense` this layer splits.

        Example:

        >>> layer.load_from(model.get_layer("proj"))
        """
        kernels = np.split(np.asarray(einsum.kernel), self.num_shards, axis=self._kernel_axis())
        for shard, kernel in zip(self.shards, kernels, strict=True):
            shard.kernel.assign(kernel)
        if self.split_bias:
            axis = self._bias_axis()
            for shard, bias in zip(self.shards, np.split(np.asarray(einsum.bias),
                                                         self.num_shards, axis=axis), strict=True):
                shard.bias.assign(bias)
        elif self.bias is not None:
            self.bias.assign(np.asarray(einsum.bias))

    def _bias_axis(self):
        return self.outputs_spec.index(self.letter) - self._first_bias_position()

    def gather_into(self, einsum):
        """Writes the gathered kernel (and bias) into `einsum` (the EinsumDense this layer splits).

        Example:

        >>> layer.gather_into(model.get_layer("proj"))
        """
        einsum.kernel.assign(np.concatenate([np.asarray(s.kernel) for s in self.shards],
                                            axis=self._kernel_axis()))
        if self.split_bias:
            einsum.bias.assign(np.concatenate([np.asarray(s.bias) for s in self.shards],
                                              axis=self._bias_axis()))
        elif self.bias is not None:
            einsum.bias.assign(np.asarray(self.bias))

    def get_config(self):
        config = super().get_config()
        config.update(equation=self.equation, output_shape=list(self.full_output_shape),
                      letter=self.letter, devices=list(self.devices),
                      activation=keras.activations.serialize(self.activation),
                      bias_axes=self.bias_axes,
                      kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
                      bias_initializer=keras.initializers.serialize(self.bias_initializer))
        return config
