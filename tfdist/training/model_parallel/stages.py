"""Splitting a Keras model's layer stack into pipeline stages.

A model is split into K consecutive *stages* along the order in which its
layers run (the order of `model.operations`, a topological order of the
layer graph). Stage s runs on device s; every tensor that one stage produces
and a later one needs (the output of the last layer of a stage, a skip
connection, the Transformer's padding mask, which every block takes) is
handed to every stage that needs it.

The split rule, first that applies:

1. **Explicit boundaries** (`stage_boundaries=["block_2", ...]`): the names
   of the layers where stages 1, 2, ... begin, in layer order.
2. **Repeated blocks**: when the model holds a run of at least K consecutive
   *blocks*, layers of one class made of sub-layers and with equal parameter
   counts (the blocks of a Transformer: `tfdist.models.DecoderBlock`,
   keras-hub's decoder layers, ...), the blocks are
   divided as evenly as possible (earlier stages take the extra block when
   they do not divide evenly, since the last stage also runs the output
   projection and the loss); what comes before the blocks (embedding, padding
   mask) joins the first stage and what comes after (final norm, head,
   logits) the last.
3. **Parameter balance**: otherwise the layers holding weights are divided
   into K contiguous groups whose largest parameter count is as small as
   possible (an exact linear partition). Parameters, not layer counts:
   model parallelism exists to spread weights (and their gradients and
   optimizer slots, 2-4x the weights) over devices, and in a layer stack the
   parameter count also follows the compute far better than the number of
   layers does (a 10-unit head counts as much as a 4096-unit layer by layer
   count). Layers without weights join the stage of the nearest weighted
   layer before them (the first stage when there is none).

Every stage must hold weights. What cannot be split is refused by name: a
subclassed model without a layer graph, more stages than weighted layers (or
blocks), a layer whose calls fall into two stages, or a weight shared by two
stages.

Example:

    plan = plan_stages(model, 2)
    print(plan.describe())
"""

import dataclasses

import keras
import numpy as np
from keras import tree

from tfdist.seam import (direct_sublayers, has_layer_graph, nodes_by_depth, outputs_structure,
                         producing_layer_name, sequential_graph, standardized_inputs)

SPLIT_RULES = ("stage_boundaries", "repeated blocks", "parameter balance")
"""The split rules, in the order they are tried (see the module docstring)."""


class StageSplitError(ValueError):
    """A model cannot be split into the stages asked for; the message says why and the way out.

    Example:

        try:
            stages = split_model(model, plan)
        except StageSplitError as error:
            print(error)  # says why and the way out, e.g. fewer stages
    """


@dataclasses.dataclass(frozen=True)
class Stage:
    """One pipeline stage: consecutive layers of a model on one device.

    Args:
        index: the stage number, 0 for the stage that takes the model's inputs.
        layers: the names of its layers, in layer order (input layers are
            not counted).
        parameters: the number of weights (trainable and not) of its layers.
        weight_bytes: the bytes those weights take.
        device: the device it runs on, or None before placement.

    Example:

    >>> Stage(0, ("embedding", "block_0"), 211200, 844800, "/device:CPU:0").describe()
    'stage 0  /device:CPU:0  embedding .. block_0 (2 layers)  211,200 params'
    """

    index: int
    layers: tuple
    parameters: int
    weight_bytes: int
    device: str = None

    def describe(self):
        """One line: stage, device, first .. last layer, parameters.

        Example:

        >>> stage.describe()
        'stage 1  /device:CPU:1  block_1 .. logits (4 layers)  206,400 params'
        """
        names = (self.layers[0] if len(self.layers) == 1
                 else f"{self.layers[0]} .. {self.layers[-1]}")
        return (f"stage {self.index}  {self.device or '(not placed)'}  {names} "
                f"({len(self.layers)} layer{'s' if len(self.layers) != 1 else ''})  "
                f"{self.parameters:,} params")


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """How a model is split: its stages and the rule that chose them.

    Args:
        model_name: the model's name.
        rule: one of `SPLIT_RULES`.
        stages: the `Stage`s, in order.

    Example:

    >>> plan = plan_stages(model, 2)
    >>> plan.rule, [len(stage.layers) for stage in plan.stages]
    ('repeated blocks', [3, 4])
    """

    model_name: str
    rule: str
    stages: tuple

    @property
    def num_stages(self):
        """The number of stages, K."""
        return len(self.stages)

    @property
    def boundaries(self):
        """The first layer of every stage after the first (a `stage_boundaries` value)."""
        return [stage.layers[0] for stage in self.stages[1:]]

    def with_devices(self, devices):
        """Returns the plan with stage s on `devices[s]`.

        Example:

        >>> plan.with_devices(["/device:CPU:0", "/device:CPU:1"]).stages[1].device
        '/device:CPU:1'
        """
        if len(devices) != len(self.stages):
            raise ValueError(f"{len(self.stages)} stages need {len(self.stages)} devices, got "
                             f"{list(devices)}.")
        return dataclasses.replace(self, stages=tuple(
            dataclasses.replace(stage, device=device)
            for stage, device in zip(self.stages, devices)))

    def describe(self):
        """Several lines: the rule, then one line per stage (device, layers, parameters).

        Example:

        >>> print(plan.describe())
        2 stages of 'decoder_lm' (repeated blocks; boundaries: block_1)
          stage 0  /device:CPU:0  embedding .. block_0 (3 layers)  211,200 params (51%)
          stage 1  /device:CPU:1  block_1 .. logits (4 layers)  206,400 params (49%)
        """
        total = sum(stage.parameters for stage in self.stages) or 1
        lines = [f"{self.num_stages} stages of {self.model_name!r} ({self.rule}; boundaries: "
                 f"{', '.join(self.boundaries)})"]
        lines += [f"  {stage.describe()} ({100 * stage.parameters / total:.0f}%)"
                  for stage in self.stages]
        return "\n".join(lines)


def layer_graph(model):
    """Returns the functional graph (a `keras.Model` with `operations`) of `model`.

    A Functional model is its own graph; a built Sequential model has one
    inside. A subclassed model has no graph to split.

    Args:
        model: a `keras.Model`.

    Raises:
        StageSplitError: a subclassed model, or an unbuilt Sequential model.

    Example:

    >>> [op.name for op in layer_graph(model).operations][:2]
    ['token_ids', 'embedding']
    """
    if isinstance(model, keras.Sequential):
        graph = sequential_graph(model)
        if graph is None:
            raise StageSplitError(
                f"The Sequential model {model.name!r} is not built, so its layer graph is "
                "unknown. Start it with keras.Input(shape) (or call model.build(input_shape)) "
                "before splitting it into stages.")
        return graph
    if isinstance(model, keras.Model) and has_layer_graph(model):
        return model
    raise StageSplitError(
        f"The model {model.name!r} is a subclassed keras.Model ({type(model).__name__}) "
        "without a layer graph: its call() can run its layers in any order, so tfdist "
        "cannot cut it into stages. Build it as a Functional model (keras.Model(inputs, "
        "outputs)) or a keras.Sequential, or train it with model_parallel=1.")


def plan_stages(model, num_stages, stage_boundaries=None):
    """Chooses the K stages of `model` (see the module docstring for the rule).

    Args:
        model: a built Functional or Sequential `keras.Model`.
        num_stages: K, an integer >= 1.
        stage_boundaries: None, or the K-1 names of the layers that begin
            stages 1..K-1, in layer order.

    Returns:
        A `StagePlan` without devices (see `StagePlan.with_devices`).

    Raises:
        StageSplitError: the model cannot be split so (the message names the
            model, the layers and the way out).

    Example:

    >>> plan_stages(model, 2, stage_boundaries=["block_1"]).boundaries
    ['block_1']
    """
    graph = layer_graph(model)
    layers = [op for op in graph.operations if not _is_input_layer(op)]
    if stage_boundaries is not None:
        starts = _explicit_starts(model, layers, num_stages, stage_boundaries)
        rule = "stage_boundaries"
    else:
        _check_enough_weighted_layers(model, layers, num_stages)
        starts = _repeated_block_starts(layers, num_stages)
        rule = "repeated blocks"
        if starts is None:
            starts = _balanced_starts(layers, num_stages)
            rule = "parameter balance"
    stages = []
    for index, (start, end) in enumerate(zip(starts, starts[1:] + [len(layers)])):
        group = layers[start:end]
        weights = _unique_variables(op for op in group)
        stages.append(Stage(index=index, layers=tuple(op.name for op in group),
                            parameters=sum(_size(v) for v in weights),
                            weight_bytes=sum(_size(v) * _itemsize(v) for v in weights)))
    plan = StagePlan(model_name=model.name, rule=rule, stages=tuple(stages))
    empty = [stage for stage in plan.stages if stage.parameters == 0]
    if empty:
        stage = empty[0]
        raise StageSplitError(
            f"Stage {stage.index} of the model {model.name!r} would hold no weights (layers: "
            f"{', '.join(stage.layers)}): a stage without weights only adds a device hop. "
            "Move the boundaries (stage_boundaries=[...] names the first layer of each stage "
            "after the first) or use fewer stages.")
    return plan


def _is_input_layer(op):
    return isinstance(op, keras.layers.InputLayer)


def _size(variable):
    return int(np.prod(variable.shape, dtype=np.int64))


def _itemsize(variable):
    return np.dtype(keras.backend.standardize_dtype(variable.dtype)).itemsize


def _unique_variables(ops):
    seen, result = set(), []
    for op in ops:
        for variable in getattr(op, "weights", ()):  # Keras ops (x + y) hold none
            if id(variable) not in seen:
                seen.add(id(variable))
                result.append(variable)
    return result


def _parameters(op):
    return sum(_size(v) for v in getattr(op, "weights", ()))


def _check_enough_weighted_layers(model, layers, num_stages):
    weighted = [op.name for op in layers if _parameters(op)]
    if num_stages > len(weighted):
        raise StageSplitError(
            f"The model {model.name!r} has {len(weighted)} layer(s) with weights "
            f"({', '.join(weighted) or 'none'}), too few for {num_stages} stages: every stage "
            f"must hold weights. Use model_parallel <= {max(len(weighted), 1)}.")


def _explicit_starts(model, layers, num_stages, stage_boundaries):
    if isinstance(stage_boundaries, str) or not isinstance(stage_boundaries, (list, tuple)):
        raise StageSplitError(
            f"stage_boundaries must be a list of layer names (where stages 1, 2, ... begin), "
            f"got {stage_boundaries!r}; e.g. stage_boundaries=['block_2'].")
    if len(stage_boundaries) != num_stages - 1:
        raise StageSplitError(
            f"stage_boundaries={list(stage_boundaries)} names {len(stage_boundaries)} "
            f"boundaries, but model_parallel={num_stages} needs {num_stages - 1} (the first "
            "layer of every stage after the first).")
    index = {op.name: i for i, op in enumerate(layers)}
    starts = [0]
    for name in stage_boundaries:
        if name not in index:
            raise StageSplitError(
                f"stage_boundaries names {name!r}, which is not a layer of the model "
                f"{model.name!r}. Its layers, in order: {', '.join(index)}.")
        if index[name] <= starts[-1]:
            raise StageSplitError(
                f"stage_boundaries={list(stage_boundaries)} is not in layer order (or starts "
                f"an empty stage) at {name!r}. Name each stage's first layer in the order "
                f"the layers run: {', '.join(index)}.")
        starts.append(index[name])
    return starts


def _repeated_block_starts(layers, num_stages):
    """Stage starts that divide the longest run of identical blocks, or None."""
    best = None
    i = 0
    while i < len(layers):
        j = i
        signature = _block_signature(layers[i])
        while j + 1 < len(layers) and _block_signature(layers[j + 1]) == signature:
            j += 1
        length = j - i + 1
        if signature[1] and length >= max(num_stages, 2) and (best is None or length > best[1]):
            best = (i, length)
        i = j + 1
    if best is None or num_stages == 1:
        return None if best is None else [0]
    first, count = best
    sizes = [count // num_stages + (1 if s < count % num_stages else 0)
             for s in range(num_stages)]
    starts, position = [0], first
    for size in sizes[:-1]:
        position += size
        starts.append(position)
    return starts


def _block_signature(layer):
    """`(class, parameters)` of a block; parameters 0 for a layer that is not one."""
    return type(layer), _parameters(layer) if _is_block(layer) else 0


def _is_block(layer):
    """Whether `layer` is made of sub-layers (a block), not a single Dense, norm or conv."""
    return isinstance(layer, keras.layers.Layer) and bool(
        direct_sublayers(layer))


def _balanced_starts(layers, num_stages):
    """Stage starts minimising the largest stage's parameter count."""
    weighted = [i for i, op in enumerate(layers) if _parameters(op)]
    counts = [_parameters(layers[i]) for i in weighted]
    n = len(counts)
    prefix = np.concatenate([[0], np.cumsum(counts)])
    # cost[k][j]: best largest-group sum splitting the first j units into k groups.
    inf = float("inf")
    cost = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    cost[0][0] = 0
    for k in range(1, num_stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                value = max(cost[k - 1][i], prefix[j] - prefix[i])
                if value < cost[k][j]:
                    cost[k][j], cut[k][j] = value, i
    bounds, j = [], n
    for k in range(num_stages, 0, -1):
        bounds.append(cut[k][j])
        j = cut[k][j]
    unit_starts = sorted(bounds)[1:]  # the first group starts at unit 0
    return [0] + [weighted[u] for u in unit_starts]


@dataclasses.dataclass
class StageGraph:
    """One stage as something to run: a `keras.Model` over the original layers.

    Attributes:
        index: the stage number.
        device: its device.
        model: a Functional `keras.Model` from the stage's input tensors to
            its output tensors, sharing the original model's layers (and so
            its variables).
        input_keys: keys (see `split_model`) of the tensors it takes, in
            `model.inputs` order.
        output_keys: keys of the tensors it gives to later stages (or that
            are model outputs), in `model.outputs` order.
        loss_keys: for the last stage, the keys of the model outputs that
            earlier stages produced (the loss consumes them here); else empty.
        variables: the Keras variables of its layers (trainable and not).
        trainable_variables: the trainable ones.

    Example:

    >>> [stage.index for stage in split_model(model, plan)]  # a plan of 2 stages
    [0, 1]
    """

    index: int
    device: str
    model: object
    input_keys: list
    output_keys: list
    loss_keys: list
    variables: list
    trainable_variables: list


def split_model(model, plan):
    """Builds the runnable stages of `plan` from the model's own symbolic tensors.

    Each stage becomes a Functional `keras.Model` whose inputs are the
    intermediate tensors it needs (Keras 3 accepts intermediate tensors as
    inputs) and whose outputs are the tensors later stages (or the loss)
    need. A tensor is identified by a key, `id()` of the model's
    `KerasTensor`; `model_input_keys(model)` gives the keys of the model's
    inputs and `model_output_keys(model)` those of its outputs.

    Args:
        model: the Functional or Sequential model the plan was made for.
        plan: a `StagePlan` with devices.

    Returns:
        A list of `StageGraph`, one per stage.

    Raises:
        StageSplitError: a layer is called in two stages, a tensor would flow
            from a later stage back to an earlier one, or a weight belongs to
            layers of two stages.

    Example:

    >>> stages = split_model(model, plan_stages(model, 2).with_devices(devices))
    >>> [len(stage.input_keys) for stage in stages]
    [1, 2]
    """
    graph = layer_graph(model)
    stage_of = {name: stage.index for stage in plan.stages for name in stage.layers}
    nodes = [node for depth in sorted(nodes_by_depth(graph), reverse=True)
             for node in nodes_by_depth(graph)[depth]
             if node.operation is not None and not node.is_input]
    producer = {}  # tensor key -> stage (-1: a model input)
    for tensor in graph.inputs:
        producer[id(tensor)] = -1
    node_stage = {}
    for node in nodes:
        stage = stage_of[node.operation.name]
        for tensor in tree.flatten(node.outputs):
            producer[id(tensor)] = stage
        node_stage[id(node)] = stage
    consumers = {}  # tensor key -> stages that read it
    for node in nodes:
        stage = node_stage[id(node)]
        for tensor in tree.flatten(node.input_tensors):
            source = producer.get(id(tensor), -1)
            if source > stage:
                raise StageSplitError(
                    f"The layer {node.operation.name!r} (stage {stage}) of the model "
                    f"{model.name!r} reads a tensor made in stage {source} by "
                    f"{producing_layer_name(tensor)!r}: a layer called twice (shared "
                    "weights) or a graph whose order does not follow the stages. Put both "
                    "calls in one stage with stage_boundaries=[...], or use fewer stages.")
            consumers.setdefault(id(tensor), set()).add(stage)
    output_keys = model_output_keys(model)
    last = plan.num_stages - 1
    stages = []
    for stage in plan.stages:
        own = [node for node in nodes if node_stage[id(node)] == stage.index]
        inputs, outputs, seen_in, seen_out = [], [], set(), set()
        for node in own:
            for tensor in tree.flatten(node.input_tensors):
                key = id(tensor)
                if producer.get(key, -1) < stage.index and key not in seen_in:
                    seen_in.add(key)
                    inputs.append(tensor)
            for tensor in tree.flatten(node.outputs):
                key = id(tensor)
                later = any(s > stage.index for s in consumers.get(key, ()))
                if (later or key in output_keys) and key not in seen_out:
                    seen_out.add(key)
                    outputs.append(tensor)
        loss_keys = ([key for key in output_keys if producer.get(key, -1) < last]
                     if stage.index == last else [])
        stage_model = keras.Model(inputs, outputs, name=f"{model.name}_stage_{stage.index}")
        layers = [node.operation for node in own]
        variables = _unique_variables(layers)
        stages.append(StageGraph(
            index=stage.index, device=stage.device, model=stage_model,
            input_keys=[id(t) for t in inputs], output_keys=[id(t) for t in outputs],
            loss_keys=loss_keys, variables=variables,
            trainable_variables=[v for v in variables if v.trainable]))
    _check_no_shared_weights(model, stages)
    return stages


def model_input_keys(model):
    """The keys (see `split_model`) of the model's inputs, in the model's flat input order.

    Example:

    >>> model_input_keys(model) == [id(t) for t in model.inputs]
    True
    """
    return [id(t) for t in layer_graph(model).inputs]


def model_output_keys(model):
    """The keys (see `split_model`) of the model's outputs, in flat output order.

    Example:

    >>> len(model_output_keys(model))
    1
    """
    return [id(t) for t in layer_graph(model).outputs]


def pack_outputs(model, flat_outputs):
    """Packs flat output tensors like the model's `call` returns them.

    Example:

    >>> y_pred = pack_outputs(model, [logits])  # a single output: the tensor itself
    """
    structure = outputs_structure(layer_graph(model))
    packed = tree.pack_sequence_as(structure, list(flat_outputs))
    if isinstance(packed, (list, tuple)) and len(packed) == 1:
        return packed[0]
    return packed


def flat_inputs(model, x):
    """The model's inputs `x` as a flat list in `model.inputs` order (as Keras standardises them).

    Example:

    >>> flat_inputs(model, {"token_ids": ids})
    [<tf.Tensor ...>]
    """
    return standardized_inputs(layer_graph(model), x)


def _check_no_shared_weights(model, stages):
    owner = {}
    for stage in stages:
        for variable in stage.variables:
            other = owner.setdefault(id(variable), (stage.index, variable))[0]
            if other != stage.index:
                raise StageSplitError(
                    f"The weight {variable.path!r} of the model {model.name!r} is used by "
                    f"layers of stage {other} and of stage {stage.index} (tied weights). A "
                    "weight lives on one device: put those layers in one stage with "
                    "stage_boundaries=[...], untie the weights, or use fewer stages.")
