"""tfdist.models.batch_norm: FusedBatchNormalization computes Keras's batch norm
(outputs, gradients, moving averages, inference) with TensorFlow's fused kernel,
runs that kernel where it says it does, and is Keras's own layer everywhere else."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.models.batch_norm import SMALLEST_FUSED_EPSILON, FusedBatchNormalization

SHAPE = (6, 5, 4, 3)


def _pair(**kwargs):
    """A Keras BatchNormalization and a FusedBatchNormalization with the same weights."""
    shape = kwargs.pop("input_shape", SHAPE)
    kwargs = {"momentum": 0.9, "epsilon": SMALLEST_FUSED_EPSILON, **kwargs}
    keras_bn, fused_bn = keras.layers.BatchNormalization(**kwargs), FusedBatchNormalization(**kwargs)
    rng = np.random.default_rng(3)
    for layer in (keras_bn, fused_bn):
        layer.build(shape)
    weights = [rng.uniform(0.5, 1.5, w.shape).astype("float32") for w in keras_bn.weights]
    keras_bn.set_weights(weights)
    fused_bn.set_weights(weights)
    return keras_bn, fused_bn


def _step(layer, x, training):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=training)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.range(1.0, 1.0 + y.shape[-1]))
    grads = tape.gradient(loss, [x, *layer.trainable_weights])
    return [y, *grads, *[w.value for w in layer.non_trainable_weights]]


def _graph_op_types(layer, x, training):
    concrete = tf.function(lambda x: _step(layer, x, training)).get_concrete_function(x)
    return {op.type for op in concrete.graph.get_operations()}


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_float32_outputs_gradients_and_moving_averages_equal_keras(training):
    keras_bn, fused_bn = _pair()
    x = tf.constant(np.random.default_rng(0).normal(2.0, 3.0, SHAPE), tf.float32)
    initial_mean = fused_bn.moving_mean.numpy()
    for _ in range(3):  # the moving averages move, and feed the next steps' results
        expected, got = _step(keras_bn, x, training), _step(fused_bn, x, training)
        for want, have in zip(expected, got, strict=True):
            # atol: gamma's gradient is a sum of 120 terms up to ~10 that cancels
            # to 0 in training, so what is left is rounding, whose size depends
            # on the kernels' summation order (3.8e-5 on an AVX2-only CPU).
            np.testing.assert_allclose(have, want, rtol=2e-5, atol=1e-4)
    # In training the averages moved: the comparison was not of untouched weights.
    assert np.allclose(fused_bn.moving_mean.numpy(), initial_mean) == (not training)


def test_the_fused_kernel_is_what_runs_forward_and_backward():
    x = tf.zeros(SHAPE)
    _, fused_bn = _pair()
    keras_bn, _ = _pair()
    assert {"FusedBatchNormV3", "FusedBatchNormGradV3"} <= _graph_op_types(fused_bn, x, True)
    assert "FusedBatchNormV3" in _graph_op_types(fused_bn, x, False)
    assert not {"FusedBatchNormV3"} & _graph_op_types(keras_bn, x, True)


def test_mixed_bfloat16_matches_keras_within_bfloat16_rounding():
    policy = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        keras_bn, fused_bn = _pair()
    finally:
        keras.mixed_precision.set_dtype_policy(policy)
    x = tf.constant(np.random.default_rng(1).normal(0.0, 1.0, SHAPE), tf.float32)
    expected, got = _step(keras_bn, x, True), _step(fused_bn, x, True)
    assert got[0].dtype == expected[0].dtype == tf.bfloat16
    for want, have in zip(expected, got, strict=True):
        np.testing.assert_allclose(tf.cast(have, tf.float32), tf.cast(want, tf.float32),
                                   rtol=2e-2, atol=2e-2)
    # The statistics are float32 in both: the moving averages agree far more closely.
    for want, have in zip(expected[-2:], got[-2:], strict=True):
        np.testing.assert_allclose(have, want, rtol=1e-5)


def test_one_value_per_channel_leaves_the_moving_variance_finite_as_keras_does():
    keras_bn, fused_bn = _pair(input_shape=(1, 1, 1, 3))
    x = tf.constant([[[[1.0, -2.0, 3.0]]]])
    keras_bn(x, training=True)
    fused_bn(x, training=True)
    np.testing.assert_allclose(fused_bn.moving_variance.numpy(),
                               keras_bn.moving_variance.numpy(), rtol=1e-6)
    assert np.isfinite(fused_bn.moving_variance.numpy()).all()


def test_xla_compiled_training_step_equals_the_uncompiled_one():
    _, fused_bn = _pair()
    _, compiled_bn = _pair()
    x = tf.constant(np.random.default_rng(2).normal(0.0, 1.0, SHAPE), tf.float32)
    plain = tf.function(lambda x: _step(fused_bn, x, True))(x)
    compiled = tf.function(lambda x: _step(compiled_bn, x, True), jit_compile=True)(x)
    for want, have in zip(plain, compiled, strict=True):
        np.testing.assert_allclose(have, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kwargs, shape, dtype, mask", [
    ({"synchronized": True}, SHAPE, "float32", None),
    ({"renorm": True}, SHAPE, "float32", None),
    ({"epsilon": 1e-5}, SHAPE, "float32", None),     # below the fused kernel's smallest
    ({"axis": 1}, SHAPE, "float32", None),           # channels first
    ({}, (6, 3), "float32", None),                   # a Dense layer's output
    ({}, SHAPE, "float64", None),
    ({}, SHAPE, "float32", np.ones(SHAPE[:-1], bool)),
], ids=["synchronized", "renorm", "small_epsilon", "channels_first", "2d", "float64", "mask"])
def test_what_the_kernel_cannot_take_runs_as_keras_to_the_bit(kwargs, shape, dtype, mask):
    dtype_kwargs = {"dtype": dtype} if dtype != "float32" else {}
    keras_bn, fused_bn = _pair(input_shape=shape, **kwargs, **dtype_kwargs)
    x = tf.constant(np.random.default_rng(4).normal(1.0, 2.0, shape), dtype)
    assert not fused_bn.fuses(x, None if mask is None else tf.constant(mask))
    for training in (True, False):
        want = keras_bn(x, training=training, mask=mask)
        have = fused_bn(x, training=training, mask=mask)
        np.testing.assert_array_equal(have, want)
    for want, have in zip(keras_bn.weights, fused_bn.weights, strict=True):
        np.testing.assert_array_equal(have.numpy(), want.numpy())


def test_same_weights_as_keras_and_a_config_that_round_trips():
    keras_bn, fused_bn = _pair()
    assert [w.path.split("/")[-1] for w in fused_bn.weights] == [
        w.path.split("/")[-1] for w in keras_bn.weights]
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(fused_bn))
    assert type(restored) is FusedBatchNormalization
    assert restored.get_config() == fused_bn.get_config()
