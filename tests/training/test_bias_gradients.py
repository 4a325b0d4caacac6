"""bfloat16 bias gradients summed in float32 (`tfdist.seam.install_exact_bfloat16_bias_gradients`).

TensorFlow's CPU `BiasAddGrad` sums a bfloat16 gradient in bfloat16; importing
tfdist.training replaces the gradient of bfloat16 `BiasAdd` ops (channels last)
by a float32-accumulated sum. The bound below is the rounding of each entry
of the bfloat16 result (half a bfloat16 step: at most 2**-8 of the entry,
plus a little of the largest one for the float32 sum), so a sum accumulated
in bfloat16 (about 10% of the largest entry off here) fails it.
"""

import importlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist import seam

importlib.import_module("tfdist.training")  # importing it installs the gradient


def bias_gradient(received, data_format=None, mode="eager"):
    """The gradient of `tf.nn.bias_add` with respect to its bias, for `received` flowing back."""
    channels = received.shape[1] if data_format == "NCHW" else received.shape[-1]

    def gradient(received):
        bias = tf.zeros([channels], received.dtype)
        with tf.GradientTape() as tape:
            tape.watch(bias)
            out = tf.nn.bias_add(tf.zeros_like(received), bias, data_format=data_format)
        return tape.gradient(out, bias, output_gradients=received)

    if mode == "function":
        gradient = tf.function(gradient)
    elif mode == "xla":
        gradient = tf.function(gradient, jit_compile=True)
    return gradient(received)


def rounding_errors(result, received, axes):
    """The worst error of `result` against the exact sum of `received` over
    `axes`, in units of the bound: half a bfloat16 step of the entry (2**-8 of
    it) plus 2**-12 of the largest entry. At most 1: rounded once."""
    exact = np.sum(received.numpy().astype(np.float64), axis=axes)
    allowed = 2.0 ** -8 * np.abs(exact) + 2.0 ** -12 * np.max(np.abs(exact))
    return np.max(np.abs(result.numpy().astype(np.float64) - exact) / allowed)


def normal(shape, dtype, seed=0):
    return tf.cast(tf.random.stateless_normal(shape, seed=[seed, 1]), dtype)


def test_importing_tfdist_training_installs_it_once():
    assert seam.install_exact_bfloat16_bias_gradients() is False


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize("shape", [(4096, 256), (32, 128, 512)])
def test_a_bfloat16_bias_gradient_is_the_sum_rounded_once(shape, mode):
    received = normal(shape, tf.bfloat16)
    result = bias_gradient(received, mode=mode)
    assert result.dtype == tf.bfloat16 and result.shape == (shape[-1],)
    worst = rounding_errors(result, received, tuple(range(len(shape) - 1)))
    assert worst <= 1, worst


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.float64])
def test_other_dtypes_keep_tensorflows_gradient_exactly(dtype):
    received = normal((64, 8, 24), dtype)
    result = bias_gradient(received, mode="function")
    np.testing.assert_array_equal(result.numpy(),
                                  tf.raw_ops.BiasAddGrad(out_backprop=received).numpy())


def test_channels_first_keeps_tensorflows_gradient_exactly():
    received = normal((4, 8, 5, 5), tf.bfloat16)
    result = bias_gradient(received, data_format="NCHW", mode="function")
    expected = tf.raw_ops.BiasAddGrad(out_backprop=received, data_format="NCHW")
    np.testing.assert_array_equal(result.numpy(), expected.numpy())


def test_a_keras_dense_under_mixed_bfloat16_gets_the_exact_bias_gradient():
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        layer = keras.layers.Dense(300)
        inputs = normal((2048, 16), tf.float32, seed=2)
        received = normal((2048, 300), tf.bfloat16, seed=3)
        with tf.GradientTape() as tape:
            out = layer(inputs)
        bias, kernel = tape.gradient(out, [layer.bias, layer.kernel], output_gradients=received)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    assert bias.dtype == tf.float32  # the variable's dtype
    worst = rounding_errors(bias, received, (0,))
    assert worst <= 1, worst
    exact_kernel = inputs.numpy().astype(np.float64).T @ received.numpy().astype(np.float64)
    assert np.max(np.abs(kernel.numpy() - exact_kernel)) / np.max(np.abs(exact_kernel)) < 0.01


def test_second_order_gradients_pass_through_it():
    received = normal((16, 8), tf.bfloat16)
    bias = tf.zeros([8], tf.bfloat16)
    with tf.GradientTape() as outer:
        outer.watch(received)
        with tf.GradientTape() as inner:
            inner.watch(bias)
            out = tf.nn.bias_add(tf.zeros_like(received), bias)
        first = inner.gradient(out, bias, output_gradients=received)
        penalty = tf.reduce_sum(tf.cast(first, tf.float32) ** 2)
    second = outer.gradient(penalty, received)
    # d/dx sum_c (sum_n x[n, c])^2 = 2 * sum_n x[n, c], the same for every row.
    expected = 2 * np.sum(received.numpy().astype(np.float64), axis=0)
    np.testing.assert_allclose(second.numpy().astype(np.float64),
                               np.broadcast_to(expected, (16, 8)), rtol=0.02, atol=0.05)
