"""EinsumDense split along one kernel axis (`tfdist.training.tensor_parallel.einsum`), on the
session's 2 logical CPUs: a Functional model of EinsumDense layers nobody wrote a layout for
in tfdist's own models, split column- and row-wise, equals one device."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.training import Trainer
from tfdist.training.tensor_parallel.einsum import ShardedEinsumDense
from tfdist.training.tensor_parallel.layout import ShardLayoutError, plan_shards
from tfdist.training.tensor_parallel.split import gather_weights, shard_devices, split_model

SEQ, FEATURES, CLASSES = 6, 12, 5


def einsum_model(seed=2, heads_bias="de"):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((SEQ, FEATURES))
    up = keras.layers.EinsumDense("abc,cd->abd", (SEQ, 32), bias_axes="d", activation="gelu",
                                  name="up")(inputs)
    down = keras.layers.EinsumDense("abd,de->abe", (SEQ, FEATURES), bias_axes="e",
                                    name="down")(up)
    heads = keras.layers.EinsumDense("abc,cde->abde", (SEQ, 4, 3), bias_axes=heads_bias,
                                     activation="tanh", name="heads")(down)
    flat = keras.layers.Reshape((SEQ * 12,))(heads)
    logits = keras.layers.Dense(CLASSES, name="head")(flat)
    model = keras.Model(inputs, logits)
    model.compile(keras.optimizers.SGD(0.2, momentum=0.5),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def layout():
    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["up/kernel"] = (None, "model")        # column: its output features
    layout_map["up/bias"] = ("model",)
    layout_map["down/kernel"] = ("model", None)      # row: the features it contracts
    layout_map["heads/kernel"] = (None, "model", None)  # column: the heads (not the last axis)
    return layout_map


def arrays(seed=0, rows=32):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, SEQ, FEATURES)).astype("float32"),
            rng.integers(0, CLASSES, size=(rows,)).astype("int32"))


@pytest.mark.parametrize("heads_bias", ["de", "e"], ids=["bias-split", "bias-whole"])
def test_einsum_layers_split_both_ways_train_like_one_device(heads_bias):
    # "e": the heads' bias does not vary by head, so it is added once after the concatenation,
    # and the tanh after it.
    x, y = arrays()
    one = einsum_model(heads_bias=heads_bias)
    one_history = Trainer(one).fit(x, y, batch_size=8, epochs=2, shuffle=False,
                                   verbose=0).history
    two = einsum_model(heads_bias=heads_bias)
    trainer = Trainer(two, tensor_parallel=2, layout_map=layout())
    heads = trainer.model.get_layer("heads")
    assert (heads.bias is None) == (heads_bias == "de")
    history = trainer.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    assert [(s.layer, s.style, s.einsum_letter) for s in trainer.shard_plan.layers] == [
        ("up", "column", "d"), ("down", "row", "d"), ("heads", "column", "d")]
    split = trainer.model
    assert all(isinstance(split.get_layer(n), ShardedEinsumDense) for n in ("up", "down", "heads"))
    assert [s.kernel.shape for s in split.get_layer("heads").shards] == [(FEATURES, 2, 3)] * 2
    assert [s.kernel.value.device[-5:] for s in split.get_layer("down").shards] == [
        "CPU:0", "CPU:1"]
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose(history[name], one_history[name], rtol=1e-5, err_msg=name)
    assert not np.allclose(two.get_layer("up").kernel, einsum_model().get_layer("up").kernel)
    for a, b in zip(two.get_weights(), one.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_each_einsum_shard_gradient_is_its_slice_of_the_one_device_gradient():
    model = einsum_model()
    split = split_model(model, plan_shards(model, layout(), 2).with_devices(shard_devices(2)))
    x, y = arrays(rows=8)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def gradients(net):
        with tf.GradientTape() as tape:
            value = loss(y, net(x))
        return dict(zip([v.path for v in net.trainable_variables],
                        tape.gradient(value, net.trainable_variables), strict=True))

    full, shards = gradients(model), gradients(split)
    for name, axis in (("up", 1), ("down", 0), ("heads", 1)):
        pieces = [shards[f"{name}/{name}_shard_{i}/kernel"] for i in range(2)]
        np.testing.assert_allclose(np.concatenate(pieces, axis=axis), full[f"{name}/kernel"],
                                   rtol=1e-5, atol=1e-7)
    # A bias over the split letter is split with the kernel (the heads' "de" by heads, up's
    # "d"); down's, added after the sum, lives once on the first device.
    for name in ("up", "heads"):
        pieces = [shards[f"{name}/{name}_shard_{i}/bias"] for i in range(2)]
        np.testing.assert_allclose(np.concatenate(pieces, axis=0), full[f"{name}/bias"],
                                   rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(shards["down/bias"], full["down/bias"], rtol=1e-5, atol=1e-7)
    # Weights go back whole.
    fresh = einsum_model(seed=9)
    gather_weights(split, fresh)
    for a, b in zip(fresh.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("equation,shape,bias_axes,axes,words", [
    ("abc,bcd->abd", (SEQ, 8), None, ("model", None, None), "in both its input and output"),
    ("abc,cd->abd", (SEQ, 8), "d", ("model", None), None),  # row, whole bias: fine
    ("abc,cd->abd", (SEQ, 7), None, (None, "model"), "do not divide by 2 devices"),
    ("abc,cd->abd", (SEQ, 8), None, ("model", "model"), "exactly one of its 2 axes"),
])
def test_an_einsum_split_it_cannot_do_is_refused_by_name(equation, shape, bias_axes, axes,
                                                          words):
    inputs = keras.Input((SEQ, FEATURES))
    layer = keras.layers.EinsumDense(equation, shape, bias_axes=bias_axes, name="proj")
    model = keras.Model(inputs, layer(inputs))
    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["proj/kernel"] = axes
    if words is None:
        assert plan_shards(model, layout_map, 2).shard_of("proj").style == "row"
        layout_map["proj/bias"] = ("model",)
        words = "Drop the bias entry"
    with pytest.raises(ShardLayoutError, match=words) as raised:
        plan_shards(model, layout_map, 2)
    assert "'proj'" in str(raised.value)
