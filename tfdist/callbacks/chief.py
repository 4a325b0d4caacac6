"""Which process of a distributed job is the chief (the one that writes files)."""

import os

import tensorflow as tf


def task_info(strategy=None):
    """Returns `(task_type, task_id, is_chief)` for this process.

    The answer comes from, in order:

    1. `strategy` (or the strategy whose scope is active), when it has a
       cluster resolver with a task (`MultiWorkerMirroredStrategy`, also
       with a SLURM or Kubernetes resolver): the resolver gives the task and
       `strategy.extended.should_checkpoint` says whether it is the chief.
    2. Otherwise (single-worker strategies such as `MirroredStrategy`, the
       default strategy, or no strategy yet) the `TF_CONFIG` environment
       variable, with TensorFlow's rule:
       the `"chief"` task is the chief; without a `"chief"` task, worker 0 is;
       an `"evaluator"` is the chief of its own evaluation; `"ps"` and other
       workers are not.
    3. Without `TF_CONFIG` (or without a task in it) the process is alone,
       hence the chief.

    Args:
        strategy: a `tf.distribute.Strategy`, or None for the strategy in
            scope (outside any scope: `TF_CONFIG` decides).

    Returns:
        `(task_type, task_id, is_chief)`; `task_type` is None and `task_id` 0
        for a single process.

    Raises:
        ValueError: `TF_CONFIG` is not valid JSON or is malformed.

    Example:

    >>> task_info()  # a single process without TF_CONFIG
    (None, 0, True)
    """
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is not None and resolver.task_type is not None:
        return (resolver.task_type, int(resolver.task_id or 0),
                bool(strategy.extended.should_checkpoint))
    return _task_from_tf_config()


def is_chief(strategy=None):
    """True on the one process of a job that should write logs and files.

    See `task_info` for how the answer is found: a multi-worker strategy's
    cluster resolver, else `TF_CONFIG`; a process without either (a
    single-machine run, with or without `MirroredStrategy`) is the chief.

    Args:
        strategy: a `tf.distribute.Strategy`, or None for the strategy in
            scope (outside any scope: `TF_CONFIG` decides).

    Returns:
        A bool.

    Example:

    >>> if is_chief(strategy):
    ...     model.save("final.keras")
    """
    return task_info(strategy)[2]


def model_strategy(model):
    """The `tf.distribute.Strategy` a Keras model was created under.

    Callbacks run outside `strategy.scope()`, so they find the job's strategy
    through the model (Keras 3 captures it when the model is created). A
    model created outside any scope gives the default strategy; None gives
    None.

    Args:
        model: a `keras.Model`, or None.

    Example:

    >>> with strategy.scope():
    ...     model = keras.Sequential([keras.layers.Dense(1)])
    >>> model_strategy(model) is strategy
    True
    """
    return getattr(model, "distribute_strategy", None) if model is not None else None


def _task_from_tf_config():
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        return None, 0, True
    try:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        task_type, task_id = resolver.task_type, resolver.task_id
        cluster = resolver.cluster_spec().as_dict()
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(
            'TF_CONFIG must be JSON like {"cluster": {"worker": ["host:port", ...]}, '
            f'"task": {{"type": "worker", "index": 0}}}}; got {raw[:200]!r} ({error}).'
        ) from error
    if task_type is None:
        return None, 0, True
    task_id = int(task_id or 0)
    if task_type in ("chief", "evaluator"):
        return task_type, task_id, True
    return task_type, task_id, task_type == "worker" and task_id == 0 and "chief" not in cluster
