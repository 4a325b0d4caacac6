"""What crosses workers when each worker holds one model replica on devices of its own.

The pipeline (`tfdist.training.model_parallel.gpipe`) and the tensor-parallel
steps (`tfdist.training.tensor_parallel.steps`) run a replica's computation
on the worker, outside the strategy, over several devices. Only what must
cross workers goes through `MultiWorkerMirroredStrategy` (one device per
worker): this worker's part of a distributed batch, one all-reduce of a
group of tensors, one all-gather of the predictions.

Example:

    x = this_workers(strategy, distributed_batch)
    grads = sum_across_workers(strategy, grads)
    outputs = gather_across_workers(strategy, outputs)
"""

import tensorflow as tf


def this_workers(strategy, data):
    """This worker's tensors of a (distributed) batch or any structure of per-replica values.

    Example:

    >>> x, y = this_workers(strategy, next(iterator))
    """
    return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], data)


def sum_across_workers(strategy, values):
    """The SUM of the structure `values` over the workers, in one all-reduce.

    Call it in cross-replica context (inside a `tf.function` that is not
    itself in `strategy.run`); returns the same structure of plain tensors.

    Example:

    >>> grads = sum_across_workers(strategy, grads)
    """
    flat = tf.nest.flatten(values)

    def replica(*tensors):
        # Under the replica's device, so that the collective knows where it runs.
        tensors = [tf.identity(tensor) for tensor in tensors]
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                               tensors)

    reduced = strategy.run(replica, args=tuple(flat))
    return tf.nest.pack_sequence_as(values, this_workers(strategy, list(reduced)))


def gather_across_workers(strategy, values):
    """The structure `values` of every worker, concatenated along axis 0 in worker order.

    Example:

    >>> predictions = gather_across_workers(strategy, local_predictions)
    """
    def gather(value):
        context = tf.distribute.get_replica_context()
        return tf.nest.map_structure(lambda t: context.all_gather(tf.identity(t), axis=0), value)

    return this_workers(strategy, strategy.run(gather, args=(values,)))
