"""What a strategy is: replicas, workers, this worker's place, devices and why.

`describe_strategy(strategy)` gives a `StrategyInfo` for logs and start-up
banners; `task_info`, `num_workers`, `is_multi_worker` and
`is_parameter_server` answer the questions the training loop and the
callbacks ask. Strategies made by `tfdist.distribute.strategy_factory` are
remembered (`remember_creation`) with the name asked for and auto's reason.

    from tfdist.distribute.introspection import describe_strategy
    info = describe_strategy(strategy)
    print(info.num_replicas, info.num_workers, info.is_chief)
"""

import dataclasses
import typing
import weakref

import tensorflow as tf

from tfdist.distribute.tf_config import TRAINING_TASK_TYPES, config_from_resolver, parse_tf_config
from tfdist.distribute.devices import gpu_count


@dataclasses.dataclass(frozen=True)
class StrategyInfo:
    """What a strategy is, for logs and start-up banners.

    Args:
        name: one of `STRATEGY_NAMES` except "auto" (or the class name of a
            strategy tfdist does not know).
        num_replicas: replicas in sync across all workers.
        num_workers: workers (chief + worker tasks); 1 on one machine.
        worker_index: this worker's index, 0..num_workers-1 (chief first).
        is_chief: True on the worker that writes checkpoints and logs.
        devices: this worker's devices, as TensorFlow names them.
        all_reduce: the implementation asked for, or None for TF's choice.
        note: why this strategy and these devices (auto's reason, hints).

    Example:

    >>> info = describe_strategy(create_strategy("one_device"))
    >>> info.name, info.num_replicas, info.is_chief
    ('one_device', 1, True)
    """

    name: str
    num_replicas: int
    num_workers: int
    worker_index: int
    is_chief: bool
    devices: tuple
    all_reduce: typing.Optional[str]
    note: str


# What create_strategy knew when it made a strategy: strategy -> (name, all_reduce, note).
_CREATED = weakref.WeakKeyDictionary()


def remember_creation(strategy, name, all_reduce, note):
    """Records what `create_strategy` knew when it made `strategy`, for `describe_strategy`.

    Args:
        strategy: the strategy made (held weakly: forgotten with it).
        name: the strategy name picked ("auto" resolved).
        all_reduce: the all-reduce implementation asked for, or None.
        note: why this strategy and these devices.

    Example:

    >>> strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    >>> remember_creation(strategy, "one_device", None, "one device: /cpu:0")
    >>> describe_strategy(strategy).note
    'one device: /cpu:0'
    """
    _CREATED[strategy] = (name, all_reduce, note)


def describe_strategy(strategy):
    """Describes a strategy: replicas, workers, this worker, devices and why.

    Args:
        strategy: any `tf.distribute.Strategy` (richest for those made by
            `create_strategy`, which also remembers auto's reason).

    Returns:
        A `StrategyInfo`.

    Example:

    >>> info = describe_strategy(create_strategy("mirrored", devices=2))
    >>> info.num_replicas, info.num_workers, len(info.devices)
    (2, 1, 2)
    """
    name, all_reduce, note = _CREATED.get(strategy, (None, None, ""))
    num_workers, worker_index, chief = _worker_position(strategy)
    return StrategyInfo(name=name or _name_of(strategy),
                        num_replicas=int(strategy.num_replicas_in_sync),
                        num_workers=num_workers, worker_index=worker_index, is_chief=chief,
                        devices=_devices_of(strategy), all_reduce=all_reduce, note=note)


def task_info(strategy=None):
    """Returns `(task_type, task_id, is_chief)` for this process.

    The single place tfdist decides who the chief is (the one process that
    writes logs, checkpoints and reports). The answer comes from, in order:

    1. `strategy` (or the strategy whose scope is active) when it has a
       cluster resolver with a task (`MultiWorkerMirroredStrategy`, with a
       TF_CONFIG, SLURM or Kubernetes resolver): the resolver gives the task
       and `strategy.extended.should_checkpoint` says whether it is the chief.
    2. A `OneDeviceStrategy` or `MirroredStrategy` trains on this machine
       alone, hence is the chief, whatever a leftover `TF_CONFIG` says.
    3. Otherwise the validated `TF_CONFIG` (`tfdist.distribute.tf_config.parse_tf_config`)
       with TensorFlow's rule: the `chief` task; without one, worker 0; an
       `evaluator` is the chief of its own evaluation.
    4. Without `TF_CONFIG` the process is alone, hence the chief.

    Args:
        strategy: a `tf.distribute.Strategy`, or None for the current one.

    Returns:
        `(task_type, task_id, is_chief)`; `(None, 0, True)` for a lone process.

    Raises:
        TFConfigError: `TF_CONFIG` is set but malformed.

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
    if isinstance(strategy, (tf.distribute.OneDeviceStrategy, tf.distribute.MirroredStrategy)):
        return None, 0, True  # single-machine strategies never join a cluster
    config = parse_tf_config()
    if config is None:
        return None, 0, True
    return config.task_type, config.task_index, config.is_chief or config.task_type == "evaluator"


def num_workers(strategy=None):
    """How many training processes (chief + worker tasks) share `strategy`.

    Counted from the strategy's cluster resolver, so only a multi-worker
    strategy (`MultiWorkerMirroredStrategy` with TF_CONFIG, SLURM, ...) can
    give more than 1. Under `ParameterServerStrategy` only the chief runs
    the training program (workers run what it schedules): 1. `MirroredStrategy`, `OneDeviceStrategy` and the
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
    if resolver is None or is_parameter_server(strategy):
        return 1  # under parameter_server only the chief runs the program
    spec = resolver.cluster_spec().as_dict()
    return max(1, sum(len(spec.get(kind, ())) for kind in TRAINING_TASK_TYPES))


def is_multi_worker(strategy):
    """Whether `strategy` spans several worker processes (`num_workers` > 1).

    Example:

    >>> is_multi_worker(create_strategy("mirrored", devices=2))
    False
    """
    return num_workers(strategy) > 1


def is_parameter_server(strategy):
    """Whether `strategy` is TensorFlow's `ParameterServerStrategy` (asynchronous
    training driven by the chief; see `tfdist.distribute.ps_cluster`).

    Example:

    >>> is_parameter_server(create_strategy("mirrored", devices=2))
    False
    """
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


# ---------------------------------------------------------------- description

def _name_of(strategy):
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker_mirrored"
    if is_parameter_server(strategy):
        return "parameter_server"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return "one_device"
    if type(strategy).__name__ == "_DefaultDistributionStrategy":
        return "default"
    return type(strategy).__name__


def _devices_of(strategy):
    try:
        return tuple(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy has no device list
        return ("/device:GPU:0",) if gpu_count() else ("/device:CPU:0",)


def _worker_position(strategy):
    """(num_workers, worker_index, is_chief) of this process."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or resolver is None:
        return 1, 0, True
    config = config_from_resolver(resolver)
    if config is None or config.worker_index is None:
        return 1, 0, True
    return config.num_workers, config.worker_index, config.is_chief
