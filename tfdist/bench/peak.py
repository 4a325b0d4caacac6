"""The peak FLOP/s reference for MFU: a large matmul, measured in this run.

Datasheet peaks say little on a shared CPU; what a large dense matmul reaches
here, in the precision of the run and at the same moment, is the honest
yardstick for how much of the hardware a training step uses.
"""

import time

from tfdist.bench.figures import flops_per_sec, matmul_flops
from tfdist.runtime.argtypes import check_int_at_least

DTYPES = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16",
          "bfloat16": "bfloat16", "float16": "float16"}
"""Precision policy (or dtype) name -> the dtype the peak matmul runs in."""

DEFAULT_SIZE = 2048
QUICK_SIZE = 512
"""Side of the peak matmuls of `tfdist bench --quick` runs (for tests: well
under a second each, where 2048 takes over a second)."""


def compute_dtype(precision):
    """The matmul dtype for a precision policy or dtype name.

    Args:
        precision: "float32", "mixed_bfloat16", "mixed_float16" (or a dtype
            name "bfloat16", "float16").

    Raises:
        ValueError: an unknown name (the allowed ones are listed).

    Example:

    >>> compute_dtype("mixed_bfloat16")
    'bfloat16'
    """
    if precision not in DTYPES:
        raise ValueError(f"Unknown precision {precision!r} for the matmul peak; choose one of "
                         f"{', '.join(DTYPES)}.")
    return DTYPES[precision]


def measure_matmul_peak(precision="float32", size=DEFAULT_SIZE, repeats=5, min_seconds=0.2):
    """Measures the FLOP/s of a `size x size` matmul in the run's precision.

    The matmul runs on TensorFlow's default device with all its threads (the
    whole CPU, or the first GPU), in a `tf.function`; the first call
    (tracing) is left out. Each of `repeats` trials times enough chained
    matmuls to last at least `min_seconds`; the best trial is the peak.

    Args:
        precision: a precision policy or dtype name (see `compute_dtype`).
        size: the matrix side, an int >= 1 (2048 by default).
        repeats: timed trials, >= 1.
        min_seconds: minimum length of one trial, > 0.

    Returns:
        A dict: `precision`, `dtype`, `size`, `flops_per_sec` (the best
        trial), `trials` (every trial's FLOP/s).

    Example:

    >>> peak = measure_matmul_peak("float32", size=512, repeats=2)
    >>> peak["flops_per_sec"] > 0
    True
    """
    import tensorflow as tf

    dtype = compute_dtype(precision)
    check_int_at_least("repeats", repeats, 1)
    flops_one = matmul_flops(size)
    a = tf.random.stateless_uniform((size, size), seed=(1, 2), dtype=tf.float32)
    b = tf.random.stateless_uniform((size, size), seed=(3, 4), dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(b, dtype)

    @tf.function(autograph=False)
    def chain(x, y, count):
        def body(i, acc):
            # Depend on the previous product so no matmul can be skipped,
            # scaled to stay finite in half precision.
            return i + 1, tf.matmul(x + acc * tf.cast(0.0, x.dtype), y)
        _, out = tf.while_loop(lambda i, acc: i < count, body,
                               [tf.constant(0), tf.zeros_like(x)])
        return out[0, 0]

    chain(a, b, tf.constant(1)).numpy()
    start = time.perf_counter()
    chain(a, b, tf.constant(1)).numpy()
    single = max(time.perf_counter() - start, 1e-6)
    count = max(1, int(min_seconds / single + 0.999))
    trials = []
    for _ in range(repeats):
        start = time.perf_counter()
        chain(a, b, tf.constant(count)).numpy()
        trials.append(flops_per_sec(flops_one * count, time.perf_counter() - start))
    return {"precision": precision, "dtype": dtype, "size": size,
            "flops_per_sec": max(trials), "trials": trials}
