"""Per-replica float32 buffers for gradient accumulation.

Each replica adds its own (not yet all-reduced) gradient of every micro-batch
into its own copy of the buffers; only the optimizer step all-reduces, once per
K micro-batches. The buffers are `ON_READ` variables: in replica context every
replica reads and writes its local copy without communication.
"""

import tensorflow as tf


class GradientAccumulator:
    """Float32 sums of gradients and of loss statistics, one copy per replica.

    Create it inside `strategy.scope()` and use `add`, `read` and `reset` in
    replica context (inside `strategy.run`).

    Args:
        variables: the trainable variables (Keras or TF variables); one
            float32 buffer of the same shape is made for each.
        stats_size: length of the float32 statistics vector accumulated next
            to the gradients (loss numerator, count, ...).
        on_variable_devices: create each buffer on its variable's device
            (tensor-parallel shards each on their own device); otherwise
            where the strategy puts it.

    Example:

    >>> with strategy.scope():
    ...     acc = GradientAccumulator(model.trainable_variables, stats_size=4)
    >>> # in replica context:
    >>> acc.add(grads, stats); grads, stats = acc.read(); acc.reset()
    """

    def __init__(self, variables, stats_size, on_variable_devices=False):
        def buffer(shape, name):
            return tf.Variable(
                tf.zeros(shape, tf.float32), trainable=False, name=name,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM)

        def placed(variable):
            # A tensor-parallel shard's buffer beside the shard, not on the first device.
            device = getattr(variable, "value", variable).device
            return tf.device(device if on_variable_devices else None)

        self.gradients = []
        for i, variable in enumerate(variables):
            with placed(variable):
                self.gradients.append(buffer(variable.shape, f"accumulated_{i}"))
        self.stats = buffer((stats_size,), "accumulated_stats")

    def add(self, grads, stats):
        """Adds one micro-batch's gradients and statistics to this replica's sums.

        Args:
            grads: list of gradients (dense or `tf.IndexedSlices`), matching
                the variables; None entries are skipped.
            stats: float32 vector of length `stats_size`.

        Example:

        >>> acc.add(grads, tf.stack([numerator, count, 0.0, examples]))
        """
        for buf, grad in zip(self.gradients, grads):
            if grad is None:
                continue
            # ON_READ variables have no scatter_add: IndexedSlices become dense.
            buf.assign_add(tf.cast(tf.convert_to_tensor(grad), tf.float32))
        self.stats.assign_add(tf.cast(stats, tf.float32))

    def read(self):
        """Returns `(grads, stats)`: this replica's current sums as tensors.

        Example:

        >>> grads, stats = acc.read()
        """
        return [buf.read_value() for buf in self.gradients], self.stats.read_value()

    def reset(self):
        """Sets this replica's sums back to zero.

        Example:

        >>> acc.reset()
        """
        for buf in self.gradients + [self.stats]:
            buf.assign(tf.zeros_like(buf))
