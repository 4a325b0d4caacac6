"""Which process of a distributed job is the chief (the one that writes files).

The rule lives in `tfdist.strategy.task_info`; callbacks find the job's
strategy through their model, since they run outside `strategy.scope()`.
"""

import tensorflow as tf

from tfdist.cluster import TRAINING_TASK_TYPES
from tfdist.strategy import is_chief, task_info

__all__ = ["is_chief", "model_strategy", "num_workers", "task_info"]


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


def num_workers(strategy=None):
    """How many training processes (chief + worker tasks) share `strategy`.

    Counted from the strategy's cluster resolver, so only a multi-worker
    strategy (`MultiWorkerMirroredStrategy` with TF_CONFIG, SLURM, ...) can
    give more than 1. `MirroredStrategy`, `OneDeviceStrategy` and the
    default strategy train in one process: 1, whatever `TF_CONFIG` says.

    Args:
        strategy: a `tf.distribute.Strategy`, or None for the current one.

    Example:

    >>> num_workers(tf.distribute.MirroredStrategy())
    1
    >>> num_workers(tf.distribute.MultiWorkerMirroredStrategy())  # 2 workers in TF_CONFIG
    2
    """
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, sum(len(spec.get(kind, ())) for kind in TRAINING_TASK_TYPES))
