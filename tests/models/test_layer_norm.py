"""`tfdist.models.LayerNormalization`: Keras's layer with the closed-form gradient."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.models.layer_norm import LayerNormalization


def _pair(policy, shape, **options):
    """The same layer as Keras's and as tfdist's, with the same non-trivial weights."""
    rng = np.random.default_rng(0)
    layers = [cls(epsilon=1e-5, dtype=policy, **options)
              for cls in (keras.layers.LayerNormalization, LayerNormalization)]
    for layer in layers:
        layer.build(shape)
    weights = [rng.normal(size=w.shape).astype("float32") * 0.3 + (1.0 if "gamma" in w.path else 0)
               for w in layers[0].weights]
    for layer in layers:
        layer.set_weights(weights)
    x = rng.normal(size=shape).astype("float32") * 3 + 1
    upstream = rng.normal(size=shape).astype("float32")
    return layers, x, upstream


def _forward_and_gradients(layer, x, upstream):
    x = tf.cast(x, layer.compute_dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
    grads = tape.gradient(loss, [x, *layer.trainable_variables])
    return [np.asarray(tf.cast(t, tf.float64)) for t in (y, *grads)]


def _float64_reference(layer, x, upstream):
    x = tf.constant(tf.cast(tf.cast(x, layer.compute_dtype), tf.float64))
    gamma, beta = (tf.constant(np.asarray(w), tf.float64) for w in layer.trainable_variables)
    with tf.GradientTape() as tape:
        tape.watch([x, gamma, beta])
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        y = (x - mean) * tf.math.rsqrt(variance + 1e-5) * gamma + beta
        loss = tf.reduce_sum(y * upstream)
    return [np.asarray(t) for t in (y, *tape.gradient(loss, [x, gamma, beta]))]


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("shape", [(6, 16), (2, 5, 32)])
def test_values_and_gradients_equal_keras_up_to_rounding(policy, shape):
    (keras_layer, ours), x, upstream = _pair(policy, shape)
    assert ours.writes_out_gradient(tf.zeros(shape, ours.compute_dtype))
    theirs = _forward_and_gradients(keras_layer, x, upstream)
    mine = _forward_and_gradients(ours, x, upstream)
    exact = _float64_reference(ours, x, upstream)
    names = ("y", "dx", "dgamma", "dbeta")
    for name, a, b, truth in zip(names, mine, theirs, exact, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        scale = np.abs(truth).max()
        if policy == "float32":
            np.testing.assert_allclose(a, b, rtol=0, atol=2e-6 * scale, err_msg=name)
        else:
            # y and dx are bfloat16 tensors: at most one bfloat16 step of the largest
            # value apart; the weight gradients are float32 sums of bfloat16 terms.
            np.testing.assert_allclose(a, b, rtol=0, atol=2.0 ** -7 * scale, err_msg=name)
        # and no farther from the float64 truth than Keras's ops are, give or take rounding
        error, keras_error = np.abs(a - truth).max(), np.abs(b - truth).max()
        assert error <= keras_error + 2.0 ** -8 * scale, (name, error, keras_error)


def test_the_gradient_trains_a_model_like_keras_under_a_tf_function():
    (keras_layer, ours), x, upstream = _pair("float32", (4, 8, 16))
    traced = [tf.function(lambda x, layer=layer: _loss_and_gradients(layer, x))
              for layer in (keras_layer, ours)]
    for theirs, mine in zip(traced[0](x), traced[1](x), strict=True):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=1e-5, atol=1e-5)


def _loss_and_gradients(layer, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(tf.square(layer(x)))
    return [loss, *tape.gradient(loss, [x, *layer.trainable_variables])]


@pytest.mark.parametrize("options, shape", [
    (dict(axis=[1, 2]), (2, 3, 8)),
    (dict(axis=1), (2, 8, 3)),
    (dict(center=False), (4, 8)),
    (dict(scale=False), (4, 8)),
])
def test_other_configurations_run_keras_own_ops(options, shape):
    (keras_layer, ours), x, upstream = _pair("float32", shape, **options)
    assert not ours.writes_out_gradient(tf.zeros(shape))
    for a, b in zip(_forward_and_gradients(ours, x, upstream),
                    _forward_and_gradients(keras_layer, x, upstream), strict=True):
        np.testing.assert_array_equal(a, b)


def test_float64_inputs_run_keras_own_ops():
    assert not LayerNormalization().writes_out_gradient(tf.zeros([2, 4], tf.float64))


def test_config_weights_and_names_are_keras_own_and_it_deserialises():
    layer = LayerNormalization(epsilon=1e-5)
    layer.build((2, 8))
    assert layer.name.startswith("layer_normalization")
    assert [w.path.rsplit("/", 1)[-1] for w in layer.weights] == ["gamma", "beta"]
    config = keras.saving.serialize_keras_object(layer)
    assert config["registered_name"] == "tfdist>LayerNormalization"
    again = keras.saving.deserialize_keras_object(config)
    assert type(again) is LayerNormalization and again.epsilon == 1e-5
    keras_layer = keras.layers.LayerNormalization(epsilon=1e-5, name=layer.name)
    keras_layer.build((2, 8))
    assert layer.get_config() == keras_layer.get_config()
