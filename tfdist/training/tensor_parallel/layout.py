"""From a Keras `LayoutMap` to a per-layer tensor-parallel plan.

A `keras.distribution.LayoutMap` maps variable-path patterns (regular
expressions, matched in full against `variable.path` as Keras does) to
layouts: one entry per axis of the variable, the name of a `DeviceMesh` axis
where that axis is sharded, None where it is not. tfdist reads it as a
description (it does not use Keras's TensorFlow `distribution_lib`, a
"DO NOT USE" prototype) and turns it into a `ShardPlan`:

* The tensor-parallel mesh axis is the one mesh axis with more than one
  device; its size must be K (`tensor_parallel=K`). Axes of size 1 (a
  `"batch"` axis of a keras-hub layout on one worker) read as None.
* A `keras.layers.Dense` whose kernel `(in, out)` is laid out
  `(None, "model")` is **column-parallel**: output channels split, shard i
  holds kernel columns and bias entries `[i*out/K, (i+1)*out/K)`, computes
  its share of the output (activation included) on device i.
* A Dense laid out `("model", None)` is **row-parallel**: input channels
  split, shard i holds kernel rows `[i*in/K, (i+1)*in/K)` and multiplies the
  matching slice of the input on device i; the K partial products are summed
  and the bias (not split) is added once after the sum.
* A column-parallel Dense whose output feeds a row-parallel Dense directly
  (the Megatron MLP pair `Dense(4d, gelu) -> Dense(d)`) hands its K output
  shards over as they are: the pair costs one sum of partial products
  forward (and one of input gradients backward), no gather in between.
* A `keras.layers.MultiHeadAttention` whose query, key and value kernels
  `(in, heads, head_dim)` are laid out `(None, "model", None)` and whose
  output kernel `(heads, head_dim, out)` is laid out `("model", None, None)`
  is split **by heads**: shard i runs heads `i*H/K .. (i+1)*H/K` (its
  projections' columns, its attention, its rows of the output projection)
  on device i; the K partial outputs are summed and the output bias added
  once. Query/key/value biases may be laid out `("model", None)` (they are
  split with their heads either way); the output bias is not split.
* A `keras.layers.Conv2D` whose kernel `(kh, kw, in, filters)` is laid out
  `(None, None, None, "model")` is split **by output channels**: shard i
  holds filters `[i*F/K, (i+1)*F/K)` (kernel and bias) and computes those
  output channels on device i; the K pieces are concatenated on the first
  device for the next layer, which is not split. Laid out
  `(None, None, "model", None)` it is split **by input channels**: shard i
  holds the kernel of input channels `[i*C/K, (i+1)*C/K)` and convolves those
  channels on device i; the K partial outputs are summed on the first device,
  then the bias (not split) is added and the activation applied. `Conv1D`
  and `Conv3D` are split the same ways (one spatial axis fewer or more), and
  so are the transposed convolutions, whose kernels are `(..., filters, in)`.
* A `keras.layers.DepthwiseConv2D` (or `DepthwiseConv1D`) whose kernel
  `(kh, kw, channels, depth_multiplier)` is laid out
  `(None, None, "model", None)` is split **by channels**: shard i filters
  channels `[i*C/K, (i+1)*C/K)` (kernel and bias) on device i, and the K
  output blocks are concatenated (`tfdist.training.tensor_parallel.depthwise`).
* A `keras.layers.SeparableConv2D` (or `SeparableConv1D`) whose depthwise and
  pointwise kernels are both laid out on their channel axis
  (`(None, None, "model", None)`) is split **by input channels**: shard i runs
  both halves on its channels, the K partial outputs are summed, then the
  bias (not split) is added.
* A `keras.layers.Embedding` whose table `(vocab, width)` is laid out
  `("model", None)` is split **by vocabulary**: shard i holds rows
  `[i*V/K, (i+1)*V/K)` and looks up the ids in them; the K partial lookups
  are summed on the first device (`tfdist.training.tensor_parallel.embedding`).
* Variables no layout entry matches (or whose layout shards nothing) are
  replicated: one copy, on the first device.

Anything a layout shards that tfdist cannot split is refused, naming the
layer, the variable path and why: a layer that is not a plain Dense,
MultiHeadAttention, Conv1D/2D/3D (transposed too), DepthwiseConv1D/2D,
SeparableConv1D/2D or Embedding (the class is named; subclasses are not split),
an embedding laid out on
its width or whose vocabulary K does not divide, an attention laid out in part, a layer
deeper than one level inside a top-level layer or not held as an attribute
of it (a layer is split at the model's top level, or as an attribute of a
top-level layer, such as a Transformer block's `ffn_in` or `attention`: the
split model's copy of that block gets the split layer in that attribute), a
kernel sharded on both axes, a sharded width or head count that K does not
divide, a row-parallel or attention-output bias, a bias sharded without its
kernel, and features the split does not reproduce (regularisers,
constraints, LoRA, quantisation, attention gates).

Example:

    plan = plan_shards(model, layout_map, 2)
    print(plan.describe())
"""

import dataclasses
import re

import keras

from tfdist.seam import direct_sublayers
from tfdist.training.model_parallel.stages import layer_graph
from tfdist.training.tensor_parallel.conv import (CONV_CLASSES, FILTERS, INPUT_CHANNELS,
                                                  conv_kernel_axes)
from tfdist.training.tensor_parallel.depthwise import (CHANNELS, DEPTHWISE_CLASSES, SEPARABLE,
                                                       SEPARABLE_CLASSES)
from tfdist.training.tensor_parallel.einsum import einsum_specs, split_style
from tfdist.training.tensor_parallel.layers import COLUMN, HEADS, ROW, VOCABULARY


class ShardLayoutError(ValueError):
    """A layout asks for a split tfdist cannot do; the message names the layer, the path and why.

    Example:

        try:
            plan = plan_shards(model, layout_map, num_shards=2)
        except ShardLayoutError as error:
            print(error)  # names the layer, the variable path and why
    """


@dataclasses.dataclass(frozen=True)
class LayerShard:
    """How one layer is split.

    Args:
        layer: the layer's name; `"<parent>/<name>"` for a Dense inside a
            top-level layer (a Transformer block's `ffn_in`).
        style: `COLUMN`, `ROW`, `HEADS` (a MultiHeadAttention; `units` is
            then its number of heads), `FILTERS` or `INPUT_CHANNELS` (a
            convolution; `units` is its number of filters).
        kernel_path: the kernel variable's path (`"up/kernel"`).
        input_dim: the kernel's input channels.
        units: the kernel's output channels.
        parent: the name of the top-level layer holding it, or None.
        kernel_shape: the whole kernel's shape (a Conv2D's `(kh, kw, in, filters)`,
            an EinsumDense's), or None for a Dense's `(input_dim, units)`.
        einsum_letter: for an EinsumDense, the equation letter of the split
            kernel axis; None otherwise.
        einsum_axis: for an EinsumDense, the split kernel axis; None otherwise.
        split_axis: for a convolution, the split kernel axis (negative); None
            otherwise.

    Example:

    >>> LayerShard("up", COLUMN, "up/kernel", 16, 64).describe(2)
    'up  column-parallel  kernel (16, 64) -> 2 x (16, 32)'
    """

    layer: str
    style: str
    kernel_path: str
    input_dim: int
    units: int
    parent: str = None
    kernel_shape: tuple = None
    einsum_letter: str = None
    einsum_axis: int = None
    split_axis: int = None

    def shard_shape(self, num_shards):
        """The shape of one kernel shard (split attention: `(heads per shard,)`).

        Example:

        >>> LayerShard("down", ROW, "down/kernel", 64, 16).shard_shape(2)
        (32, 16)
        """
        axis = self.einsum_axis if self.einsum_axis is not None else self.split_axis
        if axis is not None:
            shape = list(self.kernel_shape)
            shape[axis] //= num_shards
            return tuple(shape)
        if self.style == COLUMN:
            return (self.input_dim, self.units // num_shards)
        if self.style == HEADS:
            return (self.units // num_shards,)
        return (self.input_dim // num_shards, self.units)  # ROW, VOCABULARY

    def describe(self, num_shards):
        """One line: layer, style, kernel shape and shard shape.

        Example:

        >>> LayerShard("down", ROW, "down/kernel", 64, 16).describe(2)
        'down  row-parallel  kernel (64, 16) -> 2 x (32, 16)'
        """
        if self.style == HEADS:
            return (f"{self.layer}  heads-parallel  {self.units} heads -> {num_shards} x "
                    f"{self.units // num_shards}")
        if self.style in (FILTERS, INPUT_CHANNELS, CHANNELS, SEPARABLE):
            style = {FILTERS: "filters", INPUT_CHANNELS: "input-channels",
                     SEPARABLE: "separable-input-channels"}.get(self.style, "channels")
            return (f"{self.layer}  {style}-parallel  kernel {tuple(self.kernel_shape)} -> "
                    f"{num_shards} x {self.shard_shape(num_shards)}")
        if self.einsum_axis is not None:
            return (f"{self.layer}  {self.style}-parallel  einsum kernel "
                    f"{tuple(self.kernel_shape)} -> {num_shards} x {self.shard_shape(num_shards)}")
        if self.style == VOCABULARY:
            return (f"{self.layer}  vocabulary-parallel  table {(self.input_dim, self.units)} -> "
                    f"{num_shards} x {self.shard_shape(num_shards)}")
        return (f"{self.layer}  {self.style}-parallel  kernel {(self.input_dim, self.units)} -> "
                f"{num_shards} x {self.shard_shape(num_shards)}")


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Which layers of a model are split, and how, over K devices.

    Args:
        model_name: the model's name.
        num_shards: K.
        mesh_axis: the layout's tensor-parallel mesh axis name.
        layers: the `LayerShard`s, in layer order.
        unused_patterns: layout keys that matched no variable of the model.
        devices: the K device names, or None before placement.

    Example:

    >>> plan = plan_shards(model, layout_map, 2)
    >>> [(shard.layer, shard.style) for shard in plan.layers]
    [('up', 'column'), ('down', 'row')]
    """

    model_name: str
    num_shards: int
    mesh_axis: str
    layers: tuple
    unused_patterns: tuple = ()
    devices: tuple = None

    def shard_of(self, layer_name):
        """The `LayerShard` of `layer_name`, or None when that layer is replicated.

        Example:

        >>> plan.shard_of("up").style
        'column'
        """
        return next((shard for shard in self.layers if shard.layer == layer_name), None)

    def with_devices(self, devices):
        """Returns the plan with shard i on `devices[i]`.

        Example:

        >>> plan.with_devices(["/device:CPU:0", "/device:CPU:1"]).devices
        ('/device:CPU:0', '/device:CPU:1')
        """
        if len(devices) != self.num_shards:
            raise ValueError(f"{self.num_shards} shards need {self.num_shards} devices, got "
                             f"{list(devices)}.")
        return dataclasses.replace(self, devices=tuple(devices))

    def describe(self):
        """Several lines: one per split layer, then the layout keys that matched nothing.

        Example:

        >>> print(plan.describe())
        tensor_parallel=2 over mesh axis 'model' of 'mlp' (2 layers split)
          up  column-parallel  kernel (16, 64) -> 2 x (16, 32)
          down  row-parallel  kernel (64, 16) -> 2 x (32, 16)
        """
        lines = [f"tensor_parallel={self.num_shards} over mesh axis {self.mesh_axis!r} of "
                 f"{self.model_name!r} ({len(self.layers)} layer"
                 f"{'s' if len(self.layers) != 1 else ''} split)"]
        lines += [f"  {shard.describe(self.num_shards)}" for shard in self.layers]
        if self.unused_patterns:
            lines.append(f"  layout keys matching no variable: {', '.join(self.unused_patterns)}")
        return "\n".join(lines)


def tensor_parallel_axis(layout_map, num_shards):
    """The name of the layout's tensor-parallel mesh axis (the one with more than one device).

    Args:
        layout_map: a `keras.distribution.LayoutMap` with a `DeviceMesh`.
        num_shards: K, which that axis's size must equal.

    Raises:
        ShardLayoutError: no mesh, no axis or several axes with more than one
            device, or an axis size other than K.

    Example:

    >>> mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], ["cpu:0", "cpu:1"])
    >>> tensor_parallel_axis(keras.distribution.LayoutMap(mesh), 2)
    'model'
    """
    mesh = layout_map.device_mesh
    if mesh is None:
        raise ShardLayoutError(
            "The LayoutMap has no DeviceMesh, so its axis names mean nothing. Build it as "
            "keras.distribution.LayoutMap(keras.distribution.DeviceMesh((K,), ['model'], "
            "devices=[...])).")
    wide = [(name, size) for name, size in zip(mesh.axis_names, mesh.shape, strict=True)
            if size > 1]
    if len(wide) != 1 or wide[0][1] != num_shards:
        raise ShardLayoutError(
            f"tensor_parallel={num_shards} needs a DeviceMesh with exactly one axis of "
            f"{num_shards} devices (the axis the layout shards over; axes of size 1 are "
            f"ignored), got shape {tuple(mesh.shape)} with axes {list(mesh.axis_names)}. "
            f"Use e.g. DeviceMesh(({num_shards},), ['model'], devices=[...]), or set "
            "tensor_parallel to the size of the mesh's model axis.")
    return wide[0][0]


def plan_shards(model, layout_map, num_shards):
    """Turns `layout_map` into the `ShardPlan` of `model` over K devices.

    Args:
        model: a built Functional or Sequential `keras.Model`.
        layout_map: a `keras.distribution.LayoutMap` (variable-path pattern
            -> layout; see the module docstring).
        num_shards: K, an integer >= 2.

    Returns:
        A `ShardPlan` without devices (see `ShardPlan.with_devices`).

    Raises:
        TypeError: `layout_map` is not a `LayoutMap`.
        ShardLayoutError: a split tfdist cannot do (the message names the
            layer, the variable path and why); also a subclassed model
            (`tfdist.training.model_parallel.stages.StageSplitError`, a
            ValueError, from finding the layer graph).

    Example:

    >>> plan_shards(model, layout_map, 2).shard_of("down").style
    'row'
    """
    if not isinstance(layout_map, keras.distribution.LayoutMap):
        raise TypeError(
            f"layout_map must be a keras.distribution.LayoutMap, got "
            f"{type(layout_map).__name__}. Build one: layout_map = keras.distribution."
            "LayoutMap(mesh); layout_map['up/kernel'] = (None, 'model').")
    axis = tensor_parallel_axis(layout_map, num_shards)
    sizes = dict(zip(layout_map.device_mesh.axis_names, layout_map.device_mesh.shape,
                     strict=True))
    graph = layer_graph(model)
    owners = {}  # id(variable) -> the top-level layer that holds it
    for layer in graph.operations:
        for variable in getattr(layer, "weights", ()):
            owners.setdefault(id(variable), layer)
    used_patterns = set()
    sharded = {}  # layer name -> {"kernel"/"bias": axes}
    order = []
    for variable in model.weights:
        patterns = [p for p in layout_map if p == variable.path or re.fullmatch(p, variable.path)]
        used_patterns.update(patterns)
        layout = layout_map[variable.path]  # Keras refuses a path matched by several keys
        if layout is None:
            continue
        axes = tuple(a if a is not None and sizes.get(a, 1) > 1 else None for a in layout.axes)
        if axis not in axes:
            continue
        layer, name, parent = _split_target(owners.get(id(variable)), variable, model)
        role = (_attention_role(layer, name, variable) if _is_attention(layer)
                else _conv_role(layer, name, variable) if _is_conv(layer) or _is_depthwise(layer)
                else _separable_role(layer, name, variable) if _is_separable(layer)
                else _embedding_role(layer, name, variable) if _is_embedding(layer)
                else _dense_role(layer, name, variable))
        if name not in sharded:
            sharded[name] = {}
            order.append((layer, name, parent))
        sharded[name][role] = axes
    shards = tuple(_shard_builder(layer)(layer, name, parent, sharded[name], axis, num_shards)
                   for layer, name, parent in order)
    unused = tuple(p for p in layout_map if p not in used_patterns)
    return ShardPlan(model_name=model.name, num_shards=num_shards, mesh_axis=axis,
                     layers=shards, unused_patterns=unused)


def _is_splittable(layer):
    return (type(layer) is keras.layers.Dense or _is_attention(layer) or _is_conv(layer)
            or _is_depthwise(layer) or _is_separable(layer) or _is_embedding(layer)
            or _is_einsum(layer))


def _is_einsum(layer):
    return type(layer) is keras.layers.EinsumDense


def _einsum_shard(layer, name, parent, roles, axis, num_shards):
    """The `LayerShard` of an EinsumDense split along the one kernel axis its layout shards."""
    path, shape = layer.kernel.path, tuple(int(d) for d in layer.kernel.shape)
    if "kernel" not in roles:
        raise ShardLayoutError(
            f"The layout shards the bias {layer.bias.path!r} of the EinsumDense layer {name!r} "
            f"but not its kernel {path!r}: a bias is split only with its kernel.")
    axes = roles["kernel"]
    where = [index for index, a in enumerate(axes) if a == axis]
    if len(axes) != len(shape) or len(where) != 1:
        raise ShardLayoutError(
            f"The layout of {path!r} (EinsumDense {name!r}, kernel {shape}) is {axes}: lay out "
            f"exactly one of its {len(shape)} axes on {axis!r}.")
    try:
        _, kernel_spec, _ = einsum_specs(layer.equation)
    except ValueError as error:
        raise ShardLayoutError(f"{error} (layer {name!r})") from None
    letter = kernel_spec[where[0]]
    style = split_style(layer.equation, letter)
    if style is None:
        raise ShardLayoutError(
            f"The layout of {path!r} shards the kernel axis {letter!r} of the EinsumDense "
            f"{name!r} ({layer.equation!r}), which is in both its input and output (or in "
            "neither): tfdist splits an output axis (column-parallel) or a contracted input "
            "axis (row-parallel). Lay out another axis, or drop the entry.")
    if shape[where[0]] % num_shards:
        raise ShardLayoutError(
            f"The kernel axis {letter!r} of the EinsumDense {name!r} has {shape[where[0]]} "
            f"entries, which do not divide by {num_shards} devices.")
    bias_axes = getattr(layer, "bias_axes", None) or ""
    if "bias" in roles and (style == ROW or letter not in bias_axes):
        raise ShardLayoutError(
            f"The layout shards the bias of the EinsumDense {name!r}, but its bias does not "
            f"vary along the split axis {letter!r} ({style}-parallel): it is added once, "
            "whole, after the shards. Drop the bias entry.")
    return LayerShard(name, style, path, shape[0], shape[-1], parent, kernel_shape=shape,
                      einsum_letter=letter, einsum_axis=where[0])


def _is_embedding(layer):
    return type(layer) is keras.layers.Embedding


def _embedding_role(layer, name, variable):
    """`"embeddings"` of a splittable Embedding, else a `ShardLayoutError` saying why."""
    _refuse_unsplit_features("Embedding", name, variable, _lora(layer), _quantized(layer),
                             _unsplit_feature(lambda feature: getattr(layer, feature, None),
                                              EMBEDDING_UNSPLIT_FEATURES))
    return "embeddings"


def _embedding_shard(layer, name, parent, roles, axis, num_shards):
    """The `LayerShard` of an Embedding split by vocabulary (its table laid out (axis, None))."""
    path = layer.embeddings.path
    if roles["embeddings"] != (axis, None):
        raise ShardLayoutError(
            f"The layout of {path!r} (Embedding {name!r}) is {roles['embeddings']}: tfdist "
            f"splits an embedding table by vocabulary only, ({axis!r}, None). Use that, or "
            "drop the entry (the embedding then runs replicated).")
    if layer.input_dim % num_shards:
        raise ShardLayoutError(
            f"The Embedding {name!r} has a vocabulary of {layer.input_dim}, which does not "
            f"divide by {num_shards} devices. Drop its entry from the layout (it then runs "
            "replicated), or pad the vocabulary to a multiple of the tensor-parallel degree.")
    return LayerShard(name, VOCABULARY, path, layer.input_dim, layer.output_dim, parent)


def _is_conv(layer):
    return type(layer) in CONV_CLASSES.values()


def _is_depthwise(layer):
    return type(layer) in DEPTHWISE_CLASSES.values()


def _is_separable(layer):
    return type(layer) in SEPARABLE_CLASSES.values()


def _shard_builder(layer):
    if _is_attention(layer):
        return _attention_shard
    if _is_embedding(layer):
        return _embedding_shard
    if _is_einsum(layer):
        return _einsum_shard
    if _is_depthwise(layer):
        return _depthwise_shard
    if _is_separable(layer):
        return _separable_shard
    return _conv_shard if _is_conv(layer) else _layer_shard


def _is_attention(layer):
    return type(layer) is keras.layers.MultiHeadAttention


def _split_target(top, variable, model):
    """`(layer, name, parent name or None)`: the splittable Dense or MultiHeadAttention holding
    `variable`, at the model's top level or one level inside a top-level layer (a block's
    attribute), else a `ShardLayoutError` saying why."""
    if top is None:
        raise ShardLayoutError(
            f"The layout shards the variable {variable.path!r}, which belongs to no top-level "
            f"layer of the model {model.name!r}.")
    if _is_splittable(top):
        return top, top.name, None
    inner = next((sub for sub in direct_sublayers(top)
                  if any(v is variable for v in sub.weights)), None)
    if inner is None:
        _refuse_class(top, top.name, variable)
    name = f"{top.name}/{inner.name}"
    if not _is_splittable(inner):
        _refuse_class(inner, name, variable)
    if not any(value is inner for value in vars(top).values()):
        raise ShardLayoutError(
            f"The layout shards the variable {variable.path!r} of the layer {name!r}, "
            f"which its parent {top.name!r} ({type(top).__name__}) does not hold as an "
            "attribute (a list or dict of layers?): tfdist replaces a Dense inside a layer "
            "through the attribute that holds it. Drop that entry from the layout.")
    return inner, name, top.name


def _refuse_class(layer, name, variable):
    inside = ("" if "/" not in name else
              " (at the model's top level or one level inside a top-level layer)")
    raise ShardLayoutError(
        f"The layout shards the variable {variable.path!r} of the layer {name!r}, a "
        f"{type(layer).__name__}: tfdist splits only keras.layers.Dense, "
        f"keras.layers.EinsumDense (along one kernel axis), keras.layers.MultiHeadAttention "
        f"(by heads), keras.layers.Conv1D, Conv2D and Conv3D and their transposed forms (by "
        f"output or input channels), DepthwiseConv1D and DepthwiseConv2D (by channels) and "
        f"SeparableConv1D and SeparableConv2D (by input channels) and keras.layers.Embedding "
        f"(by vocabulary) so far{inside}. Drop that entry from the layout (the layer then "
        "runs replicated).")


UNSPLIT_FEATURES = ("kernel_regularizer", "bias_regularizer", "activity_regularizer",
                    "kernel_constraint", "bias_constraint", "depthwise_regularizer",
                    "depthwise_constraint", "pointwise_regularizer", "pointwise_constraint")


EMBEDDING_UNSPLIT_FEATURES = ("embeddings_regularizer", "activity_regularizer",
                              "embeddings_constraint")


def _unsplit_feature(read, features=UNSPLIT_FEATURES):
    """Why a layer's regularizer or constraint keeps it whole (`read(name)` gives one), or None."""
    for feature in features:
        if read(feature) is not None:
            return f"it has a {feature} (not split yet)"
    return None


def _lora(layer):
    return "it has LoRA enabled" if getattr(layer, "lora_enabled", False) else None


def _quantized(layer):
    quantized = getattr(layer, "quantization_mode", None)
    return f"it is quantized ({quantized})" if quantized else None


def _refuse_unsplit_features(kind, name, variable, *reasons):
    """A `ShardLayoutError` with the first of `reasons` that is not None (a feature of the
    `kind` layer `name` that its split would not reproduce); nothing when all are None."""
    why = next((reason for reason in reasons if reason), None)
    if why:
        raise ShardLayoutError(
            f"The layout shards the variable {variable.path!r} of the {kind} layer {name!r}, "
            f"but {why}. Remove that from the layer, or drop the layer's entries from the "
            "layout.")


def _kernel_or_bias_role(layer, kind, name, variable, *reasons):
    """`"kernel"` or `"bias"` of a splittable `kind` layer (Dense, EinsumDense, a convolution), else
    a `ShardLayoutError` with the first of `reasons` that is not None."""
    _refuse_unsplit_features(kind, name, variable, *reasons)
    if variable is layer.kernel:
        return "kernel"
    if getattr(layer, "bias", None) is not None and variable is layer.bias:
        return "bias"
    raise ShardLayoutError(f"The variable {variable.path!r} of the {kind} layer {name!r} is "
                           "neither its kernel nor its bias.")


def _dense_role(layer, name, variable):
    """`"kernel"` or `"bias"` of a splittable Dense or EinsumDense, else a `ShardLayoutError`
    saying why."""
    return _kernel_or_bias_role(layer, type(layer).__name__, name, variable, _lora(layer),
                                _quantized(layer),
                                _unsplit_feature(lambda feature: getattr(layer, feature, None)))


def _layer_shard(layer, name, parent, roles, axis, num_shards):
    """The `LayerShard` of a Dense from the layouts of its kernel and bias."""
    kernel = layer.kernel
    input_dim, units = (int(d) for d in kernel.shape)
    path = kernel.path
    if "kernel" not in roles:
        raise ShardLayoutError(
            f"The layout shards the bias {layer.bias.path!r} of the Dense layer {name!r} "
            f"but not its kernel {path!r}: a bias is split only with its kernel. Lay out the "
            f"kernel as (None, {axis!r}) (column-parallel), or drop the bias entry.")
    axes = roles["kernel"]
    if len(axes) != 2:
        raise ShardLayoutError(
            f"The layout of {path!r} (layer {name!r}) has {len(axes)} axes, but the "
            f"kernel has 2 (in, out): use (None, {axis!r}) or ({axis!r}, None).")
    if axes == (axis, axis):
        raise ShardLayoutError(
            f"The layout of {path!r} (layer {name!r}) shards both kernel axes over "
            f"{axis!r}; shard one: (None, {axis!r}) splits the output channels, "
            f"({axis!r}, None) the input channels.")
    style = COLUMN if axes[1] == axis else ROW
    size, what = (units, "output channels") if style == COLUMN else (input_dim, "input channels")
    if size % num_shards:
        raise ShardLayoutError(
            f"The layout splits the {what} of {path!r} (layer {name!r}, kernel "
            f"{(input_dim, units)}) over {num_shards} devices, but {size} does not divide by "
            f"{num_shards}. Use a tensor_parallel that divides {size}, change the layer's "
            "width, or drop it from the layout.")
    bias = roles.get("bias")
    if style == ROW and bias is not None:
        raise ShardLayoutError(
            f"The layout shards the bias {layer.bias.path!r} of the row-parallel Dense layer "
            f"{name!r}: a row-parallel layer adds its bias once, after summing the "
            "partial products, so the bias is not split. Lay it out as (None,) or drop "
            "its entry.")
    return LayerShard(layer=name, style=style, kernel_path=path, input_dim=input_dim,
                      units=units, parent=parent)


ATTENTION_PARTS = {"query_dense": "query", "key_dense": "key", "value_dense": "value",
                   "output_dense": "attention_output"}
"""A MultiHeadAttention's projections: its attribute -> the name in the variable paths."""


def _attention_role(layer, name, variable):
    """`"<projection>/kernel"` or `"<projection>/bias"` of a splittable MultiHeadAttention."""
    config = layer.get_config()
    why = ("it uses a gate (use_gate=True; not split yet)" if config.get("use_gate")
           else _unsplit_feature(config.get))
    if why:
        raise ShardLayoutError(
            f"The layout shards the variable {variable.path!r} of the MultiHeadAttention "
            f"{name!r}, but {why}. Drop the layer's entries from the layout.")
    for attribute, part in ATTENTION_PARTS.items():
        projection = getattr(layer, attribute)
        if variable is projection.kernel:
            return f"{part}/kernel"
        if projection.bias is not None and variable is projection.bias:
            return f"{part}/bias"
    raise ShardLayoutError(f"The variable {variable.path!r} of the MultiHeadAttention {name!r} "
                           "belongs to none of its query, key, value or output projections.")


def _attention_shard(layer, name, parent, roles, axis, num_shards):
    """The `LayerShard` of a MultiHeadAttention split by heads, from its projections' layouts."""
    wanted = {"query/kernel": (None, axis, None), "key/kernel": (None, axis, None),
              "value/kernel": (None, axis, None), "attention_output/kernel": (axis, None, None)}
    wrong = {role: roles.get(role) for role, axes in wanted.items() if roles.get(role) != axes}
    if wrong:
        raise ShardLayoutError(
            f"The layout splits the MultiHeadAttention {name!r} only in part ({wrong}; "
            "None: not sharded): attention is split by heads as a whole. Lay out the query, "
            f"key and value kernels (in, heads, head_dim) as (None, {axis!r}, None) and the "
            f"attention_output kernel (heads, head_dim, out) as ({axis!r}, None, None), or "
            "drop all its entries.")
    for part in ("query", "key", "value"):
        bias = roles.get(f"{part}/bias")
        if bias is not None and bias != (axis, None):
            raise ShardLayoutError(
                f"The layout of {name}/{part}/bias is {bias}; a {part} bias (heads, head_dim) is "
                f"split with its heads: ({axis!r}, None).")
    if roles.get("attention_output/bias") is not None:
        raise ShardLayoutError(
            f"The layout shards the output bias of the MultiHeadAttention {name!r}: it is "
            "added once, after summing the heads' partial outputs, so it is not split. Lay "
            "it out as (None,) or drop its entry.")
    heads = layer.num_heads
    if heads % num_shards:
        raise ShardLayoutError(
            f"The layout splits the {heads} heads of the MultiHeadAttention {name!r} over "
            f"{num_shards} devices, but {heads} does not divide by {num_shards}. Use a "
            "tensor_parallel that divides the number of heads, or drop its entries.")
    return LayerShard(layer=name, style=HEADS, kernel_path=layer.query_dense.kernel.path,
                      input_dim=int(layer.query_dense.kernel.shape[0]), units=heads,
                      parent=parent)


def _conv_role(layer, name, variable):
    """`"kernel"` or `"bias"` of a splittable convolution (depthwise too), else a
    `ShardLayoutError` saying why."""
    groups = getattr(layer, "groups", 1)  # a depthwise convolution has none
    grouped = groups != 1 and f"it is grouped (groups={groups}; not split yet)"
    return _kernel_or_bias_role(layer, type(layer).__name__, name, variable, grouped,
                                _lora(layer),
                                _unsplit_feature(lambda feature: getattr(layer, feature, None)))


def _conv_shard(layer, name, parent, roles, axis, num_shards):
    """The `LayerShard` of a convolution (or a transposed one) split by output or input
    channels, from its kernel's layout."""
    kind = type(layer).__name__
    shape = tuple(int(d) for d in layer.kernel.shape)
    path = layer.kernel.path
    filters_axis, input_axis = conv_kernel_axes(kind)
    by_filters, by_inputs = ([None] * len(shape), [None] * len(shape))
    by_filters[filters_axis] = by_inputs[input_axis] = axis
    by_filters, by_inputs = tuple(by_filters), tuple(by_inputs)
    order = "(..., filters, in)" if filters_axis == -2 else "(..., in, filters)"
    if "kernel" not in roles:
        raise ShardLayoutError(
            f"The layout shards the bias {layer.bias.path!r} of the {kind} layer {name!r} but "
            f"not its kernel {path!r}: a bias is split only with its filters. Lay out the "
            f"kernel as {by_filters} (output channels), or drop the bias entry.")
    axes = roles["kernel"]
    if axes not in (by_filters, by_inputs):
        raise ShardLayoutError(
            f"The layout of {path!r} ({kind} layer {name!r}, kernel {order} {shape}) is "
            f"{axes}; tfdist splits a convolution by its output channels, {by_filters}, or by "
            f"its input channels, {by_inputs}.")
    style, split_axis, what = ((FILTERS, filters_axis, "filters") if axes == by_filters else
                               (INPUT_CHANNELS, input_axis, "input channels"))
    bias = roles.get("bias")
    if bias is not None and style == FILTERS and bias != (axis,):
        raise ShardLayoutError(
            f"The layout of the bias {layer.bias.path!r} of the {kind} layer {name!r} is "
            f"{bias}; a bias is split with its filters: ({axis!r},).")
    if style == INPUT_CHANNELS:
        _refuse_split_bias_added_after_the_sum(layer, kind, name, bias)
    _check_conv_split_divides(shape[split_axis], what, f"{path!r} ({kind} layer {name!r})",
                              num_shards)
    return LayerShard(layer=name, style=style, kernel_path=path, input_dim=shape[input_axis],
                      units=shape[filters_axis], parent=parent, kernel_shape=shape,
                      split_axis=split_axis)


def _depthwise_shard(layer, name, parent, roles, axis, num_shards):
    """The `LayerShard` of a depthwise convolution split by channels, from its kernel's
    layout (`units` is its depth multiplier)."""
    kind = type(layer).__name__
    shape = tuple(int(d) for d in layer.kernel.shape)
    path = layer.kernel.path
    wanted = (None,) * (len(shape) - 2) + (axis, None)
    if roles.get("kernel") != wanted:
        raise ShardLayoutError(
            f"The layout of {path!r} ({kind} layer {name!r}, kernel (..., channels, "
            f"depth_multiplier) {shape}) is {roles.get('kernel')}; tfdist splits a depthwise "
            f"convolution by its channels only: {wanted} (its bias goes with them).")
    bias = roles.get("bias")
    if bias is not None and bias != (axis,):
        raise ShardLayoutError(
            f"The layout of the bias {layer.bias.path!r} of the {kind} layer {name!r} is "
            f"{bias}; a bias is split with its channels: ({axis!r},).")
    channels = shape[-2]
    _check_conv_split_divides(channels, "channels", f"{path!r} ({kind} layer {name!r})",
                              num_shards)
    return LayerShard(layer=name, style=CHANNELS, kernel_path=path, input_dim=channels,
                      units=shape[-1], parent=parent, kernel_shape=shape, split_axis=-2)


def _separable_role(layer, name, variable):
    """`"depthwise_kernel"`, `"pointwise_kernel"` or `"bias"` of a splittable separable
    convolution, else a `ShardLayoutError` saying why."""
    kind = type(layer).__name__
    _refuse_unsplit_features(kind, name, variable, _lora(layer),
                             _unsplit_feature(lambda feature: getattr(layer, feature, None)))
    for role in ("depthwise_kernel", "pointwise_kernel", "bias"):
        if getattr(layer, role, None) is not None and variable is getattr(layer, role):
            return role
    raise ShardLayoutError(f"The variable {variable.path!r} of the {kind} layer {name!r} is "
                           "none of its kernels or its bias.")


def _separable_shard(layer, name, parent, roles, axis, num_shards):
    """The `LayerShard` of a separable convolution split by input channels: both kernels laid
    out on their channel axis (-2), the bias not split."""
    kind = type(layer).__name__
    shape = tuple(int(d) for d in layer.depthwise_kernel.shape)
    wanted = {role: (None,) * (len(getattr(layer, role).shape) - 2) + (axis, None)
              for role in ("depthwise_kernel", "pointwise_kernel")}
    if any(roles.get(role) != axes for role, axes in wanted.items()):
        raise ShardLayoutError(
            f"The layout of the {kind} layer {name!r} is {roles}; tfdist splits a separable "
            f"convolution by its input channels, both kernels together: depthwise_kernel "
            f"{wanted['depthwise_kernel']} and pointwise_kernel {wanted['pointwise_kernel']} "
            "(the bias is added once, after the sum, and not split).")
    _refuse_split_bias_added_after_the_sum(layer, kind, name, roles.get("bias"))
    channels = shape[-2]
    _check_conv_split_divides(channels, "input channels",
                              f"{layer.depthwise_kernel.path!r} ({kind} layer {name!r})",
                              num_shards)
    return LayerShard(layer=name, style=SEPARABLE, kernel_path=layer.depthwise_kernel.path,
                      input_dim=channels, units=int(layer.filters), parent=parent,
                      kernel_shape=shape, split_axis=-2)


def _refuse_split_bias_added_after_the_sum(layer, kind, name, bias):
    """A `ShardLayoutError` if the layout shards the bias of a convolution split by input
    channels: that bias is added once, after the K partial outputs are summed."""
    if bias is not None and bias != (None,):
        raise ShardLayoutError(
            f"The layout shards the bias {layer.bias.path!r} of the {kind} layer {name!r}, "
            "split by input channels: it is added once, after the partial outputs are "
            "summed, so it is not split. Lay it out as (None,) or drop its entry.")


def _check_conv_split_divides(count, what, where, num_shards):
    """A `ShardLayoutError` unless the `count` split `what` (filters, channels) of `where`
    (the kernel and its layer) divide by `num_shards`."""
    if count % num_shards:
        raise ShardLayoutError(
            f"The layout splits the {count} {what} of {where} over {num_shards} devices, but "
            f"{count} does not divide by {num_shards}. Use a tensor_parallel that divides it, "
            "or drop the layer from the layout.")
