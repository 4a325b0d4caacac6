"""Which process of a distributed job is the chief (the one that writes files).

The rule lives in `tfdist.distribute.introspection.task_info`; callbacks find the job's
strategy through their model, since they run outside `strategy.scope()`.
"""

from tfdist.distribute.introspection import num_workers, task_info
from tfdist.distribute.collectives import is_chief

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
