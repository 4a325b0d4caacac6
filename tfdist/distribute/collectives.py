"""Cross-worker decisions: who is the chief, and what every worker agrees on.

Every decision several workers must take alike goes through this module, so
there is one place to read how tfdist keeps workers in step:

- `is_chief`: the one process that writes logs, checkpoints and reports
  (the rule is `tfdist.distribute.introspection.task_info`);
- `gather`: every replica's integers, on every worker (an all-gather);
- `agree`: the same, raising when the workers differ (a restored backup, a
  backup number: the sign of a backup folder each machine sees alone);
- `broadcast`: the chief's number on every worker (replica 0 is the chief's);
- `agreed_seed`: the chief's shuffle seed, so every worker shuffles alike;
- `barrier`: returns once every replica got there (the start-up
  connectivity check is one).

Each is a collective: every worker must call it, in the same order, or the
others wait (up to the strategy's collective timeout). Under one worker they
still run across the local replicas and give the obvious answer.

    from tfdist.distribute.collectives import agree, is_chief
    agree(strategy, [epoch], lambda table: f"workers restored epochs {sorted(set(table[:, 0]))}")
    if is_chief(strategy):
        print("written once")

Two agreements use TensorFlow's coordination service instead of a
collective, because they happen outside any step: the stop step after
SIGTERM (`tfdist.callbacks.preemption`) and the barrier at exit
(`tfdist.seam.wait_for_peers_at_exit`).
"""

import weakref

import numpy as np
import tensorflow as tf

from tfdist.distribute.introspection import is_multi_worker, task_info

# strategy -> its compiled all-gather / broadcast (traced once per strategy).
_GATHERS = weakref.WeakKeyDictionary()
_BROADCASTS = weakref.WeakKeyDictionary()


def is_chief(strategy=None):
    """Whether this process is the chief (see `task_info` for the rule).

    Args:
        strategy: a `tf.distribute.Strategy`, or None for the current one.

    Example:

    >>> is_chief(create_strategy("one_device"))
    True
    """
    return task_info(strategy)[2]


def gather(strategy, values):
    """Every replica's `values`, as the rows of a table, on every worker.

    An all-gather across all replicas of `strategy` (every worker must call
    it), hence also a barrier. The compiled collective is kept per strategy.

    Args:
        strategy: the `tf.distribute.Strategy` whose replicas take part.
        values: this worker's integers (a list; the same length everywhere).

    Returns:
        An int64 numpy array of shape `[num_replicas, len(values)]` (each
        worker contributes one row per local replica).

    Example:

    >>> gather(create_strategy("mirrored", devices=2), [3, 7])
    array([[3, 7],
           [3, 7]])
    """
    function = _GATHERS.get(strategy)
    if function is None:
        function = _compiled(strategy, _all_gather_rows)
        _GATHERS[strategy] = function
    return function(tf.constant(values, tf.int64)).numpy()


def agree(strategy, values, disagreement):
    """Checks that every worker has the same `values`; raises otherwise.

    A `gather` (so also a barrier) followed by a comparison of the rows.

    Args:
        strategy: the `tf.distribute.Strategy` whose replicas take part.
        values: this worker's integers (a list; the same length everywhere).
        disagreement: a function of the gathered table (see `gather`) that
            returns the error message: it should name what differs and the
            way out.

    Returns:
        The gathered table (all rows equal).

    Raises:
        ValueError: the rows differ; the message is `disagreement(table)`.

    Example:

    >>> agree(strategy, [epoch], lambda table: f"epochs differ: {table[:, 0]}")
    array([[4],
           [4]])
    """
    table = np.asarray(gather(strategy, values))
    if not (table == table[0]).all():
        raise ValueError(disagreement(table))
    return table


def broadcast(strategy, number):
    """The chief's `number` (replica 0's) on every worker.

    The first replica's value is summed across the cluster with the others
    adding 0, in float64 (exact for integers below 2**53).

    Args:
        strategy: the `tf.distribute.Strategy` whose replicas take part.
        number: this worker's number; only the chief's counts.

    Returns:
        The chief's number, as a float.

    Example:

    >>> broadcast(create_strategy("mirrored", devices=2), 12345)
    12345.0
    """
    function = _BROADCASTS.get(strategy)
    if function is None:
        function = _compiled(strategy, _from_first_replica)
        _BROADCASTS[strategy] = function
    return float(function(tf.constant(float(number), tf.float64)).numpy())


def agreed_seed(strategy, seed):
    """The chief's shuffle `seed` on every worker of a multi-worker `strategy`.

    Under `MultiWorkerMirroredStrategy` every worker builds the array
    pipeline and takes its share of each global batch, so all must shuffle
    alike. On one worker `seed` is returned as it is (no collective runs).

    Args:
        strategy: the trainer's strategy.
        seed: this worker's seed (e.g. `tfdist.training.arrays.shuffle_seed()`).

    Example:

    >>> agreed_seed(create_strategy("mirrored", devices=2), 7)
    7
    """
    if not is_multi_worker(strategy):
        return seed
    return int(np.round(broadcast(strategy, seed)))


def barrier(strategy, timeout_seconds=None):
    """Returns once every replica of `strategy` got here: one all-reduce of 1 per replica.

    Args:
        strategy: the `tf.distribute.Strategy` whose replicas take part.
        timeout_seconds: fail after this many seconds instead of waiting for
            a missing worker (None: the strategy's collective timeout).

    Returns:
        The number of replicas counted (the caller may compare it with
        `strategy.num_replicas_in_sync`).

    Raises:
        tf.errors.OpError: a worker did not arrive within the timeout.

    Example:

    >>> barrier(create_strategy("mirrored", devices=2))
    2.0
    """
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)

    def one():
        return tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.constant(1.0), options=options)

    return float(strategy.experimental_local_results(tf.function(lambda: strategy.run(one))())[0])


def _compiled(strategy, per_replica):
    """A `tf.function` running `per_replica(tensor)` on every replica, giving the
    first local result; it holds `strategy` weakly (the caches' keys)."""
    strategy_ref = weakref.ref(strategy)

    def run(tensor):
        own = strategy_ref()
        return own.experimental_local_results(own.run(per_replica, args=(tensor,)))[0]

    return tf.function(run, autograph=False)


def _all_gather_rows(vector):
    return tf.distribute.get_replica_context().all_gather(vector[None], axis=0)


def _from_first_replica(number):
    context = tf.distribute.get_replica_context()
    mine = tf.where(tf.equal(context.replica_id_in_sync_group, 0), number,
                    tf.constant(0.0, tf.float64))
    return context.all_reduce(tf.distribute.ReduceOp.SUM, mine)
