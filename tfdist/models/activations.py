"""The feed-forward GELUs of tfdist's Transformers; the exact one compiled with XLA on
its own in bfloat16, its slope computed with its value.

GELU is a chain of element-wise ops (a multiply, `Erfc` or `Tanh`, another
multiply) whose gradient adds `Square`, `Exp` and more multiplies. Run as
TensorFlow ops, each is a full pass over the `[batch, seq, d_ff]`
activations, and in bfloat16 each converts every element on its own: in a
bfloat16 training step of the `small` Transformer on an AMX CPU these
passes took 17% of the op time. For bfloat16 inputs `gelu_exact` is
therefore one XLA-compiled loop (`jit_compile=True`), with the rest of the
step left to TensorFlow's kernels (whose bfloat16 matmuls are the fast
ones). That loop computes, in float32, both the value, rounded once to
bfloat16, and the slope `Phi(x) + x * phi(x)`, kept in float32 for the
backward pass, which is then one multiply. Differentiating the compiled
value instead (tfdist's form until `dcdcf1e`) made the backward a second loop that
computed the erf again, rounded its intermediate results to bfloat16 and
cancelled where the slope crosses zero: one forward and backward over a
`[32, 128, 1024]` bfloat16 tensor took 8.3 ms against 2.4 ms now (a 2-core
AMD EPYC Zen 5), and its gradient was up to 3.7x off (relative to
max(|true|, 1e-3)) near x = -0.75, against 0.4% now (tested against the
float64 truth). The price is the slope's memory, 4 bytes per element from
the forward to the backward pass. Second derivatives still flow (through
the slope's own computation).

`gelu_exact` is the same GELU as `keras.activations.gelu`, and stays as
close to the true GELU as Keras's (tested). Inside a step that is
XLA-compiled as a whole it is simply part of it. Only bfloat16 inputs take
the compiled loop: in float32 TensorFlow's own kernels are vectorised, the
whole step gained only 1.03x, and each new shape costs an XLA compilation
(in the test suite, full of small models called on new shapes, about 2
minutes). The tanh form is left to TensorFlow's kernels: XLA's CPU `tanh`
made it slower compiled (29.5 vs 23.9 ms for one forward and backward over
a [32, 128, 1024] bfloat16 tensor on an AMX Xeon, where the compiled exact
form took 14.5 ms).

Example:

    layer = keras.layers.Dense(1024, activation=gelu_exact)   # or gelu_tanh
"""

import math

import keras
import tensorflow as tf

_INVERSE_SQRT_2 = 1 / math.sqrt(2.0)
_INVERSE_SQRT_2PI = 1 / math.sqrt(2.0 * math.pi)


def _gelu(x, approximate):
    return keras.activations.gelu(x, approximate=approximate)


@tf.function(jit_compile=True, autograph=False)
def _exact_value_and_slope(x):
    """GELU of `x` in `x`'s dtype and its slope in float32, both computed in float32."""
    wide = tf.cast(x, tf.float32)
    cdf = 0.5 * tf.math.erfc(wide * -_INVERSE_SQRT_2)  # as TensorFlow's gelu
    pdf = tf.exp(-0.5 * wide * wide) * _INVERSE_SQRT_2PI
    return tf.cast(wide * cdf, x.dtype), cdf + wide * pdf


@tf.function(jit_compile=True, autograph=False)
def _times_slope(upstream, slope):
    """The gradient of GELU's input: the upstream gradient times the slope, rounded once."""
    return tf.cast(tf.cast(upstream, tf.float32) * slope, upstream.dtype)


@tf.custom_gradient
def _compiled_exact(x):
    value, slope = _exact_value_and_slope(x)
    return value, lambda upstream: _times_slope(upstream, slope)


@keras.saving.register_keras_serializable(package="tfdist")
def gelu_exact(x):
    """The exact (erf) GELU, `x * Phi(x)`; for bfloat16 `x`, compiled with XLA on its own.

    Example:

    >>> float(gelu_exact(tf.constant(1.0)))  # 1 * Phi(1)
    0.8413447141647339
    >>> gelu_exact(tf.ones([2, 3], tf.bfloat16)).dtype  # the compiled loop
    tf.bfloat16
    """
    x = tf.convert_to_tensor(x)
    if x.dtype == tf.bfloat16:
        return _compiled_exact(x)
    return _gelu(x, False)


@keras.saving.register_keras_serializable(package="tfdist")
def gelu_tanh(x):
    """GELU with the tanh approximation (Hendrycks & Gimpel 2016), as GPT-2 uses.

    Within 1e-3 of the exact (erf) form. It was the cheaper form while both
    ran as TensorFlow ops (12.6 vs 17.0 ms for one forward and backward over
    a [32, 128, 1024] bfloat16 tensor on a 2-core AMD EPYC); since
    `gelu_exact` is compiled in bfloat16, the exact form is the faster one
    there (14.5 vs 23.9 ms on an AMX Xeon). In float32 both run as
    TensorFlow ops and this one stays a little cheaper (15.6 vs 16.4 ms on
    that Xeon). Use it to match a model trained with it.

    Example:

    >>> float(gelu_tanh(tf.constant(1.0)))  # exact: 0.8413
    0.8411920070648193
    """
    return _gelu(x, True)


GELU_FORMS = {"exact": gelu_exact, "tanh": gelu_tanh}
"""The feed-forward activation of each `gelu=` value of tfdist's Transformer blocks."""
