"""The seam to tf.distribute's internals: the default strategy, the graph's
strategy stack, plain variables, parameter-server placement, worker counts,
collective keys, the local devices of a multi-worker strategy and the reads of
`ON_READ` variables when a checkpoint is saved.

Example:

    from tfdist.seam import default_strategy

    strategy is default_strategy()   # True outside any strategy's scope
"""

import contextlib
import functools


def default_strategy():
    """TensorFlow's default (no-op) strategy object, the one active outside any `strategy.scope()`.

    `tf.distribute.get_strategy()` returns it only outside a scope.

    Private: `tensorflow.python.distribute.distribute_lib._get_default_strategy`.

    Example:

    >>> default_strategy() is tf.distribute.get_strategy()   # outside any scope
    True
    """
    from tensorflow.python.distribute import distribute_lib

    return distribute_lib._get_default_strategy()  # noqa: SLF001 - the seam


@contextlib.contextmanager
def strategy_scopes_hidden():
    """Context in which no `strategy.scope()` is active (the default strategy is) until exit.

    Private: the default graph's `_distribution_strategy_stack` (TensorFlow
    keeps the active scopes there, per thread).

    Example:

    >>> with strategy.scope(), strategy_scopes_hidden():
    ...     tf.distribute.has_strategy()
    False
    """
    from tensorflow.python.framework import ops

    graph = ops.get_default_graph()
    saved = list(graph._distribution_strategy_stack)  # noqa: SLF001 - the seam
    graph._distribution_strategy_stack = []  # noqa: SLF001
    try:
        yield
    finally:
        graph._distribution_strategy_stack = saved  # noqa: SLF001


def create_plain_variable(**kwargs):
    """A plain `ResourceVariable` from `tf.Variable`'s arguments, whatever creator scopes are on.

    Private: `resource_variable_ops.default_variable_creator_v2`.

    Example:

    >>> with strategy.scope():
    ...     v = create_plain_variable(initial_value=1.0)   # not a MirroredVariable
    """
    from tensorflow.python.ops import resource_variable_ops

    return resource_variable_ops.default_variable_creator_v2(None, **kwargs)


def new_resource_variable(**kwargs):
    """A new plain `ResourceVariable` (on the current device) from `tf.Variable`'s arguments.

    Private: `resource_variable_ops.ResourceVariable` (the class itself;
    `tf.Variable` passes through the creator scopes).

    Example:

    >>> with tf.device("/cpu:1"):
    ...     v = new_resource_variable(initial_value=tf.ones([2]), trainable=True)
    """
    from tensorflow.python.ops import resource_variable_ops

    return resource_variable_ops.ResourceVariable(**kwargs)


def is_plain_resource_variable(value):
    """Whether `value` is exactly a plain `ResourceVariable` (not a distributed or wrapped one).

    Private: `resource_variable_ops.ResourceVariable`.

    Example:

    >>> is_plain_resource_variable(new_resource_variable(initial_value=1.0))
    True
    """
    from tensorflow.python.ops import resource_variable_ops

    return type(value) is resource_variable_ops.ResourceVariable


def without_colocation():
    """Context in which ops are placed by their own device, ignoring any colocation in force.

    Private: `tensorflow.python.framework.ops.colocate_with(None, ignore_existing=True)`.

    Example:

    >>> with without_colocation(), tf.device("/job:ps/task:0/device:CPU:0"):
    ...     v = tf.Variable(1.0)
    """
    from tensorflow.python.framework import ops

    return ops.colocate_with(None, ignore_existing=True)


def parameter_server_count(strategy):
    """The number of ps tasks of a `ParameterServerStrategy`.

    Private: `ParameterServerStrategyV2Extended._num_ps`.

    Example:

    >>> parameter_server_count(ps_strategy)
    2
    """
    return strategy.extended._num_ps  # noqa: SLF001 - the seam


def set_parameter_server_placement(strategy, create):
    """Makes a `ParameterServerStrategy` create and place variables with `create(next_creator, **kw)`.

    Replaces TensorFlow's round-robin placement over the ps tasks.

    Private: `ParameterServerStrategyV2Extended._create_variable_round_robin`.

    Example:

    >>> set_parameter_server_placement(strategy, lambda next_creator, **kw: next_creator(**kw))
    """
    strategy.extended._create_variable_round_robin = create  # noqa: SLF001 - the seam


def strategy_worker_count(strategy):
    """The number of workers of a strategy (1 for a single-worker one).

    Private: `extended._num_workers` (multi-worker strategies).

    Example:

    >>> strategy_worker_count(tf.distribute.MirroredStrategy())
    1
    """
    return getattr(strategy.extended, "_num_workers", 1) or 1


def strategy_cluster_resolver(strategy):
    """The cluster resolver a strategy was made with (None when it has none).

    Private fallback: `strategy._cluster_resolver` (ParameterServerStrategy
    keeps it there; others expose `cluster_resolver`).

    Example:

    >>> strategy_cluster_resolver(ps_strategy).cluster_spec().as_dict()["ps"]
    ['localhost:2223']
    """
    return (getattr(strategy, "cluster_resolver", None)
            or getattr(strategy, "_cluster_resolver", None))


def mirrored_strategy_with_key_base(key_base, devices, cross_device_ops):
    """A `tf.distribute.MirroredStrategy` whose collective group/instance keys start at `key_base`.

    TensorFlow reads the base from a class attribute at construction, hence
    a swap for the duration of the call.

    Private: `MirroredStrategy._collective_key_base`.

    Example:

    >>> mirrored_strategy_with_key_base(20_000, ["/cpu:0", "/cpu:1"], None).num_replicas_in_sync
    2
    """
    import tensorflow as tf

    base = tf.distribute.MirroredStrategy._collective_key_base  # noqa: SLF001 - the seam
    tf.distribute.MirroredStrategy._collective_key_base = key_base  # noqa: SLF001
    try:
        return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross_device_ops)
    finally:
        tf.distribute.MirroredStrategy._collective_key_base = base  # noqa: SLF001


def multi_worker_strategy_on_local_devices(resolver, options, device_type, count):
    """A `MultiWorkerMirroredStrategy` with `count` local `device_type` devices per worker.

    TensorFlow's multi-worker path always uses every GPU, or one CPU; only
    that local-device choice is overridden.

    Raises:
        ImportError: this TensorFlow has no `CollectiveAllReduceExtended`.

    Private: `collective_all_reduce_strategy.CollectiveAllReduceExtended` and
    its `_initialize_local_devices`.

    Example:

    >>> strategy = multi_worker_strategy_on_local_devices(resolver, options, "CPU", 2)
    >>> type(strategy).__name__
    'MultiWorkerMirroredStrategy'
    """
    import tensorflow as tf
    from tensorflow.python.distribute.collective_all_reduce_strategy import (
        CollectiveAllReduceExtended)

    class _Extended(CollectiveAllReduceExtended):
        def _initialize_local_devices(self, cluster_resolver, worker_device):
            return (tuple(f"{worker_device}/device:{device_type}:{i}" for i in range(count)),
                    device_type)

    class _Strategy(tf.distribute.MultiWorkerMirroredStrategy):
        def __init__(self):  # pylint: disable=super-init-not-called
            tf.distribute.Strategy.__init__(
                self, _Extended(self, cluster_resolver=resolver, communication_options=options))

    _Strategy.__name__ = _Strategy.__qualname__ = "MultiWorkerMirroredStrategy"
    return _Strategy()


# The attributes TensorFlow's checkpoint code probes on every object and value
# it saves: `_wrapped_name` and `_wrapped_slice_spec` in
# `functional_saver._single_shard_save` (set on DTensor save tensors only),
# `_LEGACY_SAVEABLE_NAME` in `saveable_compat.get_saveable_name` (a class
# attribute of a few legacy trackables, never of a variable).
_SAVER_PROBES = ("_wrapped_name", "_wrapped_slice_spec", "_LEGACY_SAVEABLE_NAME")


def save_on_read_variables_with_one_reduction():
    """Makes a checkpoint save reduce each `ON_READ` variable once, not three times.

    TensorFlow's checkpoint code asks every value it saves whether it
    carries `_wrapped_name` and `_wrapped_slice_spec` (set on DTensor save
    tensors only), and every object whether its class has a
    `_LEGACY_SAVEABLE_NAME`. A distributed variable answers an attribute it
    lacks by reading its value, and an `ON_READ` one (Keras metric totals and
    counts) read in cross-replica context is a reduction over the replicas:
    under `MultiWorkerMirroredStrategy` an eager all-reduce across the workers
    for each question, before the save's own read. Answered here without
    reading (a distributed variable never holds them; one set on it directly
    is still found), each save does one reduction per `ON_READ` variable.
    Idempotent; what is saved does not change.

    Private: `tensorflow.python.distribute.values.DistributedDelegate.__getattr__`
    (the delegation), the probes of `functional_saver._single_shard_save` and
    `saveable_compat.get_saveable_name`.

    Returns:
        True when installed by this call, False when it already was (as
        `install_quiet_device_iterators` and `leave_tfdist_code_unconverted`).

    Example:

    >>> save_on_read_variables_with_one_reduction()   # BackupWriter calls it
    False
    >>> total = variable_storage(metric.variables[0])   # a SyncOnReadVariable
    >>> hasattr(total, "_wrapped_name")                 # answered without an all-reduce
    False
    """
    from tensorflow.python.distribute import values

    delegate = values.DistributedDelegate
    if getattr(delegate.__getattr__, "tfdist_answers_saver_probes", False):
        return False
    delegated = delegate.__getattr__

    @functools.wraps(delegated)  # TensorFlow's stays reachable (`__wrapped__`)
    def __getattr__(self, name):
        if name in _SAVER_PROBES:
            raise AttributeError(name)
        return delegated(self, name)

    __getattr__.tfdist_answers_saver_probes = True
    delegate.__getattr__ = __getattr__
    return True
