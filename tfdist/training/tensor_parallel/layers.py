"""`ShardedDense` (a Dense layer split by channels) and `ShardedMultiHeadAttention`
(a MultiHeadAttention split by heads) over K devices, and what every split layer
shares: running a shard on its device, handing pieces over, summing partial
products (`tfdist.training.tensor_parallel.conv` splits convolutions).

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

from tfdist.seam import get_keras_mask, set_keras_mask

COLUMN = "column"
"""Style of a layer split by output channels (kernel axis -1, bias split too)."""
ROW = "row"
"""Style of a layer split by input channels (kernel axis 0, bias added once after the sum)."""
HEADS = "heads"
"""Style of a `MultiHeadAttention` split by heads (query/key/value by columns, output by rows)."""
VOCABULARY = "vocabulary"
"""Style of an `Embedding` split by vocabulary (the table's rows)."""
_SHARDS = "_tfdist_tensor_parallel_shards"  # the pieces a column-parallel output carries


def attach_pieces(output, pieces):
    """Hands the K per-device `pieces` of a column-parallel `output` over with it, for a
    row-parallel layer (or the vocabulary-split loss) that reads them instead of `output`.
    Eager tensors take no attributes: then the readers slice `output` instead.

    Example:

    >>> attach_pieces(tf.concat(pieces, -1), pieces)
    """
    try:
        setattr(output, _SHARDS, tuple(pieces))
    except AttributeError:
        pass
    return output


def pieces_of(tensor, num_pieces=None, width=None):
    """The pieces `attach_pieces` handed over with `tensor`, or None: there must be
    `num_pieces` of them (None: at least 2), each `width` wide on the last axis if given.

    Example:

    >>> pieces_of(up_output, 2, width=256)
    """
    pieces = getattr(tensor, _SHARDS, None)
    if not isinstance(pieces, tuple) or len(pieces) < 2 or (
            num_pieces is not None and len(pieces) != num_pieces):
        return None
    if width is not None and any(piece.shape[-1] != width for piece in pieces):
        return None
    return pieces


def channel_pieces(tensor, devices, channel_axis=-1):
    """The K per-device pieces of `tensor`'s channels (K = len(devices), equal widths): the
    pieces a split layer handed over with it (channels last), else slices cut on each device.

    Example:

    >>> [piece.shape for piece in channel_pieces(tf.ones((2, 8)), ["/cpu:0", "/cpu:1"])]
    [TensorShape([2, 4]), TensorShape([2, 4])]
    """
    k = len(devices)
    width = int(tensor.shape[channel_axis]) // k
    pieces = pieces_of(tensor, k, width) if channel_axis == -1 else None
    if pieces is not None:
        return list(pieces)
    cut = []
    for index, device in enumerate(devices):
        with tf.device(device):
            cut.append(tensor[..., index * width:(index + 1) * width] if channel_axis == -1
                       else tensor[:, index * width:(index + 1) * width])
    return cut


def build_on_channel_slices(layer, shards, input_shape, channel_axis, what="input channels"):
    """Builds shard i of `layer` on device i for its slice of the input's channels (`shards`:
    the per-device layers, as many as `layer.devices`).

    Raises:
        ValueError: the channels do not divide by the number of devices.

    Example:

    >>> build_on_channel_slices(self, self.convs, (None, 8, 8, 16), -1)  # each (None, 8, 8, 8)
    """
    channels = int(input_shape[channel_axis])
    k = len(layer.devices)
    if channels % k:
        raise ValueError(f"The {type(layer).__name__} {layer.name!r} has {channels} {what}, "
                         f"which do not divide by {k} devices.")
    shard_shape = list(input_shape)
    shard_shape[channel_axis] = channels // k
    for device, shard in zip(layer.devices, shards, strict=True):
        with tf.device(device):
            shard.build(tuple(shard_shape))


def on_device(device, function, *inputs):
    """`function(*inputs)` computed on `device`, and its backward on `device` too.

    TensorFlow places the ops of a forward pass where `tf.device` says, but
    the ops `GradientTape.gradient` creates for them carry no device and run
    on the default device (the first one): a shard's backward would then run
    on device 0, moving its activations there. This wraps the shard's
    computation in a `tf.custom_gradient` whose gradient is taken, under the
    same device, from a tape recorded during the forward (no recomputation),
    for the inputs and for the variables `function` reads.

    A tensor passed twice (self-attention's query and value) is one input
    of the wrapped function, so that its gradient is counted once.

    Args:
        device: a device name.
        function: takes the tensors `inputs` (positionally), returns a tensor
            (or a flat tuple of them).
        *inputs: tensors.

    Example:

    >>> y = on_device("/device:CPU:1", lambda x: keras.ops.matmul(x, kernel), x)
    """
    unique, positions = [], []
    for tensor in inputs:
        position = next((i for i, seen in enumerate(unique) if seen is tensor), None)
        if position is None:
            unique.append(tensor)
            position = len(unique) - 1
        positions.append(position)

    @tf.custom_gradient
    def shard(*tensors):
        with tf.GradientTape() as tape:
            for tensor in tensors:
                tape.watch(tensor)
            output = function(*[tensors[position] for position in positions])

        def backward(*upstream, variables=None):
            variables = list(variables or ())
            differentiable = [v for v in variables if v.dtype.is_floating]  # not seed states
            with tf.device(device):
                grads = tape.gradient(tf.nest.flatten(output), list(tensors) + differentiable,
                                      output_gradients=list(upstream))
            by_variable = dict(zip((id(v) for v in differentiable), grads[len(tensors):],
                                   strict=True))
            return grads[:len(tensors)], [by_variable.get(id(v)) for v in variables]

        return output, backward

    with tf.device(device):
        return shard(*unique)


def sum_partial_products(partials):
    """The sum of a row-parallel layer's K partial products, in float32, cast back.

    Under a mixed policy (`mixed_bfloat16`, `mixed_float16`) each shard's
    matmul runs in the compute dtype and its partial product arrives in it
    (so what travels between devices is half-width). The K partials are added
    in float32 and the sum rounded to the compute dtype once: on one device
    the matmul accumulates the whole contraction before its single rounding,
    so summing in float32 keeps the split layer's output within one rounding
    of one device's, where K-1 additions in bfloat16 (8 bits of mantissa)
    would each round again. In float32 the casts are no-ops.

    Example:

    >>> sum_partial_products([tf.ones((2, 3), "bfloat16")] * 2).dtype
    tf.bfloat16
    """
    dtype = partials[0].dtype
    if dtype == tf.float32 or not dtype.is_floating:
        return tf.add_n(partials)
    return tf.cast(tf.add_n([tf.cast(p, tf.float32) for p in partials]), dtype)


@keras.saving.register_keras_serializable(package="tfdist")
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
        def column(index):
            def piece(inputs):
                y = keras.ops.matmul(inputs, self.kernels[index])
                if self.use_bias:
                    y = keras.ops.add(y, self.biases[index])
                return self.activation(y) if self.activation is not None else y
            return piece

        pieces = [on_device(device, column(index), x)
                  for index, device in enumerate(self.devices)]
        with tf.device(self.devices[0]):
            output = keras.ops.concatenate(pieces, axis=-1)
        return attach_pieces(output, pieces)

    def _row(self, x):
        pieces = channel_pieces(x, self.devices)

        def row(index):
            return lambda inputs: keras.ops.matmul(inputs, self.kernels[index])

        partial = [on_device(device, row(index), pieces[index])
                   for index, device in enumerate(self.devices)]
        with tf.device(self.devices[0]):
            y = sum_partial_products(partial)
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

    def load_from(self, dense):
        """Loads the weights of `dense`, the `keras.layers.Dense` this layer splits.

        Example:

        >>> split.get_layer("up").load_from(model.get_layer("up"))
        """
        self.load_full_weights(dense.kernel, dense.bias if dense.use_bias else None)

    def gather_into(self, dense):
        """Writes this layer's gathered weights into `dense` (the Dense it splits).

        Example:

        >>> split.get_layer("up").gather_into(model.get_layer("up"))
        """
        dense.set_weights(self.full_weights())

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


def config_and_identity(layer):
    """(`layer`'s config without its name, dtype and trainable flag; those three as the
    keyword arguments that give its split the same name, dtype policy and trainability).

    Example:

    >>> config, identity = config_and_identity(keras.layers.Conv2D(8, 3, name="conv"))
    >>> identity["name"], "name" in config
    ('conv', False)
    """
    config = layer.get_config()
    for key in ("name", "trainable", "dtype"):
        config.pop(key, None)
    return config, {"name": layer.name, "dtype": layer.dtype_policy,
                    "trainable": layer.trainable}


@keras.saving.register_keras_serializable(package="tfdist")
class ShardedMultiHeadAttention(keras.layers.Layer):
    """A `keras.layers.MultiHeadAttention` split by heads over K devices.

    Shard i is a `MultiHeadAttention` with `num_heads / K` heads on device i:
    its query, key and value projections are the columns of heads
    `i*H/K .. (i+1)*H/K` (column-parallel), its attention runs on those
    heads only, and its output projection takes the matching rows of the
    output kernel (row-parallel), giving a partial sum. The K partial sums are
    added on the first device. The output bias is added once: shard 0 holds
    it, the other shards' output biases are zeros and not trained. Masks,
    the causal mask and `training` reach every shard as they would the
    whole layer. With attention dropout each shard draws its own pattern (a
    different random stream than one device's).

    Args:
        config: the `get_config()` of the `MultiHeadAttention` to split.
        devices: the K device names.
        **kwargs: `keras.layers.Layer` arguments (`name`, ...).

    Example:

    >>> mha = keras.layers.MultiHeadAttention(4, 8, name="attention")
    >>> layer = ShardedMultiHeadAttention.from_attention(mha, ["/device:CPU:0", "/device:CPU:1"])
    >>> x = tf.ones((2, 5, 16))
    >>> layer(x, x).shape
    TensorShape([2, 5, 16])
    """

    def __init__(self, config, devices, **kwargs):
        super().__init__(**kwargs)
        self.devices = tuple(devices)
        self.attention_config = dict(config)
        k = len(self.devices)
        heads = int(config["num_heads"])
        if heads % k:
            raise ValueError(f"{heads} heads do not divide by {k} devices.")
        self.heads = []
        for index, device in enumerate(self.devices):
            shard = dict(config, num_heads=heads // k, name=f"heads_{index}",
                         dtype=self.dtype_policy)  # the layer's policy (mixed precision)
            self.heads.append(keras.layers.MultiHeadAttention.from_config(shard))

    @classmethod
    def from_attention(cls, attention, devices):
        """The split of the `MultiHeadAttention` `attention` (same name; weights loaded later).

        Example:

        >>> ShardedMultiHeadAttention.from_attention(mha, devices).name
        'attention'
        """
        config, identity = config_and_identity(attention)
        return cls(config, devices, **identity)

    @property
    def num_shards(self):
        """K, the number of devices."""
        return len(self.devices)

    def build(self, query_shape, value_shape, key_shape=None):
        for index, (device, shard) in enumerate(zip(self.devices, self.heads, strict=True)):
            with tf.device(device):
                shard.build(query_shape, value_shape, key_shape)
            if index and shard.output_dense.bias is not None:
                shard.output_dense.bias.assign(tf.zeros_like(shard.output_dense.bias))
                shard.output_dense.bias.trainable = False  # the bias is added once, by shard 0

    def call(self, query, value, key=None, query_mask=None, value_mask=None, key_mask=None,
             attention_mask=None, return_attention_scores=False, training=None,
             use_causal_mask=False):
        tensors = [t for t in (query, value, key) if t is not None]
        masks = [get_keras_mask(t) for t in tensors]
        outputs, scores = [], []
        for device, shard in zip(self.devices, self.heads, strict=True):
            for tensor, mask in zip(tensors, masks, strict=True):
                set_keras_mask(tensor, mask)  # MultiHeadAttention takes them off its inputs

            def heads(*inputs, shard=shard):
                q, v, k = (list(inputs) + [None])[:3]
                return shard(q, v, k, query_mask=query_mask, value_mask=value_mask,
                             key_mask=key_mask, attention_mask=attention_mask,
                             return_attention_scores=return_attention_scores,
                             training=training, use_causal_mask=use_causal_mask)

            result = on_device(device, heads, *tensors)
            if return_attention_scores:
                result, score = result
                scores.append(score)
            outputs.append(result)
        with tf.device(self.devices[0]):
            output = sum_partial_products(outputs)
            if scores:
                return output, keras.ops.concatenate(scores, axis=1)
        return output

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        return self.heads[0].compute_output_shape(query_shape, value_shape, key_shape)

    def load_from(self, attention):
        """Loads the weights of `attention`, the `MultiHeadAttention` this layer splits.

        Example:

        >>> split_block.attention.load_from(block.attention)
        """
        k = self.num_shards
        for name in ("query_dense", "key_dense", "value_dense"):
            for index, shard in enumerate(self.heads):
                source, target = getattr(attention, name), getattr(shard, name)
                target.kernel.assign(np.split(np.asarray(source.kernel), k, axis=1)[index])
                if source.bias is not None:
                    target.bias.assign(np.split(np.asarray(source.bias), k, axis=0)[index])
        for index, shard in enumerate(self.heads):
            source, target = attention.output_dense, shard.output_dense
            target.kernel.assign(np.split(np.asarray(source.kernel), k, axis=0)[index])
            if source.bias is not None and index == 0:
                target.bias.assign(np.asarray(source.bias))

    def gather_into(self, attention):
        """Writes this layer's gathered weights into `attention` (the layer it splits).

        Example:

        >>> split_block.attention.gather_into(block.attention)
        """
        for name in ("query_dense", "key_dense", "value_dense"):
            target = getattr(attention, name)
            parts = [getattr(shard, name) for shard in self.heads]
            target.kernel.assign(np.concatenate([np.asarray(p.kernel) for p in parts], axis=1))
            if target.bias is not None:
                target.bias.assign(np.concatenate([np.asarray(p.bias) for p in parts], axis=0))
        target = attention.output_dense
        target.kernel.assign(np.concatenate(
            [np.asarray(shard.output_dense.kernel) for shard in self.heads], axis=0))
        if target.bias is not None:
            target.bias.assign(np.asarray(self.heads[0].output_dense.bias))

    def get_config(self):
        config = super().get_config()
        config.update(config=self.attention_config, devices=list(self.devices))
        return config
