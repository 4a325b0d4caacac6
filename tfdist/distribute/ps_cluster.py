"""Parameter-server clusters: the chief's strategy, and the tasks that serve it.

In parameter-server training (TensorFlow's `ParameterServerStrategy` with a
`ClusterCoordinator`) only the **chief** runs the training program: it
creates the variables on the `ps` tasks and schedules steps on the `worker`
tasks. Workers and parameter servers run no program of their own; they start
a TensorFlow server from TF_CONFIG and serve until they are stopped. So one
command runs on every task (as with the other strategies):

    chief    create_parameter_server_strategy(...) -> train
    worker   serve_task(...)  (never returns)
    ps       serve_task(...)  (never returns)

Start-up is bounded: TensorFlow's strategy waits for every task forever when
one never comes, so the chief first waits, with the start-up deadline, until
each worker and ps task accepts connections, and names the ones that never
did (`StrategyStartupError`).

Variables are placed whole, round-robin over the ps tasks (TensorFlow's
default). TensorFlow's `variable_partitioner` (which turns one variable into a
`ShardedVariable`) does not work with Keras 3 layers: taking a gradient of a
sharded Keras variable fails (`'ShardedVariable' object has no attribute
'handle'`) and Keras's optimizer would keep its slots unsharded. A large
embedding is split instead by `tfdist.models.layers.ShardedEmbedding`, one
ordinary variable per shard, so each ps task holds a slice of the table and
its optimizer slots.
"""

import logging
import signal
import socket
import time

from tfdist.distribute.tf_config import ClusterConfig, StrategyStartupError

logger = logging.getLogger("tfdist")

SERVING_TASK_TYPES = ("worker", "ps")
"""Task types that only serve in parameter-server training."""

_PROBE_INTERVAL = 0.25


def check_parameter_server_cluster(config, source="TF_CONFIG"):
    """Checks that a cluster can run parameter-server training.

    Args:
        config: a `tfdist.distribute.tf_config.ClusterConfig` (None: no cluster).
        source: where the cluster came from, for messages.

    Raises:
        ValueError: no cluster, no chief, no worker or no ps task, or this
            process is an evaluator; the message says what to change.

    Example:

    >>> check_parameter_server_cluster(parse_tf_config({"cluster": {
    ...     "chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]},
    ...     "task": {"type": "chief", "index": 0}}))
    """
    if config is None:
        raise ValueError(
            f"parameter_server needs a cluster with a chief, workers and ps tasks, but "
            f"{source} names none. On one machine: `python -m tfdist.launch --workers N --ps M "
            "-- <command>`; on Kubernetes, a TFJob with Chief, Worker and PS replicas.")
    missing = [kind for kind in ("chief", "worker", "ps") if not config.cluster.get(kind)]
    if missing:
        raise ValueError(
            f"parameter_server needs 'chief', 'worker' and 'ps' tasks, but {source} has no "
            f"{' and no '.join(repr(kind) for kind in missing)} task (it has "
            f"{', '.join(f'{len(v)} {k}' for k, v in config.cluster.items())}). The chief "
            "coordinates, workers compute, ps tasks hold the variables.")
    if config.task_type == "evaluator":
        raise ValueError(
            "This process is the 'evaluator' task: under parameter_server the chief evaluates "
            "the model itself at the end of every epoch; drop the evaluator from TF_CONFIG.")


def wait_for_tasks(config, timeout, clock=time.monotonic, connect=None):
    """Waits until every worker and ps task of `config` accepts TCP connections.

    Args:
        config: the chief's `ClusterConfig`.
        timeout: seconds to wait in all.
        clock, connect: for tests: the clock, and `connect(host, port)`
            returning True when the address accepts a connection.

    Returns:
        The seconds waited.

    Raises:
        StrategyStartupError: some tasks never answered; they are named.

    Example:

    >>> wait_for_tasks(config, timeout=300)
    1.25
    """
    connect = connect or _accepts_connections
    started = clock()
    pending = [(kind, index, address) for kind in SERVING_TASK_TYPES
               for index, address in enumerate(config.cluster.get(kind, ()))]
    while True:
        pending = [task for task in pending if not connect(*_host_port(task[2]))]
        waited = clock() - started
        if not pending:
            return waited
        if waited >= timeout:
            names = ", ".join(f"{kind} {index} at {address}" for kind, index, address in pending)
            raise StrategyStartupError(
                f"parameter_server: the chief waited {timeout:g} s for every worker and ps task "
                f"to accept connections, but {names} never did. Start them with the same "
                "command (they serve until stopped), check that the addresses in TF_CONFIG are "
                "reachable from here, or raise the deadline (startup_timeout=, "
                "TFDIST_STARTUP_TIMEOUT).")
        time.sleep(_PROBE_INTERVAL)


def create_parameter_server_strategy(config, resolver, startup_timeout):
    """The chief's `tf.distribute.ParameterServerStrategy`, after its tasks answer.

    Args:
        config: the validated `ClusterConfig` (this process must be the chief).
        resolver: the cluster resolver to give TensorFlow (None: TF_CONFIG's).
        startup_timeout: seconds to wait for the worker and ps tasks.

    Returns:
        `(strategy, note)`: the strategy and a one-line description.

    Raises:
        ValueError: this process is not the chief (workers and ps tasks
            serve: `serve_task`).
        StrategyStartupError: a task did not answer in time.

    Example:

    >>> strategy, note = create_parameter_server_strategy(config, None, 300)
    >>> note
    '2 workers, 1 ps task(s) from TF_CONFIG; this chief coordinates'
    """
    import tensorflow as tf

    check_parameter_server_cluster(config)
    if config.task_type != "chief":
        raise ValueError(
            f"This process is {config.task_type} {config.task_index}: under parameter_server "
            "only the chief creates the strategy and trains; worker and ps tasks serve "
            "(tfdist.distribute.ps_cluster.serve_task; the recipes do this by themselves).")
    waited = wait_for_tasks(config, startup_timeout)
    logger.info("parameter_server: every worker and ps task answered after %.1f s", waited)
    resolver = resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    place_variables_by_size(strategy)
    workers, ps = len(config.cluster["worker"]), len(config.cluster["ps"])
    return strategy, f"{workers} worker(s), {ps} ps task(s); this chief coordinates"


def place_variables_by_size(strategy):
    """Makes `strategy` put each new variable on the ps task holding the fewest bytes.

    TensorFlow places variables round-robin by count, which with 2 ps tasks
    puts every Dense kernel on one task and every bias on the other; placing
    by size keeps the tasks' memory and traffic even. Variables whose size
    is unknown at creation fall back to the next task in turn.

    Args:
        strategy: a `tf.distribute.ParameterServerStrategy` (before any
            variable is created).

    Example:

    >>> place_variables_by_size(strategy)
    >>> with strategy.scope():
    ...     model = build_model()  # the ps tasks hold about equal shares
    """
    import numpy as np
    import tensorflow as tf
    # pylint: disable=import-outside-toplevel
    from tfdist.seam import (parameter_server_count, set_parameter_server_placement,
                             without_colocation)

    held = [0] * parameter_server_count(strategy)
    turn = [0]

    def create(next_creator, **kwargs):
        initial = kwargs.get("initial_value")
        if callable(initial) and kwargs.get("shape") is None:
            # Keras passes its initializer as a function: compute the value
            # here (on the chief) to know its size; it is sent to the ps task.
            kwargs["initial_value"] = tf.convert_to_tensor(initial(),
                                                           dtype=kwargs.get("dtype"))
        size = _bytes_of(kwargs, np, tf)
        if size is None:
            task = turn[0] % len(held)
            turn[0] += 1
        else:
            task = min(range(len(held)), key=held.__getitem__)
        held[task] += size or 0
        # As TensorFlow's own placement: no colocation, the ps task's CPU.
        with without_colocation(), \
                tf.device(f"/job:ps/task:{task}/device:CPU:0"):
            return next_creator(**kwargs)

    set_parameter_server_placement(strategy, create)


def _bytes_of(kwargs, np, tf):
    initial = kwargs.get("initial_value")
    shape = kwargs.get("shape")
    if shape is None and initial is not None and not callable(initial):
        shape = getattr(initial, "shape", None)
    dtype = kwargs.get("dtype") or getattr(initial, "dtype", None)
    if shape is None or dtype is None or None in tuple(tf.TensorShape(shape)):
        return None
    return int(np.prod(tuple(tf.TensorShape(shape)), dtype=np.int64)) * tf.as_dtype(dtype).size


DEFAULT_STOP_WAIT = 60.0
STOP_WAIT_ENV = "TFDIST_SERVE_STOP_WAIT"


def serve_task(config, on_ready=None, stop_wait=None):
    """Runs this worker or ps task's TensorFlow server until the process is stopped.

    On SIGTERM or SIGINT the task keeps serving while the chief still runs
    (a preempted job's chief backs up the variables held here before it
    exits) and exits with status 0 once the chief's address stops answering,
    or after `stop_wait` seconds at most.

    Args:
        config: this task's `ClusterConfig` (a worker or ps task).
        on_ready: called once the server listens (e.g. to write the ready file).
        stop_wait: longest wait for the chief after a stop signal, in seconds
            (default: env TFDIST_SERVE_STOP_WAIT, else 60).

    Raises:
        ValueError: this process is not a worker or ps task.
        tfdist.distribute.ports.PortInUseError: its port is taken by another process.

    Example:

    >>> serve_task(parse_tf_config())  # in a ps task: serves until stopped
    """
    import os
    import threading

    import tensorflow as tf

    from tfdist.distribute.ports import check_port_free

    if config.task_type not in SERVING_TASK_TYPES:
        raise ValueError(f"serve_task is for worker and ps tasks, not {config.task_type!r}.")
    if stop_wait is None:
        stop_wait = float(os.environ.get(STOP_WAIT_ENV, DEFAULT_STOP_WAIT))
    who = f"{config.task_type} {config.task_index} at {config.own_address}"
    check_port_free(int(config.own_address.rpartition(":")[2]), who=f"{who} (TF_CONFIG)")
    spec = tf.train.ClusterSpec({kind: list(addresses)
                                 for kind, addresses in config.cluster.items()})
    tf.distribute.Server(spec, job_name=config.task_type, task_index=config.task_index,
                         protocol="grpc", start=True)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stopping.set())
    logger.info("parameter_server: %s serving the chief (stops with SIGTERM)", who)
    if on_ready is not None:
        on_ready()
    # The server runs in TensorFlow's threads; waiting in Python (not in
    # `server.join()`, a C++ call) lets the signal handlers run.
    while not stopping.wait(3600):
        pass
    chief = _host_port(config.cluster["chief"][0]) if config.cluster.get("chief") else None
    deadline = time.monotonic() + stop_wait
    while chief and time.monotonic() < deadline and _accepts_connections(*chief):
        time.sleep(_PROBE_INTERVAL)
    os._exit(0)  # pylint: disable=protected-access  # TF's server threads never end


def is_serving_task(config, strategy_name):
    """Whether this process only serves: a worker or ps task under parameter_server.

    Args:
        config: the process's `ClusterConfig`, or None.
        strategy_name: the requested strategy key ("auto" counts when the
            cluster has ps tasks).

    Example:

    >>> is_serving_task(parse_tf_config(), "parameter_server")
    True
    """
    if not isinstance(config, ClusterConfig) or config.task_type not in SERVING_TASK_TYPES:
        return False
    ps_cluster = bool(config.cluster.get("ps"))
    return strategy_name == "parameter_server" or (strategy_name == "auto" and ps_cluster)


def _host_port(address):
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _accepts_connections(host, port):
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False
