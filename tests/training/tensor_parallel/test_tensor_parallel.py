"""Tensor parallelism (`Trainer(tensor_parallel=K, layout_map=...)`) on the session's 2 logical CPUs.

A Functional model whose Dense layers a hand-written Keras `LayoutMap`
splits by channels must train exactly like one device (plain Trainer,
default strategy, SGD, float32, same initial weights): losses, gradients of
every shard, global-norm clipping, final weights. Each device must hold 1/K
of the split kernels (and their optimizer slots); splits tfdist cannot do
are refused naming the layer.
"""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.models import decoder_lm_layout_map
from tfdist.training import Trainer
from tfdist.training.model_parallel.placement import variable_bytes_by_device
from tfdist.training.tensor_parallel.layers import ShardedDense
from tfdist.training.tensor_parallel.layout import ShardLayoutError, plan_shards
from tfdist.training.tensor_parallel.split import gather_weights, shard_devices, split_model
from helpers.tensor_parallel_mlp import BATCH, CLASSES, FEATURES, ROWS, arrays, layout, mlp
from helpers.workers import model_parallel_common as common

RTOL, ATOL = 1e-5, 1e-5


def fit(tensor_parallel, epochs=2, **kwargs):
    model = mlp(kwargs.pop("optimizer", None))
    extra = dict(tensor_parallel=2, layout_map=layout()) if tensor_parallel else {}
    trainer = Trainer(model, **extra, **kwargs)
    x, y = arrays()
    history = trainer.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model, history.history, trainer


def device_of(variable):
    return variable.value.device[-5:]


def assert_same(ours, reference):
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose(ours[1][name], reference[1][name], rtol=RTOL, err_msg=name)
    for a, b in zip(ours[0].get_weights(), reference[0].get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_split_mlp_trains_like_one_device():
    one = fit(False)
    two = fit(True)
    assert [(s.layer, s.style) for s in two[2].shard_plan.layers] == [
        ("up", "column"), ("down", "row"), ("wide", "column"), ("narrow", "row")]
    assert int(two[2].optimizer.iterations.numpy()) == 2 * ROWS // BATCH
    assert isinstance(two[2].model.get_layer("up"), ShardedDense)
    # The weights were gathered back into the user's model; they moved.
    assert not np.allclose(two[0].get_layer("up").kernel, mlp().get_layer("up").kernel)
    assert_same(two, one)
    x, y = arrays(seed=1)
    np.testing.assert_allclose(two[2].evaluate(x, y, verbose=0), one[2].evaluate(x, y, verbose=0),
                               rtol=RTOL)
    np.testing.assert_allclose(two[2].predict(x, verbose=0), one[2].predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


def test_decoder_lm_with_its_shipped_layout_trains_like_one_device():
    tokens, targets = common.token_arrays(n=24)
    data = common.dataset((tokens, targets), 8)
    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    one_model = common.transformer(tf.distribute.get_strategy())
    one = one_model, Trainer(one_model).fit(data, epochs=1, verbose=0).history
    two_model = common.transformer(tf.distribute.get_strategy())
    trainer = Trainer(two_model, tensor_parallel=2, layout_map=decoder_lm_layout_map(mesh))
    two = two_model, trainer.fit(data, epochs=1, verbose=0).history
    assert [(s.layer, s.style) for s in trainer.shard_plan.layers] == [
        ("embedding/token_embedding", "vocabulary")] + [
        (f"block_{i}/{name}", style) for i in range(2)
        for name, style in (("attention", "heads"), ("ffn_in", "column"), ("ffn_out", "row"))
    ] + [("lm_head", "column")]  # the embedding and the output projection by vocabulary
    assert_same(two, one)
    attention = trainer.model.get_layer("block_1").attention
    assert [device_of(shard.query_dense.kernel) for shard in attention.heads] == ["CPU:0", "CPU:1"]
    assert [shard.query_dense.kernel.shape for shard in attention.heads] == [(32, 1, 16)] * 2
    # The output bias is added once: shard 1's stays zero and untrained.
    assert not attention.heads[1].output_dense.bias.trainable
    assert not np.any(attention.heads[1].output_dense.bias.numpy())


def test_each_shard_gradient_is_its_slice_of_the_one_device_gradient_and_norms_agree():
    model = mlp()
    plan = plan_shards(model, layout(), 2).with_devices(shard_devices(2))
    split = split_model(model, plan)
    x, y = arrays()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def gradients(net):
        with tf.GradientTape() as tape:
            value = loss(y, net(x))
        return tape.gradient(value, net.trainable_variables)

    full = dict(zip([v.path for v in model.trainable_variables], gradients(model), strict=True))
    shards = gradients(split)
    by_path = dict(zip([v.path for v in split.trainable_variables], shards, strict=True))
    for shard in plan.layers:
        kernel = full[f"{shard.layer}/kernel"].numpy()
        bias = full[f"{shard.layer}/bias"].numpy()
        for i in range(2):
            if shard.style == "column":
                width = shard.units // 2
                expected = kernel[:, i * width:(i + 1) * width]
                np.testing.assert_allclose(by_path[f"{shard.layer}/bias_shard_{i}"],
                                           bias[i * width:(i + 1) * width], rtol=RTOL, atol=1e-7)
            else:
                rows = shard.input_dim // 2
                expected = kernel[i * rows:(i + 1) * rows]
            np.testing.assert_allclose(by_path[f"{shard.layer}/kernel_shard_{i}"], expected,
                                       rtol=RTOL, atol=1e-7)
        if shard.style == "row":
            np.testing.assert_allclose(by_path[f"{shard.layer}/bias"], bias, rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(by_path["head/kernel"], full["head/kernel"], rtol=RTOL, atol=1e-7)
    # The global norm over the shard variables is the one-device global norm.
    np.testing.assert_allclose(tf.linalg.global_norm(shards),
                               tf.linalg.global_norm(list(full.values())), rtol=1e-6)


def test_each_attention_shard_gradient_is_its_heads_slice_of_the_one_device_gradient():
    model = common.transformer(tf.distribute.get_strategy(), num_layers=1)
    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    split = split_model(model, plan_shards(model, decoder_lm_layout_map(mesh), 2)
                        .with_devices(shard_devices(2)))
    tokens, targets = common.token_arrays(n=8)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def gradients(net):
        with tf.GradientTape() as tape:
            value = loss(targets, net(tokens))
        return dict(zip([v.path for v in net.trainable_variables],
                        tape.gradient(value, net.trainable_variables), strict=True))

    full, shards = gradients(model), gradients(split)
    heads = model.get_layer("block_0").attention.num_heads // 2
    for part, axis in (("query", 1), ("key", 1), ("value", 1), ("attention_output", 0)):
        kernel = full[f"block_0/attention/{part}/kernel"].numpy()
        for i in range(2):
            expected = np.take(kernel, range(i * heads, (i + 1) * heads), axis=axis)
            np.testing.assert_allclose(shards[f"block_0/attention/heads_{i}/{part}/kernel"],
                                       expected, rtol=1e-4, atol=1e-6, err_msg=(part, i))
    np.testing.assert_allclose(shards["block_0/attention/heads_0/attention_output/bias"],
                               full["block_0/attention/attention_output/bias"], rtol=1e-4,
                               atol=1e-6)
    assert "block_0/attention/heads_1/attention_output/bias" not in shards  # not trained


def test_shards_compute_on_their_devices_and_a_megatron_pair_hands_its_shards_over():
    model = mlp()
    split = split_model(model, plan_shards(model, layout(), 2).with_devices(shard_devices(2)))
    graph = tf.function(split).get_concrete_function(
        tf.TensorSpec((None, FEATURES), tf.float32)).graph
    ops = [(op.name.split("/")[1].rsplit("_", 1)[0], op.type, op.device) for op in graph.get_operations()
           if op.name.count("/") >= 2]
    for layer in ("up", "down", "wide", "narrow"):
        devices = sorted(device[-5:] for name, kind, device in ops
                         if name == layer and kind == "MatMul")
        assert devices == ["CPU:0", "CPU:1"], (layer, devices)
    # up -> down: down multiplies up's shards (no slicing); wide -> tanh -> narrow: slices.
    assert not [kind for name, kind, _ in ops if name == "down" and kind == "StridedSlice"]
    assert [kind for name, kind, _ in ops if name == "narrow" and kind == "StridedSlice"]
    # The row layers sum their partial products once, on the first device.
    sums = [(name, device[-5:]) for name, kind, device in ops if kind == "AddN"]
    assert sums == [("down", "CPU:0"), ("narrow", "CPU:0")]

    # The backward of each shard runs on its device too (TensorFlow would put it on the
    # first device): every matmul of the gradient is placed, except the replicated head's.
    @tf.function
    def gradients(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(split(x) ** 2)
        return tape.gradient(loss, split.trainable_variables)

    graph = gradients.get_concrete_function(tf.TensorSpec((None, FEATURES), tf.float32)).graph
    nodes = list(graph.as_graph_def().node) + [
        node for function in graph.as_graph_def().library.function for node in function.node_def]
    matmuls = collections.Counter(node.device[-5:] for node in nodes if node.op == "MatMul")
    # 4 split layers: per device 4 forward, 4 kernel gradients, 4 input gradients;
    # the head: 1 forward, 2 backward, unplaced.
    assert matmuls == {"CPU:0": 12, "CPU:1": 12, "": 3}, matmuls


def test_a_sequential_model_splits_and_its_weights_go_back_and_forth():
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(16, activation="relu", name="up"),
                              keras.layers.Dense(FEATURES, name="down"),
                              keras.layers.Dense(CLASSES, name="head")], name="stack")
    split = split_model(model, plan_shards(model, layout(), 2).with_devices(shard_devices(2)))
    assert isinstance(split, keras.Sequential)
    x = arrays()[0]
    np.testing.assert_allclose(split(x), model(x), rtol=1e-5, atol=1e-6)
    for variable in split.trainable_variables:
        variable.assign(variable + 1.0)
    gather_weights(split, model)
    np.testing.assert_allclose(model(x), split(x), rtol=1e-5, atol=1e-5)


def test_global_norm_clipping_matches_one_device():
    one = fit(False, clip_norm=0.05)
    two = fit(True, clip_norm=0.05)
    assert_same(two, one)
    unclipped = fit(False)  # the clipping binds: without it the weights end elsewhere
    assert not np.allclose(unclipped[0].get_layer("up").kernel, one[0].get_layer("up").kernel,
                           atol=1e-3)


def test_each_device_holds_half_of_the_split_kernels_and_their_slots():
    _, _, trainer = fit(True, epochs=1, optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    split_layers = [trainer.model.get_layer(s.layer) for s in trainer.shard_plan.layers]
    kernels = [v for layer in split_layers for v in layer.kernels]
    per_device = variable_bytes_by_device(kernels)
    assert len(per_device) == 2
    total = sum(per_device.values())
    full = sum(s.input_dim * s.units * 4 for s in trainer.shard_plan.layers)
    assert total == full
    for size in per_device.values():
        assert size == total // 2
    # Momentum slots sit next to their shard.
    slots = {id(v): s for v, s in zip(trainer.model.trainable_variables,
                                      trainer.optimizer.momentums, strict=True)}
    for kernel in kernels:
        assert slots[id(kernel)].value.device == kernel.value.device


def test_refusals_name_the_layer_and_why():
    model = mlp()

    def refused(**entries):
        layout_map = keras.distribution.LayoutMap(
            keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"]))
        for key, axes in entries.items():
            layout_map[key.replace("__", "/")] = axes
        with pytest.raises(ShardLayoutError) as error:
            plan_shards(model, layout_map, 2)
        return str(error.value)

    assert "'down/kernel' (layer 'down') shards both kernel axes" in refused(
        down__kernel=("model", "model"))
    assert "'head/kernel' (layer 'head'" in refused(head__kernel=(None, "model"))  # 5 classes
    assert "5 does not divide by 2" in refused(head__kernel=(None, "model"))
    assert "bias 'down/bias' of the row-parallel Dense layer 'down'" in refused(
        down__kernel=("model", None), down__bias=("model",))
    assert "but not its kernel 'up/kernel'" in refused(up__bias=("model",))

    inputs = keras.Input((4, FEATURES))
    attention = keras.layers.EinsumDense("abc,cd->abd", output_shape=(None, 8),
                                         name="proj")(inputs)
    block = keras.Sequential([keras.layers.Dense(8, name="inner")], name="block")(attention)
    attend = keras.layers.MultiHeadAttention(2, 4, name="attend")(block, block)
    other = keras.Model(inputs, attend, name="other")
    layout_map = keras.distribution.LayoutMap(
        keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"]))
    layout_map["proj/kernel"] = (None, "model")
    assert plan_shards(other, layout_map, 2).shard_of("proj").style == "column"  # EinsumDense
    conv_inputs = keras.Input((4, FEATURES))
    class OwnConv(keras.layers.Conv1D):  # a subclass may compute anything: not split
        pass

    conv = keras.Model(conv_inputs, OwnConv(8, 2, name="proj")(conv_inputs))
    with pytest.raises(ShardLayoutError, match="layer 'proj', a OwnConv: tfdist splits "
                                               "only keras.layers.Dense, keras.layers.EinsumDense"):
        plan_shards(conv, layout_map, 2)
    layout_map = keras.distribution.LayoutMap(layout_map.device_mesh)
    layout_map["attend/query/kernel"] = (None, "model", None)
    with pytest.raises(ShardLayoutError, match="splits the MultiHeadAttention 'attend' only in "
                                               "part .*split by heads as a whole"):
        plan_shards(other, layout_map, 2)
    layout_map["attend/(key|value)/kernel"] = (None, "model", None)
    layout_map["attend/attention_output/kernel"] = ("model", None, None)
    layout_map["attend/attention_output/bias"] = ("model",)
    with pytest.raises(ShardLayoutError, match="output bias of the MultiHeadAttention 'attend'"):
        plan_shards(other, layout_map, 2)
    layout_map = keras.distribution.LayoutMap(layout_map.device_mesh)
    layout_map[".*inner/kernel"] = (None, "model")
    with pytest.raises(ShardLayoutError, match="which its parent 'block' \\(Sequential\\) does "
                                               "not hold as an attribute"):
        plan_shards(other, layout_map, 2)
    with pytest.raises(ShardLayoutError, match="exactly one axis of 4 devices"):
        plan_shards(model, layout(), 4)


def test_trainer_refuses_what_is_not_supported_yet_by_name():
    with pytest.raises(ValueError, match="tensor_parallel=2 needs layout_map="):
        Trainer(mlp(), tensor_parallel=2)
    with pytest.raises(ValueError, match="with model_parallel=2"):
        Trainer(mlp(), tensor_parallel=2, layout_map=layout(), model_parallel=2)
    with pytest.raises(ValueError, match="jit_compile=True is not supported with tensor"):
        Trainer(mlp(), tensor_parallel=2, layout_map=layout(), jit_compile=True)
    class OwnStep(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    inputs = keras.Input((FEATURES,))
    own = OwnStep(inputs, keras.layers.Dense(4, name="up")(inputs))
    own.compile("sgd", "mse")
    with pytest.raises(ValueError, match="which does not have the model's own OwnStep.train_step"):
        Trainer(own, tensor_parallel=2, layout_map=layout())
    unbuilt = keras.Sequential([keras.layers.Dense(4, name="up")])
    unbuilt.compile("sgd", "mse")
    with pytest.raises(ValueError, match="is not built; tensor_parallel=2 splits a built"):
        Trainer(unbuilt, tensor_parallel=2, layout_map=layout())
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = mlp()
    with pytest.raises(ValueError, match="needs the default strategy \\(one worker\\) or "
                                         "MultiWorkerMirroredStrategy with one device per "
                                         "worker .* got MirroredStrategy with 2 replica"):
        Trainer(model, tensor_parallel=2, layout_map=layout())
