"""Convolutions split by output channels (`Conv2D` kernel laid out `(None, None, None, "model")`)
or by input channels (`(None, None, "model", None)`), and `Conv1D` / `Conv3D` split the same
ways, on the session's 2 logical CPUs: small Functional conv models and tfdist's resnet_tiny
with its shipped layout train exactly like one device (SGD, float32, same initial weights);
each device holds half of every split kernel; the split run's saved weights and Adam state
equal one device's; a layout tfdist cannot split is refused, saying why and the way out.
"""

import keras
import numpy as np
import pytest

from tfdist.models import build_resnet, resnet_layout_map
from tfdist.training.model_parallel.placement import variable_bytes_by_device
from tfdist.training.tensor_parallel.conv import ShardedConv
from tfdist.training.tensor_parallel.layout import ShardLayoutError, plan_shards
from helpers.tensor_parallel_conv import (CLASSES, adam_trained, assert_same_state,
                                          assert_trains_like_one_device, images, mesh)


def conv_model(seed=5):
    """conv (split, bias, relu) -> conv (split, no bias) -> BN -> conv (replicated) -> head."""
    keras.utils.set_random_seed(seed)
    images = keras.Input((8, 8, 3), name="images")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="wide")(images)
    x = keras.layers.Conv2D(6, 3, strides=2, padding="same", use_bias=False, name="wider")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Conv2D(4, 1, name="narrow")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    model = keras.Model(images, keras.layers.Dense(CLASSES, name="head")(x), name="convs")
    return model


def conv_layout():
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["(wide|wider)/kernel"] = (None, None, None, "model")
    layout_map["wide/bias"] = ("model",)
    return layout_map


def test_conv_model_split_by_filters_trains_like_one_device():
    x, y = images(32, 8)
    trainer = assert_trains_like_one_device(conv_model, conv_layout(), x, y, batch=8)
    assert [(s.layer, s.style) for s in trainer.shard_plan.layers] == [
        ("wide", "filters"), ("wider", "filters")]
    assert "wide  filters-parallel  kernel (3, 3, 3, 8) -> 2 x (3, 3, 3, 4)" in (
        trainer.shard_plan.describe())
    wider = trainer.model.get_layer("wider")
    assert isinstance(wider, ShardedConv)
    kernels = [conv.kernel for conv in wider.convs]
    assert [v.value.device[-5:] for v in kernels] == ["CPU:0", "CPU:1"]
    assert list(variable_bytes_by_device(kernels).values()) == [3 * 3 * 8 * 3 * 4] * 2
    # Momentum slots sit next to their shard.
    slots = {id(v): s for v, s in zip(trainer.model.trainable_variables,
                                      trainer.optimizer.momentums, strict=True)}
    assert [slots[id(v)].value.device for v in kernels] == [v.value.device for v in kernels]


def test_resnet_tiny_with_its_shipped_layout_trains_like_one_device():
    x, y = images(16, 16, seed=1)
    layout_map = resnet_layout_map(mesh(), "resnet_tiny")
    trainer = assert_trains_like_one_device(_resnet, layout_map, x, y, batch=8)
    assert sorted(s.layer for s in trainer.shard_plan.layers) == [
        "stage3_block1_conv1", "stage3_block1_conv2", "stage3_block1_proj_conv"]
    assert all(s.units == 64 for s in trainer.shard_plan.layers)


def _resnet():
    keras.utils.set_random_seed(7)
    return build_resnet("resnet_tiny", CLASSES, (16, 16, 3))


def input_channels_layout():
    """`wide` by filters, then `wider` (no bias) and `narrow` (bias) by input channels: `wider`
    reads `wide`'s pieces where they are; `narrow` slices the batch norm's output."""
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["wide/kernel"] = (None, None, None, "model")
    layout_map["(wider|narrow)/kernel"] = (None, None, "model", None)
    return layout_map


def test_conv_model_split_by_input_channels_trains_like_one_device():
    x, y = images(32, 8)
    trainer = assert_trains_like_one_device(conv_model, input_channels_layout(), x, y, batch=8)
    assert [(s.layer, s.style) for s in trainer.shard_plan.layers] == [
        ("wide", "filters"), ("wider", "input_channels"), ("narrow", "input_channels")]
    assert "wider  input-channels-parallel  kernel (3, 3, 8, 6) -> 2 x (3, 3, 4, 6)" in (
        trainer.shard_plan.describe())
    narrow = trainer.model.get_layer("narrow")
    assert [tuple(conv.kernel.shape) for conv in narrow.convs] == [(1, 1, 3, 4)] * 2
    assert [conv.kernel.value.device[-5:] for conv in narrow.convs] == ["CPU:0", "CPU:1"]
    assert narrow.bias.value.device[-5:] == "CPU:0" and tuple(narrow.bias.shape) == (4,)


def sequence_model(rank, seed=5):
    """Conv{rank}D by filters (relu) -> Conv{rank}D by input channels (bias, tanh) -> head."""
    keras.utils.set_random_seed(seed)
    conv = {1: keras.layers.Conv1D, 3: keras.layers.Conv3D}[rank]
    inputs = keras.Input((6,) * rank + (2,), name="inputs")
    x = conv(4, 3, padding="same", activation="relu", name="wide")(inputs)
    x = conv(6, 3, strides=2, activation="tanh", name="back")(x)
    pool = {1: keras.layers.GlobalAveragePooling1D, 3: keras.layers.GlobalAveragePooling3D}[rank]
    x = pool(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="head")(x), name=f"conv{rank}d")


@pytest.mark.parametrize("rank", [1, 3])
def test_conv1d_and_conv3d_split_by_filters_and_input_channels_train_like_one_device(rank):
    spatial = (None,) * rank
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["wide/kernel"] = spatial + (None, "model")
    layout_map["wide/bias"] = ("model",)
    layout_map["back/kernel"] = spatial + ("model", None)
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(16,) + (6,) * rank + (2,)).astype("float32")
    y = rng.integers(0, CLASSES, size=(16,)).astype("int32")
    trainer = assert_trains_like_one_device(lambda: sequence_model(rank), layout_map, x, y,
                                            batch=8)
    assert [(s.layer, s.style) for s in trainer.shard_plan.layers] == [
        ("wide", "filters"), ("back", "input_channels")]
    back = trainer.model.get_layer("back")
    assert [type(conv).__name__ for conv in back.convs] == [f"Conv{rank}D"] * 2


def upsampling_model(seed=5):
    """Conv2DTranspose by filters (relu) -> Conv2DTranspose by input channels (bias) -> head:
    a transposed kernel is (kh, kw, filters, in)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4, 4, 3), name="images")
    x = keras.layers.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu",
                                     name="up1")(inputs)
    x = keras.layers.Conv2DTranspose(6, 3, strides=2, name="up2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="head")(x), name="upsampling")


def test_transposed_convolutions_split_both_ways_train_like_one_device():
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["up1/kernel"] = (None, None, "model", None)  # filters
    layout_map["up1/bias"] = ("model",)
    layout_map["up2/kernel"] = (None, None, None, "model")  # input channels
    x, y = images(16, 4)
    trainer = assert_trains_like_one_device(upsampling_model, layout_map, x, y, batch=8)
    assert [(s.layer, s.style) for s in trainer.shard_plan.layers] == [
        ("up1", "filters"), ("up2", "input_channels")]
    assert "up1  filters-parallel  kernel (3, 3, 8, 3) -> 2 x (3, 3, 4, 3)" in (
        trainer.shard_plan.describe())
    assert [tuple(conv.kernel.shape) for conv in trainer.model.get_layer("up2").convs] == [
        (3, 3, 6, 4)] * 2
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["up1/kernel"] = (None, None, None, "model")  # 3 input channels
    with pytest.raises(ShardLayoutError, match="the 3 input channels .* 3 does not divide by 2"):
        plan_shards(upsampling_model(), layout_map, 2)


def test_a_split_conv_run_saves_the_whole_model_with_adams_state(tmp_path):
    """`trainer.model.save_weights` of a run split by filters and by input channels writes
    the model as built, its kernels and Adam's moments gathered along the split axis."""
    x, y = images(16, 8)
    loaded = []
    for layout_map in (None, input_channels_layout()):
        _, trainer = adam_trained(conv_model, layout_map, x, y)
        path = tmp_path / f"split{layout_map is not None}.weights.h5"
        trainer.model.save_weights(path)
        model = conv_model(seed=9)
        model.compile(keras.optimizers.Adam(0.01), "mse")
        model.optimizer.build(model.trainable_variables)
        model.load_weights(path)
        loaded.append(model)
    assert_same_state(loaded[1], loaded[0])


def test_conv_layouts_tfdist_cannot_split_are_refused_saying_why():
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["wider/kernel"] = (None, "model", None, None)
    with pytest.raises(ShardLayoutError) as error:
        plan_shards(conv_model(), layout_map, 2)
    message = str(error.value)
    for text in ("Conv2D layer 'wider'", "(None, 'model', None, None)",
                 "(None, None, None, 'model')", "(None, None, 'model', None)"):
        assert text in message, message
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["narrow/kernel"] = (None, None, "model", None)
    layout_map["narrow/bias"] = ("model",)
    with pytest.raises(ShardLayoutError, match="added once, after the partial outputs are "
                                               "summed, so it is not split"):
        plan_shards(conv_model(), layout_map, 2)
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["narrow/kernel"] = (None, None, None, "model")
    layout_map["wider/kernel"] = (None, None, None, "model")
    plan_shards(conv_model(), layout_map, 2)  # 4 and 6 filters divide by 2
    with pytest.raises(ShardLayoutError, match="6 does not divide by 4"):
        plan_shards(conv_model(), _four(layout_map), 4)
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["narrow/kernel"] = (None, None, "model", None)  # 6 input channels
    with pytest.raises(ShardLayoutError, match="splits the 6 input channels .* 6 does not "
                                               "divide by 4"):
        plan_shards(conv_model(), _four(layout_map), 4)


def _four(layout_map):
    four = keras.distribution.LayoutMap(keras.distribution.DeviceMesh(
        (4,), ["model"], devices=[f"cpu:{i}" for i in range(4)]))
    for key in layout_map:
        four[key] = layout_map[key].axes
    return four
