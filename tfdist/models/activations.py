"""The feed-forward GELUs of tfdist's Transformers; the exact one compiled with XLA on
its own in bfloat16.

GELU is a chain of element-wise ops (a multiply, `Erfc` or `Tanh`, another
multiply) whose gradient adds `Square`, `Exp` and more multiplies. Run as
TensorFlow ops, each is a full pass over the `[batch, seq, d_ff]`
activations, and in bfloat16 each converts every element on its own: in a
bfloat16 training step of the `small` Transformer on an AMX CPU these
passes took 17% of the op time. Compiled by XLA (`jit_compile=True`) the
forward is one fused loop and so is the backward, with the rest of the step
left to TensorFlow's kernels (whose bfloat16 matmuls are the fast ones).

`gelu_exact` is the same GELU as `keras.activations.gelu`; the compiled
loop rounds once where Keras's ops round after each, and stays as close to
the true GELU as Keras's (tested). Inside a step that is XLA-compiled as a
whole it is simply part of it. Only bfloat16 inputs take the compiled
loop: in float32 TensorFlow's own kernels are vectorised, the whole step
gained only 1.03x, and each new shape costs an XLA compilation (in the test
suite, full of small models called on new shapes, about 2 minutes). The
tanh form is left to TensorFlow's kernels: XLA's CPU `tanh` made it slower
compiled (29.5 vs 23.9 ms for one forward and backward over a [32, 128,
1024] bfloat16 tensor on an AMX Xeon, where the compiled exact form took
14.5 ms).

Example:

    layer = keras.layers.Dense(1024, activation=gelu_exact)   # or gelu_tanh
"""

import keras
import tensorflow as tf


def _gelu(x, approximate):
    return keras.activations.gelu(x, approximate=approximate)


_compiled_exact = tf.function(lambda x: _gelu(x, False), jit_compile=True, autograph=False)


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
