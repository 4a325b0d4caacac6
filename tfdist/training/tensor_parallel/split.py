"""Building the split model from the user's model, and the Trainer's tensor-parallel checks.

`split_model` clones a Functional or Sequential model
(`keras.models.clone_model`) with every layer the plan names replaced by a
`ShardedDense` whose shards sit on the plan's devices, and copies the
original weights in (each shard its slice), so the split model starts from
the very same weights. A Dense held as an attribute of a top-level layer (a
Transformer block's `ffn_in`) is replaced in the clone of that layer before
it is built (the clone keeps an unbuilt, weightless Dense in its layer list,
which saving and checkpoints skip). Replicated layers are plain clones; their variables
and their computation are on the first device (TensorFlow's default device,
where ops without a device run). `gather_weights` copies the trained weights
back into the original model (each split kernel gathered from its shards),
`scatter_weights` the other way.

The original model keeps its full weights (it is the source of the split);
for a model too big for one accelerator, build it on the host
(`with tf.device("/cpu:0"):`), so only the split model's shards occupy the
accelerators.

Example:

    plan = plan_shards(model, layout_map, 2).with_devices(shard_devices(2))
    split = split_model(model, plan)
    ...
    gather_weights(split, model)
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.distribute.introspection import num_workers
from tfdist.seam import direct_sublayers, model_compile_config
from tfdist.training.tensor_parallel.depthwise import (CHANNELS, SEPARABLE, ShardedDepthwiseConv,
                                                       ShardedSeparableConv)
from tfdist.training.tensor_parallel.einsum import ShardedEinsumDense
from tfdist.training.tensor_parallel.embedding import VocabParallelEmbedding
from tfdist.training.tensor_parallel.conv import FILTERS, INPUT_CHANNELS, ShardedConv
from tfdist.training.tensor_parallel.layers import (COLUMN, HEADS, VOCABULARY, ShardedDense,
                                                    ShardedMultiHeadAttention)
from tfdist.training.tensor_parallel.vocab_loss import SliceKeepingLinear, vocab_parallel_loss_of
from tfdist.runtime.argtypes import check_int_at_least


SHARDED_LAYERS = (ShardedDense, ShardedMultiHeadAttention, ShardedConv, ShardedDepthwiseConv,
                  ShardedSeparableConv, VocabParallelEmbedding, ShardedEinsumDense)
"""The layer classes a split model's split layers have."""


class ShardPlacementError(RuntimeError):
    """This worker has fewer devices than the tensor-parallel degree asks for.

    Example:

        try:
            devices = shard_devices(4)
        except ShardPlacementError as error:
            print(error)
    """


def shard_devices(num_shards):
    """The K devices of this worker that the K shards live on: GPU i (else CPU i).

    Without GPUs the CPU must have been split into K logical devices before
    TensorFlow started (`tfdist.distribute.devices.split_cpu_into_logical_devices(K)`).

    Raises:
        ShardPlacementError: fewer than K devices (the message says how to get them).

    Example:

    >>> shard_devices(2)
    ['/device:CPU:0', '/device:CPU:1']
    """
    device_type = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    found = tf.config.list_logical_devices(device_type)
    if len(found) < num_shards:
        way_out = (f"make {num_shards} GPUs visible (CUDA_VISIBLE_DEVICES)"
                   if device_type == "GPU" else
                   f"split the CPU into {num_shards} logical devices before TensorFlow starts: "
                   f"tfdist.distribute.devices.split_cpu_into_logical_devices({num_shards}) at "
                   "the top of the program")
        raise ShardPlacementError(
            f"tensor_parallel={num_shards} needs {num_shards} {device_type} devices on this "
            f"worker, one per shard, but it has {len(found)}: {[d.name for d in found]}. Use "
            f"tensor_parallel <= {max(len(found), 1)}, or {way_out}.")
    return [f"/device:{device_type}:{index}" for index in range(num_shards)]


def split_model(model, plan):
    """The model with the plan's layers split over the plan's devices, same weights.

    Args:
        model: the built Functional or Sequential `keras.Model` the plan was made for.
        plan: a `ShardPlan` with devices.

    Returns:
        A new, uncompiled `keras.Model` (same layer names; split layers are
        `ShardedDense`).

    Example:

    >>> split = split_model(model, plan)
    >>> split.get_layer("up").kernels[1].value.device
    '/job:localhost/replica:0/task:0/device:CPU:1'
    """
    if plan.devices is None:
        raise ValueError("The plan has no devices yet: plan.with_devices(shard_devices(K)).")

    inner = {}  # parent layer name -> its split Dense layers
    for shard in plan.layers:
        if shard.parent is not None:
            inner.setdefault(shard.parent, []).append(shard)

    cast_output = _linear_output_after_vocabulary_split(model, plan)

    def clone(layer):
        shard = plan.shard_of(layer.name)
        if shard is not None:
            return sharded_layer(layer, shard.style, plan.devices, shard.einsum_letter)
        if layer.name == cast_output:
            return SliceKeepingLinear.from_activation(layer)
        copy = layer.__class__.from_config(layer.get_config())
        for shard in inner.get(layer.name, ()):
            _replace_inner_dense(layer, copy, shard, plan.devices)
        return copy

    with tf.device(plan.devices[0]):
        split = keras.models.clone_model(model, clone_function=clone)
    scatter_weights(model, split)
    return split


def _output_layers(model):
    """`(the layer computing the model's output, the linear Activation after it or None)`:
    the last layer, looking through one trailing linear `Activation` (a float32 `logits`
    layer); `(None, None)` for a model without layers."""
    layers = list(model.layers)
    if len(layers) > 1 and _is_linear_activation(layers[-1]):
        return layers[-2], layers[-1]
    return (layers[-1] if layers else None), None


def _linear_output_after_vocabulary_split(model, plan):
    """The name of the model's last layer when it is a linear `Activation` right after a
    layer the plan splits by columns, else None."""
    head, activation = _output_layers(model)
    shard = plan.shard_of(head.name) if activation is not None else None
    return activation.name if shard is not None and shard.style == COLUMN else None


def _is_linear_activation(layer):
    return (isinstance(layer, keras.layers.Activation)
            and keras.activations.serialize(layer.activation) in ("linear", {"linear"}))


def sharded_layer(layer, style, devices, letter=None):
    """The split of `layer` (a Dense, a MultiHeadAttention split by heads, a convolution split
    by filters or input channels, a depthwise one by channels) over `devices`.

    Example:

    >>> sharded_layer(model.get_layer("up"), "column", devices)
    <ShardedDense name=up, built=False>
    """
    if style == HEADS:
        return ShardedMultiHeadAttention.from_attention(layer, devices)
    if style in (FILTERS, INPUT_CHANNELS):
        return ShardedConv.from_conv(layer, devices, style)
    if style == CHANNELS:
        return ShardedDepthwiseConv.from_depthwise(layer, devices)
    if style == SEPARABLE:
        return ShardedSeparableConv.from_separable(layer, devices)
    if style == VOCABULARY:
        return VocabParallelEmbedding.from_embedding(layer, devices)
    if letter is not None:
        return ShardedEinsumDense.from_einsum(layer, letter, devices)
    return ShardedDense.from_dense(layer, style, devices)


def _replace_inner_dense(original, copy, shard, devices):
    """Puts a `ShardedDense` where the clone `copy` of `original` holds the Dense `shard` names
    (before the clone is built, so the Dense it replaces never gets weights)."""
    dense_name = shard.layer.split("/", 1)[1]
    attribute = next(name for name, value in vars(original).items()
                     if isinstance(value, keras.layers.Layer) and value.name == dense_name)
    layer = getattr(original, attribute)
    delattr(copy, attribute)
    setattr(copy, attribute, sharded_layer(layer, shard.style, devices, shard.einsum_letter))


def scatter_weights(model, split):
    """Copies `model`'s weights into its split copy (each split kernel cut into its shards):
    the reverse of `gather_weights`.

    Example:

    >>> model.load_weights("model.weights.h5")
    >>> scatter_weights(model, trainer.model)
    """
    for original, copy in _dense_pairs(model, split):
        if isinstance(copy, SHARDED_LAYERS):
            copy.load_from(original)
        else:
            copy.set_weights(original.get_weights())


def gather_weights(split, model):
    """Copies the split model's weights into `model` (split kernels gathered from their shards).

    Example:

    >>> trainer.fit(x, y)            # trains trainer.model, the split model
    >>> gather_weights(trainer.model, model)
    """
    for original, copy in _dense_pairs(model, split):
        if isinstance(copy, SHARDED_LAYERS):
            copy.gather_into(original)
        else:
            original.set_weights(copy.get_weights())


def _dense_pairs(model, split):
    """`(original, copy)` pairs covering every weight: layers of the two models with the same
    name, and inside a layer holding split Dense layers, each of its sub-layers."""
    originals = {layer.name: layer for layer in model.layers}
    pairs = []
    for copy in split.layers:
        if not copy.weights:
            continue
        original = originals[copy.name]
        sharded_inside = [sub for sub in direct_sublayers(copy)
                          if isinstance(sub, SHARDED_LAYERS)]
        if isinstance(copy, SHARDED_LAYERS) or not sharded_inside:
            pairs.append((original, copy))
            continue
        subs = {sub.name: sub for sub in direct_sublayers(original) if sub.weights}
        pairs += [(subs[sub.name], sub) for sub in direct_sublayers(copy) if sub.weights]
        own = _OwnWeights(original), _OwnWeights(copy)
        if own[0].weights or own[1].weights:
            pairs.append(own)  # such as a token-and-position embedding's position table
    return pairs


class _OwnWeights:
    """The weights a layer holds itself, not through its sub-layers, as a pair member for
    `_dense_pairs` (`get_weights` / `set_weights` in the layer's order)."""

    def __init__(self, layer):
        held = {id(v) for sub in direct_sublayers(layer) for v in sub.weights}
        self.weights = [v for v in layer.weights if id(v) not in held]

    def get_weights(self):
        return [np.asarray(v) for v in self.weights]

    def set_weights(self, values):
        if len(values) != len(self.weights):
            raise ValueError(f"{len(values)} values for {len(self.weights)} weights.")
        for variable, value in zip(self.weights, values, strict=True):
            variable.assign(value)


def compile_like(split, model):
    """Compiles `split` with the arguments of `model`'s last `compile()`.

    The optimizer object is shared, so it must not be built yet: its slot
    variables are created later, next to each shard.

    Example:

    >>> compile_like(split, model)
    >>> split.optimizer is model.optimizer
    True
    """
    config = model_compile_config(model)
    if config is None:
        raise ValueError(f"The model {model.name!r} is not compiled; compile it (or give the "
                         "Trainer optimizer= and loss=) before splitting it.")
    arguments = dict(config.config)
    if output_split_by_vocabulary(split):
        # The loss reads the logits shard by shard instead of gathering them.
        arguments["loss"] = vocab_parallel_loss_of(arguments.get("loss")) or arguments.get("loss")
    split.compile(**arguments)


def output_split_by_vocabulary(split):
    """Whether the split model's output is a column-parallel Dense's (the logits split by
    vocabulary), directly or through a linear `Activation` (a float32 `logits` layer).

    Example:

    >>> output_split_by_vocabulary(split_model(lm, plan_with_lm_head))
    True
    """
    if len(split.outputs) != 1:
        return False
    head, _ = _output_layers(split)
    return isinstance(head, ShardedDense) and head.style == COLUMN


def check_one_replica_per_worker(strategy, tensor_parallel):
    """Refuses a strategy that is not the default one or `MultiWorkerMirroredStrategy`
    with one device per worker, saying why and the way out.

    The shards are plain variables on K devices of this worker; data
    parallelism combines copies of the split model across workers only
    (`tfdist.training.tensor_parallel.steps`).

    Example:

    >>> check_one_replica_per_worker(tf.distribute.get_strategy(), 2)
    """
    k = tensor_parallel
    name = type(strategy).__name__
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ValueError(
            f"tensor_parallel={k} is not supported under ParameterServerStrategy (variables "
            "on parameter servers, asynchronous steps). Use the default strategy on one "
            "worker, or MultiWorkerMirroredStrategy with one device per worker.")
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    if multi_worker:
        if strategy.num_replicas_in_sync == num_workers(strategy):
            return
    elif strategy.num_replicas_in_sync == 1 and not isinstance(
            strategy, (tf.distribute.MirroredStrategy, tf.distribute.OneDeviceStrategy)):
        return  # the default strategy
    raise ValueError(
        f"tensor_parallel={k} needs the default strategy (one worker) or "
        f"MultiWorkerMirroredStrategy with one device per worker (data parallelism across "
        f"workers, each holding one split copy), got {name} with "
        f"{strategy.num_replicas_in_sync} replica(s). A {name} runs each replica under one "
        "device and mirrors every variable over exactly its replica devices, so no replica "
        "can hold shards on other devices. Create the model outside any strategy scope and "
        "pass no strategy, or use MultiWorkerMirroredStrategy with one device per worker "
        "(create_strategy('multi_worker_mirrored', devices=1)).")


def check_tensor_parallel_arguments(tensor_parallel, layout_map):
    """Validates `tensor_parallel` and `layout_map`; returns `tensor_parallel` as an int.

    Raises:
        ValueError: not an integer >= 1, K > 1 without a layout map, or a
            layout map with K = 1.

    Example:

    >>> check_tensor_parallel_arguments(1, None)
    1
    """
    check_int_at_least("tensor_parallel", tensor_parallel, 1)
    if tensor_parallel > 1 and layout_map is None:
        raise ValueError(
            f"tensor_parallel={tensor_parallel} needs layout_map=, a keras.distribution."
            "LayoutMap saying which kernels to split (e.g. layout_map['up/kernel'] = (None, "
            "'model'); layout_map['down/kernel'] = ('model', None)).")
    if tensor_parallel == 1 and layout_map is not None:
        raise ValueError(
            "layout_map= splits layers over devices only with tensor_parallel=K > 1 (K, the "
            "size of the layout's model axis); got tensor_parallel=1.")
    return int(tensor_parallel)


def check_tensor_parallel_settings(model, strategy, *, tensor_parallel, model_parallel,
                                   jit_compile, grad_accum_steps, hooks=None):
    """Refuses, by name and with the way out, what tensor parallelism cannot do yet.

    Args:
        model: the model to split.
        strategy: the trainer's strategy.
        tensor_parallel: K > 1.
        model_parallel, jit_compile, grad_accum_steps: the trainer's settings
            (any `grad_accum_steps`: the accumulation buffers are made for the
            split copy's variables, one per shard).
        hooks: `tfdist.training.model_hooks.own_hooks(model)` (None: none).

    Raises:
        ValueError: the model's own train/test/predict step or compute_loss
            (the split copy is a plain Functional model without them),
            model_parallel > 1, a strategy other than the default one or
            MultiWorkerMirroredStrategy with one device per worker, XLA,
            an unbuilt model, or an optimizer that is already built. Mixed
            precision (`mixed_bfloat16`, `mixed_float16` with loss scaling)
            is allowed: the split layers keep the model's dtype policy
            (float32 variables, matmuls in the compute dtype, partial
            products summed in float32, `sum_partial_products`).

    Example:

    >>> check_tensor_parallel_settings(model, tf.distribute.get_strategy(), tensor_parallel=2,
    ...                                model_parallel=1, jit_compile=False, grad_accum_steps=1)
    """
    k = tensor_parallel
    if hooks:
        names = ", ".join(f"{cls.__name__}.{hook}" for hook, cls in hooks.items())
        raise ValueError(
            f"tensor_parallel={k} trains a Functional copy of the model with its layers "
            f"split, which does not have the model's own {names}. Remove the override "
            "(compile the loss instead), or train with tensor_parallel=1.")
    if model_parallel > 1:
        raise ValueError(
            f"tensor_parallel={k} with model_parallel={model_parallel} (stages that are "
            "themselves split) is not supported yet. Use one of them.")
    check_one_replica_per_worker(strategy, k)
    if jit_compile:
        raise ValueError(
            f"jit_compile=True is not supported with tensor_parallel={k} yet: XLA compiles "
            "one function for one device, while each shard runs on its own device. Pass "
            "jit_compile=False.")
    if not model.built:
        raise ValueError(
            f"The model {model.name!r} is not built; tensor_parallel={k} splits a built "
            "Functional or Sequential model. Start it with keras.Input(shape).")
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        raise ValueError(
            f"The optimizer {optimizer.name!r} is already built (its slot variables belong "
            f"to the unsplit weights). Give the tensor_parallel={k} Trainer a fresh optimizer "
            "(model.compile(optimizer=...) or Trainer(optimizer=...)); to keep a saved "
            "optimizer state, call trainer.model.load_weights(path) after that.")
