"""What each replica of a `tf.distribute` strategy received from a distributed dataset.

    from helpers.replicas import replica_batches

    for replica, x, y in replica_batches(strategy, dataset):
        seen[replica] += ids_of(x)
"""


def replica_batches(strategy, dataset):
    """Yields `(replica index, x, y)` for each replica's part of each `(x, y)` batch.

    Example: under a 2-replica MirroredStrategy, a batch of 4 rows yields
    `(0, x[:2], y[:2])` then `(1, x[2:], y[2:])`.
    """
    for inputs, targets in dataset:
        yield from ((replica, x, y) for replica, (x, y) in enumerate(zip(
            strategy.experimental_local_results(inputs),
            strategy.experimental_local_results(targets), strict=True)))
