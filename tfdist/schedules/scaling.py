"""The linear scaling rule for the learning rate."""

from tfdist.schedules._checks import check_float
from tfdist.schedules._checks import check_int


def scale_learning_rate(base_learning_rate, global_batch_size, reference_batch_size=256):
    """Scales a learning rate linearly with the global batch size.

    The linear scaling rule of Goyal et al. 2017, "Accurate, Large Minibatch
    SGD": when the batch grows by a factor k, multiply the learning rate by k.
    `base_learning_rate` is the rate tuned for `reference_batch_size`
    examples per step; the result is for `global_batch_size` examples per
    step across all replicas and workers. Large scaled rates usually need a
    warmup (see `WarmUp`, `make_schedule(..., warmup_steps=...)`).

    Args:
        base_learning_rate: the rate at the reference batch size, a finite
            number > 0.
        global_batch_size: examples per optimizer step summed over all
            replicas (and accumulation micro-batches), an integer >= 1.
        reference_batch_size: the batch size `base_learning_rate` was tuned
            for, an integer >= 1. Defaults to 256.

    Returns:
        `base_learning_rate * global_batch_size / reference_batch_size`, a float.

    Raises:
        ValueError: an argument is not a number of the allowed kind or range.

    Example:

    >>> scale_learning_rate(0.1, global_batch_size=8192)
    3.2
    >>> scale_learning_rate(0.1, global_batch_size=64, reference_batch_size=256)
    0.025
    """
    owner = "scale_learning_rate"
    base = check_float(owner, "base_learning_rate", base_learning_rate, strict=True)
    global_batch_size = check_int(owner, "global_batch_size", global_batch_size, 1)
    reference_batch_size = check_int(owner, "reference_batch_size", reference_batch_size, 1)
    return base * global_batch_size / reference_batch_size
