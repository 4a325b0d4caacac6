"""`ShardedDense`: a Dense layer whose kernel is split over K devices.

Each shard's kernel (and, column-parallel, its bias) is a variable of its
own, created under `tf.device(<shard device>)`, and each shard's matmul runs
under that device. Autodiff does the rest: the gradient of a shard's kernel
is computed where its forward ran, and because the shards are separate
variables, clipping by the global norm over the model's variable list is
the norm over all shards.

Column-parallel (`style="column"`): shard i computes
`activation(x @ W[:, cols_i] + b[cols_i])` on device i; the layer's output
is their concatenation (on the first device), and the K pieces also travel
with it, so that a row-parallel `ShardedDense` called on it directly uses
each piece on its own device and the concatenation is never computed.

Row-parallel (`style="row"`): shard i computes `x[..., rows_i] @ W[rows_i, :]`
on device i (taking the pieces a column-parallel layer handed over, else
slicing its input); the K partial products are summed on the first device
(a reduce; TensorFlow copies the sum to wherever a later op runs, which on
one worker is what an all-reduce gives), then the bias is added once and the
activation applied.

Example:

    layer = ShardedDense.from_dense(model.get_layer("up"), "column",
                                    ["/device:CPU:0", "/device:CPU:1"])
"""

import keras
import numpy as np
import tensorflow as tf

COLUMN = "column"
"""Style of a layer split by output channels (kernel axis -1, bias split too)."""
ROW = "row"
"""Style of a layer split by input channels (kernel axis 0, bias added once after the sum)."""
_SHARDS = "_tfdist_tensor_parallel_shards"  # the pieces a column-parallel output carries


class ShardedDense(keras.layers.Layer):
    """A Dense layer split by output channels (column) or input channels (row) over K devices.

    Args:
        units: the output channels of the whole layer.
        style: `"column"` or `"row"`.
        devices: the K device names; shard i lives and runs on `devices[i]`.
        activation: as in `keras.layers.Dense`.
        use_bias: as in `keras.layers.Dense`.
        kernel_initializer, bias_initializer: as in `keras.layers.Dense`
            (used only when no weights are loaded).
        **kwargs: `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Example:

    >>> layer = ShardedDense(64, "column", ["/device:CPU:0", "/device:CPU:1"], name="up")
    >>> layer(tf.ones((4, 16))).shape
    TensorShape([4, 64])
    >>> [w.shape for w in layer.kernels]
    [(16, 32), (16, 32)]
    """

    def __init__(self, units, style, devices, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        if style not in (COLUMN, ROW):
            raise ValueError(f"style must be {COLUMN!r} or {ROW!r}, got {style!r}.")
        devices = tuple(devices)
        if len(devices) < 1 or units % len(devices) and style == COLUMN:
            raise ValueError(f"A column-parallel ShardedDense needs units ({units}) divisible "
                             f"by the number of devices ({len(devices)}).")
        self.units = int(units)
        self.style = style
        self.devices = devices
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernels = []
        self.biases = []

    @classmethod
    def from_dense(cls, dense, style, devices):
        """A `ShardedDense` with the configuration (name, units, activation, dtype) of `dense`.

        Its weights are created when it is built; load the Dense's values
        with `load_full_weights(dense.kernel, dense.bias)`.

        Example:

        >>> ShardedDense.from_dense(keras.layers.Dense(8, name="up"), "column", devices).name
        'up'
        """
        config = dense.get_config()
        return cls(units=config["units"], style=style, devices=devices,
                   activation=config["activation"], use_bias=config["use_bias"],
                   kernel_initializer=config["kernel_initializer"],
                   bias_initializer=config["bias_initializer"], name=config["name"],
                   dtype=config.get("dtype"), trainable=config.get("trainable", True))

    @property
    def num_shards(self):
        """K, the number of devices."""
        return len(self.devices)

    def build(self, input_shape):
        input_dim = int(input_shape[-1])
        k = self.num_shards
        if self.style == ROW and input_dim % k:
            raise ValueError(f"The row-parallel layer {self.name!r} has {input_dim} input "
                             f"channels, which do not divide by {k} devices.")
        shape = ((input_dim, self.units // k) if self.style == COLUMN
                 else (input_dim // k, self.units))
        for index, device in enumerate(self.devices):
            with tf.device(device):
                self.kernels.append(self.add_weight(
                    name=f"kernel_shard_{index}", shape=shape,
                    initializer=self.kernel_initializer))
                if self.use_bias and self.style == COLUMN:
                    self.biases.append(self.add_weight(
                        name=f"bias_shard_{index}", shape=(self.units // k,),
                        initializer=self.bias_initializer))
        if self.use_bias and self.style == ROW:
            with tf.device(self.devices[0]):
                self.biases.append(self.add_weight(name="bias", shape=(self.units,),
                                                   initializer=self.bias_initializer))

    def call(self, inputs):
        if self.style == COLUMN:
            return self._column(inputs)
        return self._row(inputs)

    def _column(self, x):
        pieces = []
        for index, device in enumerate(self.devices):
            with tf.device(device):
                y = keras.ops.matmul(x, self.kernels[index])
                if self.use_bias:
                    y = keras.ops.add(y, self.biases[index])
                if self.activation is not None:
                    y = self.activation(y)
                pieces.append(y)
        with tf.device(self.devices[0]):
            output = keras.ops.concatenate(pieces, axis=-1)
        try:
            setattr(output, _SHARDS, tuple(pieces))
        except AttributeError:  # a tensor type without attributes: row layers slice instead
            pass
        return output

    def _row(self, x):
        k = self.num_shards
        width = int(self.kernels[0].shape[0])
        pieces = getattr(x, _SHARDS, None)
        if not (isinstance(pieces, tuple) and len(pieces) == k
                and all(p.shape[-1] == width for p in pieces)):
            pieces = []
            for index, device in enumerate(self.devices):
                with tf.device(device):
                    pieces.append(x[..., index * width:(index + 1) * width])
        partial = []
        for index, device in enumerate(self.devices):
            with tf.device(device):
                partial.append(keras.ops.matmul(pieces[index], self.kernels[index]))
        with tf.device(self.devices[0]):
            y = tf.add_n(partial)
            if self.use_bias:
                y = keras.ops.add(y, self.biases[0])
            if self.activation is not None:
                y = self.activation(y)
        return y

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def load_full_weights(self, kernel, bias=None):
        """Loads the whole layer's kernel (and bias) into the shards, each its slice.

        Args:
            kernel: the `(input_dim, units)` kernel (array or variable).
            bias: the `(units,)` bias, or None without one.

        Example:

        >>> layer.load_full_weights(dense.kernel, dense.bias)
        """
        kernel = np.asarray(kernel)
        axis = 1 if self.style == COLUMN else 0
        for variable, piece in zip(self.kernels, np.split(kernel, self.num_shards, axis=axis),
                                   strict=True):
            variable.assign(piece)
        if self.use_bias:
            bias = np.asarray(bias)
            pieces = np.split(bias, self.num_shards) if self.style == COLUMN else [bias]
            for variable, piece in zip(self.biases, pieces, strict=True):
                variable.assign(piece)

    def full_weights(self):
        """The whole layer's `[kernel, bias]` (just `[kernel]` without a bias), gathered.

        Example:

        >>> kernel, bias = layer.full_weights()
        >>> kernel.shape
        (16, 64)
        """
        axis = 1 if self.style == COLUMN else 0
        result = [np.concatenate([np.asarray(v) for v in self.kernels], axis=axis)]
        if self.use_bias:
            result.append(np.concatenate([np.asarray(v) for v in self.biases])
                          if self.style == COLUMN else np.asarray(self.biases[0]))
        return result

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, style=self.style, devices=list(self.devices),
                      activation=keras.activations.serialize(self.activation),
                      use_bias=self.use_bias,
                      kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
                      bias_initializer=keras.initializers.serialize(self.bias_initializer))
        return config
