"""Reading a model's metrics over all replicas and workers, with one all-reduce."""

import keras
import tensorflow as tf


def global_metric_results(model, strategy):
    """`model.get_metrics_result()` over all replicas, with one all-reduce.

    Reading each SyncOnRead metric variable in cross-replica context costs
    one reduction per variable (a collective per variable across workers);
    here all of them are summed in one batch and the results computed from
    the sums with `keras.StatelessScope`. Metrics whose variables do not all
    add up (`aggregation="sum"` floats) are read the usual way. Call it in
    cross-replica context (inside a `tf.function` that runs
    `strategy.run`, or eagerly).

    Args:
        model: a compiled `keras.Model`.
        strategy: the `tf.distribute.Strategy` its variables belong to.

    Returns:
        A dict `{metric name: scalar tensor}`, the same on every worker.

    Example:

    >>> strategy.run(step, args=(batch,))
    >>> global_metric_results(model, strategy)
    {'loss': <tf.Tensor ...>, 'accuracy': <tf.Tensor ...>}
    """
    variables = model.metrics_variables
    summable = all(v.aggregation == "sum" and "float" in str(v.dtype) for v in variables)
    if strategy.num_replicas_in_sync == 1 or not variables or not summable:
        return model.get_metrics_result()

    def replica_results():
        sums = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, [tf.identity(v.value) for v in variables])
        with keras.StatelessScope(state_mapping=list(zip(variables, sums))):
            return model.get_metrics_result()

    results = strategy.run(replica_results)
    return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], results)
