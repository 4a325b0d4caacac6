"""Convolutions split by output channels (`Conv2D` kernel laid out `(None, None, None, "model")`)
on the session's 2 logical CPUs: a small Functional conv model and tfdist's resnet_tiny with
its shipped layout train exactly like one device (SGD, float32, same initial weights); each
device holds half of every split kernel; a convolution laid out on its input channels is
refused, saying why and the way out.
"""

import keras
import numpy as np
import pytest

from tfdist.models import build_resnet, resnet_layout_map
from tfdist.training import Trainer
from tfdist.training.model_parallel.placement import variable_bytes_by_device
from tfdist.training.tensor_parallel.layers import ShardedConv2D
from tfdist.training.tensor_parallel.layout import ShardLayoutError, plan_shards

RTOL, ATOL = 1e-5, 1e-5
CLASSES = 4


def mesh():
    return keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])


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


def images(rows, size, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, size, size, 3)).astype("float32"),
            rng.integers(0, CLASSES, size=(rows,)).astype("int32"))


def train(model, layout_map, x, y, batch):
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    extra = dict(tensor_parallel=2, layout_map=layout_map) if layout_map is not None else {}
    trainer = Trainer(model, **extra)
    history = trainer.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return history.history["loss"], trainer


def assert_trains_like_one_device(build, layout_map, x, y, batch):
    one_model, two_model = build(), build()
    one_loss, _ = train(one_model, None, x, y, batch)
    two_loss, trainer = train(two_model, layout_map, x, y, batch)
    np.testing.assert_allclose(two_loss, one_loss, rtol=RTOL)
    for a, b in zip(two_model.get_weights(), one_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    assert not np.allclose(two_model.get_weights()[0], build().get_weights()[0])  # it trained
    return trainer


def test_conv_model_split_by_filters_trains_like_one_device():
    x, y = images(32, 8)
    trainer = assert_trains_like_one_device(conv_model, conv_layout(), x, y, batch=8)
    assert [(s.layer, s.style) for s in trainer.shard_plan.layers] == [
        ("wide", "filters"), ("wider", "filters")]
    assert "wide  filters-parallel  kernel (3, 3, 3, 8) -> 2 x (3, 3, 3, 4)" in (
        trainer.shard_plan.describe())
    wider = trainer.model.get_layer("wider")
    assert isinstance(wider, ShardedConv2D)
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


def test_a_conv_laid_out_on_its_input_channels_is_refused_saying_why():
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["wider/kernel"] = (None, None, "model", None)
    with pytest.raises(ShardLayoutError) as error:
        plan_shards(conv_model(), layout_map, 2)
    message = str(error.value)
    for text in ("input channels of the Conv2D layer 'wider'", "not supported yet",
                 "(None, None, None, 'model')", "drop its entries"):
        assert text in message, message
    layout_map = keras.distribution.LayoutMap(mesh())
    layout_map["narrow/kernel"] = (None, None, None, "model")
    layout_map["wider/kernel"] = (None, None, None, "model")
    plan_shards(conv_model(), layout_map, 2)  # 4 and 6 filters divide by 2
    with pytest.raises(ShardLayoutError, match="6 does not divide by 4"):
        plan_shards(conv_model(), _four(layout_map), 4)


def _four(layout_map):
    four = keras.distribution.LayoutMap(keras.distribution.DeviceMesh(
        (4,), ["model"], devices=[f"cpu:{i}" for i in range(4)]))
    for key in layout_map:
        four[key] = layout_map[key].axes
    return four
