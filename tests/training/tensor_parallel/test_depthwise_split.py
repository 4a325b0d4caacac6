"""Depthwise convolutions split by channels (`DepthwiseConv2D` kernel laid out
`(None, None, "model", None)`, `DepthwiseConv1D` likewise) on the session's 2 logical CPUs:
a separable block split end to end (a convolution by filters, the depthwise one by channels,
the 1x1 pointwise one by input channels) trains exactly like one device, each shard reading
the previous one's piece on its own device; the split run saves the model as built with its
Adam state; layouts tfdist cannot split are refused, saying why.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist.training.tensor_parallel.layers as layers
from tfdist.training.tensor_parallel.layout import ShardLayoutError, plan_shards
from helpers.tensor_parallel_conv import (CLASSES, adam_trained, assert_same_state,
                                          assert_trains_like_one_device, images, mesh)


def separable_model(seed=5):
    """stem (by filters, relu) -> depthwise x2 (by channels, relu) -> pointwise 1x1 (by input
    channels, no bias: before a batch norm its gradient is rounding noise, which Adam would
    magnify) -> BN -> head."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3), name="images")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="stem")(inputs)
    x = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", activation="relu",
                                     name="dw")(x)
    x = keras.layers.Conv2D(6, 1, use_bias=False, name="pw")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="head")(x), name="separable")


def separable_layout():
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["stem/kernel"] = (None, None, None, "model")
    layout_map["dw/kernel"] = (None, None, "model", None)
    layout_map["dw/bias"] = ("model",)
    layout_map["pw/kernel"] = (None, None, "model", None)
    return layout_map


def test_a_separable_block_split_end_to_end_trains_like_one_device(monkeypatch):
    handed_over = []  # whether each split layer reading channel pieces found them handed over
    original = layers.pieces_of

    def spy(tensor, num_pieces=None, width=None):
        pieces = original(tensor, num_pieces, width)
        handed_over.append(pieces is not None)
        return pieces

    monkeypatch.setattr(layers, "pieces_of", spy)
    x, y = images(32, 8)
    trainer = assert_trains_like_one_device(separable_model, separable_layout(), x, y, batch=8)
    assert [(s.layer, s.style) for s in trainer.shard_plan.layers] == [
        ("stem", "filters"), ("dw", "channels"), ("pw", "input_channels")]
    assert "dw  channels-parallel  kernel (3, 3, 8, 2) -> 2 x (3, 3, 4, 2)" in (
        trainer.shard_plan.describe())
    dw = trainer.model.get_layer("dw")
    assert [tuple(conv.bias.shape) for conv in dw.convs] == [(8,), (8,)]
    assert [conv.kernel.value.device[-5:] for conv in dw.convs] == ["CPU:0", "CPU:1"]
    # dw read the stem's pieces and pw read dw's (two reads a trace), never a gathered output.
    assert len(handed_over) >= 2 and all(handed_over), handed_over


def test_depthwise_conv1d_split_by_channels_trains_like_one_device():
    def build(seed=5):
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((10, 4), name="inputs")
        x = keras.layers.DepthwiseConv1D(3, depth_multiplier=3, name="dw")(inputs)
        x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
        return keras.Model(inputs, keras.layers.Dense(CLASSES, name="head")(x), name="dw1d")

    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["dw/kernel"] = (None, "model", None)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(16, 10, 4)).astype("float32")
    y = rng.integers(0, CLASSES, size=(16,)).astype("int32")
    trainer = assert_trains_like_one_device(build, layout_map, x, y, batch=8)
    assert [type(conv).__name__ for conv in trainer.model.get_layer("dw").convs] == [
        "DepthwiseConv1D"] * 2


def test_a_split_separable_run_saves_the_whole_model_with_adams_state(tmp_path):
    x, y = images(16, 8)
    loaded = []
    for layout_map in (None, separable_layout()):
        _, trainer = adam_trained(separable_model, layout_map, x, y)
        trainer.model.save(tmp_path / f"split{layout_map is not None}.keras")
        loaded.append(keras.saving.load_model(tmp_path / f"split{layout_map is not None}.keras"))
        assert type(loaded[-1].get_layer("dw")) is keras.layers.DepthwiseConv2D
    assert_same_state(loaded[1], loaded[0])


def separable_layer_model(rank, seed=5):
    """stem (by filters) -> SeparableConv{rank}D (by input channels, bias, relu) -> head."""
    keras.utils.set_random_seed(seed)
    conv = {1: keras.layers.Conv1D, 2: keras.layers.Conv2D}[rank]
    separable = {1: keras.layers.SeparableConv1D, 2: keras.layers.SeparableConv2D}[rank]
    pool = {1: keras.layers.GlobalAveragePooling1D, 2: keras.layers.GlobalAveragePooling2D}[rank]
    inputs = keras.Input((8,) * rank + (3,), name="inputs")
    x = conv(8, 3, padding="same", activation="relu", name="stem")(inputs)
    x = separable(6, 3, depth_multiplier=2, activation="relu", name="sep")(x)
    x = pool(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="head")(x), name=f"sep{rank}d")


def separable_layer_layout(rank):
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["stem/kernel"] = (None,) * rank + (None, "model")
    layout_map["sep/(depthwise|pointwise)_kernel"] = (None,) * rank + ("model", None)
    return layout_map


@pytest.mark.parametrize("rank", [1, 2])
def test_a_separable_conv_layer_split_by_input_channels_trains_like_one_device(rank):
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(16,) + (8,) * rank + (3,)).astype("float32")
    y = rng.integers(0, CLASSES, size=(16,)).astype("int32")
    trainer = assert_trains_like_one_device(lambda: separable_layer_model(rank),
                                            separable_layer_layout(rank), x, y, batch=8)
    assert [(s.layer, s.style) for s in trainer.shard_plan.layers] == [
        ("stem", "filters"), ("sep", "separable")]
    sep = trainer.model.get_layer("sep")
    if rank == 2:
        assert [tuple(c.depthwise_kernel.shape) for c in sep.convs] == [(3, 3, 4, 2)] * 2
        assert [tuple(c.pointwise_kernel.shape) for c in sep.convs] == [(1, 1, 8, 6)] * 2
    assert sep.bias.value.device[-5:] == "CPU:0"


def test_a_split_separable_conv_layer_saves_the_whole_model_with_adams_state(tmp_path):
    x, y = images(16, 8)
    loaded = []
    for layout_map in (None, separable_layer_layout(2)):
        _, trainer = adam_trained(lambda: separable_layer_model(2), layout_map, x, y)
        trainer.model.save(tmp_path / f"sep{layout_map is not None}.keras")
        loaded.append(keras.saving.load_model(tmp_path / f"sep{layout_map is not None}.keras"))
    assert_same_state(loaded[1], loaded[0])


def test_depthwise_layouts_tfdist_cannot_split_are_refused_saying_why():
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["dw/kernel"] = (None, None, None, "model")
    with pytest.raises(ShardLayoutError, match=r"splits a depthwise convolution by its "
                                               r"channels only: \(None, None, 'model', None\)"):
        plan_shards(separable_model(), layout_map, 2)
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["dw/kernel"] = (None, None, "model", None)
    layout_map["dw/bias"] = (None,)
    plan_shards(separable_model(), layout_map, 2)  # an unsplit bias layout: split with them
    four = keras.distribution.LayoutMap(keras.distribution.DeviceMesh(
        (4,), ["model"], devices=[f"cpu:{i}" for i in range(4)]))
    four["dw/kernel"] = (None, None, "model", None)
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8, 8, 6))
    model = keras.Model(inputs, keras.layers.DepthwiseConv2D(3, name="dw")(inputs))
    with pytest.raises(ShardLayoutError, match="the 6 channels .* 6 does not divide by 4"):
        plan_shards(model, four, 4)
    inputs = keras.Input((8, 8, 4))
    model = keras.Model(inputs, keras.layers.DepthwiseConv2D(
        3, depthwise_regularizer="l2", name="dw")(inputs))
    with pytest.raises(ShardLayoutError, match="depthwise_regularizer"):
        plan_shards(model, four, 4)
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["sep/depthwise_kernel"] = (None, None, "model", None)  # not its pointwise half
    with pytest.raises(ShardLayoutError, match="both kernels together"):
        plan_shards(separable_layer_model(2), layout_map, 2)
    layout_map["sep/pointwise_kernel"] = (None, None, "model", None)
    layout_map["sep/bias"] = ("model",)
    with pytest.raises(ShardLayoutError, match="bias 'sep/bias' .* it is added once"):
        plan_shards(separable_layer_model(2), layout_map, 2)
    assert tf.config.list_logical_devices("CPU")  # the session's logical CPUs exist
