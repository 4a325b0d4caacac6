"""Cross-worker decisions: who is the chief, and what every worker agrees on.

Every decision several workers must take alike goes through this module, so
there is one place to read how tfdist keeps workers in step:

- `is_chief`: the one process that writes logs, checkpoints and reports
  (the rule is `tfdist.distribute.introspection.task_info`).

    from tfdist.distribute.collectives import is_chief
    if is_chief(strategy):
        print("written once")
"""

from tfdist.distribute.introspection import task_info


def is_chief(strategy=None):
    """Whether this process is the chief (see `task_info` for the rule).

    Args:
        strategy: a `tf.distribute.Strategy`, or None for the current one.

    Example:

    >>> is_chief(create_strategy("one_device"))
    True
    """
    return task_info(strategy)[2]
