"""The strategy factory: a `tf.distribute.Strategy` from a name.

`create_strategy("mirrored", devices=2)` is the one place tfdist turns what a
user asked for into a strategy. It checks the request first (names, devices,
all-reduce implementation, TF_CONFIG) and explains every refusal; it never
falls back silently to one device or one worker.

Multi-worker start-up is bounded: `MultiWorkerMirroredStrategy` waits for its
peers while it is being created (inside TensorFlow, holding the GIL, so a
Python watchdog thread cannot interrupt it) and would wait for a missing peer
for an hour or forever. tfdist therefore configures TensorFlow's coordination
service to register the cluster behind a barrier with the start-up deadline,
then runs one small all-reduce with the remaining time as its collective
timeout. A peer that never comes is a `StrategyStartupError` naming the
addresses waited for. Once the strategy is up, the file named by
`TFDIST_READY_FILE` (set by `tfdist.launch`) is created.
"""

import dataclasses
import itertools
import json
import logging
import os
import re
import tempfile
import time
import types
import typing
import weakref

import tensorflow as tf

from tfdist.distribute.tf_config import (TRAINING_TASK_TYPES, ClusterConfig,  # noqa: F401 (re-exported)
                            StrategyStartupError, parse_tf_config)
from tfdist.distribute.devices import DeviceConfigError, gpu_count, split_cpu_into_logical_devices
from tfdist.distribute.ports import check_port_free
from tfdist.distribute.names import (ALL_REDUCE_NAMES, STRATEGY_NAMES,  # noqa: F401 (re-exported)
                                  UNSUPPORTED_STRATEGIES, check_all_reduce_name,
                                  check_strategy_name)

logger = logging.getLogger("tfdist")

CLUSTER_RESOLVER_NAMES = ("tf_config", "slurm")
"""Names `cluster_resolver` accepts besides a ClusterResolver instance."""

DEFAULT_STARTUP_TIMEOUT = 300.0
STARTUP_TIMEOUT_ENV = "TFDIST_STARTUP_TIMEOUT"
DEVICES_PER_WORKER_ENV = "TFDIST_DEVICES_PER_WORKER"
READY_FILE_ENV = "TFDIST_READY_FILE"


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


@dataclasses.dataclass(frozen=True)
class _Cluster:
    config: object     # ClusterConfig or None (no cluster)
    resolver: object   # tf ClusterResolver or None (TFConfigClusterResolver by default)
    source: str        # "TF_CONFIG", "SlurmClusterResolver", ...


def create_strategy(name="auto", *, devices=None, all_reduce=None, cluster_resolver=None,
                    collective_timeout=None, startup_timeout=None):
    """Creates a `tf.distribute.Strategy` by name.

    Args:
        name: one of `STRATEGY_NAMES` (case and "-" vs "_" do not matter):
            "auto" picks multi_worker_mirrored when TF_CONFIG (or the resolver)
            names several chief/worker tasks, mirrored when several devices are
            asked for or more than one GPU is visible, else one_device;
            "default" is TensorFlow's no-distribution strategy; "one_device",
            "mirrored" and "multi_worker_mirrored" are TensorFlow's strategies.
        devices: None, a device count, or a list of device names.
            mirrored: N uses the first N GPUs, or without GPUs splits the CPU
            into N logical devices (before TensorFlow initialises); None uses
            every GPU, or the logical CPUs that exist. one_device: 1 or a
            one-name list. multi_worker_mirrored: devices per worker (default:
            env TFDIST_DEVICES_PER_WORKER, else every GPU or one CPU).
        all_reduce: None (TensorFlow's choice) or, for mirrored, "nccl",
            "hierarchical_copy", "reduction_to_one_device"; for
            multi_worker_mirrored, "auto", "ring", "nccl".
        cluster_resolver: None or "tf_config" (TF_CONFIG), "slurm"
            (`SlurmClusterResolver`), or a
            `tf.distribute.cluster_resolver.ClusterResolver`. Used by auto and
            multi_worker_mirrored.
        collective_timeout: seconds after which a multi-worker collective
            fails instead of waiting (None: wait forever).
        startup_timeout: seconds multi_worker_mirrored waits for its peers
            (None: env TFDIST_STARTUP_TIMEOUT, else 300).

    Returns:
        The strategy. `describe_strategy` tells what was built and why. When
        env TFDIST_READY_FILE is set, that file has been created.

    Raises:
        ValueError: a bad or unsupported name, devices, all_reduce or resolver
            (`tfdist.distribute.tf_config.TFConfigError` for a bad TF_CONFIG).
        DeviceConfigError: the devices asked for cannot exist in this process.
        StrategyStartupError: multi-worker peers were not reachable in time.
        tfdist.distribute.ports.PortInUseError: another process holds the port of this
            task's own address (checked before waiting for peers; it is named).

    Example:

    >>> strategy = create_strategy("mirrored", devices=2)  # 2 logical CPUs without GPUs
    >>> strategy.num_replicas_in_sync
    2
    """
    key = check_strategy_name(name)
    _check_devices(devices)
    collective_timeout = _check_seconds("collective_timeout", collective_timeout)
    startup_timeout = _startup_timeout(startup_timeout)
    _check_resolver_argument(cluster_resolver)
    notes = []
    cluster = None
    if key == "auto":
        cluster = _resolve_cluster(cluster_resolver)
        key, reason = _choose(devices, cluster)
        logger.info("strategy 'auto' picked %r: %s", key, reason)
        notes.append(f"auto picked {key}: {reason}")
    check_all_reduce_name(key, all_reduce)
    if key == "default":
        strategy, note = _create_default(devices)
    elif key == "one_device":
        strategy, note = _create_one_device(devices)
    elif key == "mirrored":
        strategy, note = _create_mirrored(devices, all_reduce)
    elif key == "parameter_server":
        cluster = cluster or _resolve_cluster(cluster_resolver)
        strategy, note = _create_parameter_server(devices, cluster, startup_timeout)
    else:
        cluster = cluster or _resolve_cluster(cluster_resolver)
        strategy, note = _create_multi_worker(devices, all_reduce, cluster, collective_timeout,
                                              startup_timeout)
    if note:
        notes.append(note)
    _CREATED[strategy] = (key, all_reduce, "; ".join(notes))
    info = describe_strategy(strategy)
    write_ready_file(content={"strategy": info.name, "num_replicas": info.num_replicas,
                              "worker_index": info.worker_index})
    return strategy


def choose_strategy(devices=None, cluster_resolver=None):
    """Returns the strategy name "auto" would pick, and why, without creating it.

    Args:
        devices: as for `create_strategy`.
        cluster_resolver: as for `create_strategy` (None reads TF_CONFIG).

    Returns:
        (name, reason): name is one of "multi_worker_mirrored", "mirrored",
        "one_device"; reason is a sentence for logs.

    Raises:
        TFConfigError: TF_CONFIG is set but malformed.
        ValueError: the cluster has parameter servers (unsupported).

    Example:

    >>> choose_strategy(devices=2)[0]
    'mirrored'
    """
    _check_devices(devices)
    _check_resolver_argument(cluster_resolver)
    return _choose(devices, _resolve_cluster(cluster_resolver))


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


def is_chief(strategy=None):
    """Whether this process is the chief (see `task_info` for the rule).

    Args:
        strategy: a `tf.distribute.Strategy`, or None for the current one.

    Example:

    >>> is_chief(create_strategy("one_device"))
    True
    """
    return task_info(strategy)[2]


def write_ready_file(path=None, content=None):
    """Creates the start-up ready file atomically (temporary file + rename).

    `tfdist.launch` waits for every worker's ready file before its start-up
    deadline; `create_strategy` calls this once the strategy is up.

    Args:
        path: the file to create; None uses env TFDIST_READY_FILE.
        content: a JSON-serialisable dict written into the file (pid is added).

    Returns:
        The path written, or None when there is no path.

    Example:

    >>> write_ready_file("/tmp/worker0.ready", {"strategy": "mirrored"})
    '/tmp/worker0.ready'
    """
    path = path or os.environ.get(READY_FILE_ENV)
    if not path:
        return None
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".tfdist-ready-")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(dict(content or {}, pid=os.getpid()), stream)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return path


# ---------------------------------------------------------------- arguments

def _check_devices(devices):
    if devices is None:
        return
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}.")
        return
    if (isinstance(devices, (list, tuple)) and devices
            and all(isinstance(d, str) and d for d in devices)):
        return
    raise ValueError(f"devices must be None, a device count (int >= 1) or a non-empty list of "
                     f"device names such as ['/gpu:0', '/gpu:1'], got {devices!r}.")


def _check_seconds(label, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{label} must be a positive number of seconds or None, got {value!r}.")
    return float(value)


def _startup_timeout(value):
    if value is not None:
        return _check_seconds("startup_timeout", value)
    raw = os.environ.get(STARTUP_TIMEOUT_ENV)
    if not raw:
        return DEFAULT_STARTUP_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"Environment variable {STARTUP_TIMEOUT_ENV}={raw!r} must be a positive "
                         "number of seconds.")
    return seconds


def _check_resolver_argument(resolver):
    if resolver is None or isinstance(resolver, tf.distribute.cluster_resolver.ClusterResolver):
        return
    if isinstance(resolver, str) and resolver in CLUSTER_RESOLVER_NAMES:
        return
    raise ValueError(f"cluster_resolver must be None, one of {', '.join(map(repr, CLUSTER_RESOLVER_NAMES))}"
                     f" or a tf.distribute.cluster_resolver.ClusterResolver, got {resolver!r}.")


def _devices_per_worker(devices):
    if devices is not None:
        if not isinstance(devices, int):
            raise ValueError(
                f"multi_worker_mirrored takes devices as a count per worker (an int), got "
                f"{devices!r}; every worker uses the same number of local devices.")
        return devices
    raw = os.environ.get(DEVICES_PER_WORKER_ENV)
    if not raw:
        return None
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError(f"Environment variable {DEVICES_PER_WORKER_ENV}={raw!r} must be an "
                         "integer >= 1 (devices per worker).")
    return int(raw)


# ---------------------------------------------------------------- auto

def _resolve_cluster(resolver):
    """Turns the cluster_resolver argument into a _Cluster (validating TF_CONFIG)."""
    if resolver is None or resolver == "tf_config":
        return _Cluster(config=parse_tf_config(), resolver=None, source="TF_CONFIG")
    if resolver == "slurm":
        resolver = _slurm_resolver()
    return _Cluster(config=_config_from_resolver(resolver), resolver=resolver,
                    source=type(resolver).__name__)


SLURM_PORT_BASE_ENV = "TFDIST_SLURM_PORT_BASE"
"""Environment variable: the first port of the SLURM workers (default 8888; task k on a
node listens on base + k)."""


def _slurm_resolver():
    """TensorFlow's `SlurmClusterResolver`, set up for tfdist.

    Its defaults ask `nvidia-smi` how many GPUs a node has (failing on CPU
    nodes) and divide them among the node's tasks (failing when SLURM already
    bound one GPU per task). Here the GPUs a task sees (`CUDA_VISIBLE_DEVICES`)
    decide: with several tasks on a node and GPUs that divide among them,
    each task gets its share, as TensorFlow would do; otherwise (one task per
    node, GPUs already bound by SLURM, a CPU node) nothing is changed. tfdist
    picks the local devices itself (see `_create_multi_worker`).
    """
    tasks_per_node = _max_tasks_per_node(os.environ.get("SLURM_STEP_TASKS_PER_NODE")
                                         or os.environ.get("SLURM_TASKS_PER_NODE") or "1")
    raw_port = os.environ.get(SLURM_PORT_BASE_ENV, "8888")
    if not raw_port.isdigit() or not 1024 <= int(raw_port) <= 65535 - tasks_per_node:
        raise ValueError(f"{SLURM_PORT_BASE_ENV}={raw_port!r} is not a port number from 1024 to "
                         f"{65535 - tasks_per_node}.")
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    share = tasks_per_node > 1 and len(visible) >= tasks_per_node and (
        len(visible) % tasks_per_node == 0)
    gpus_per_task = len(visible) // tasks_per_node if share else 1
    try:
        return tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=int(raw_port), gpus_per_node=gpus_per_task * tasks_per_node,
            gpus_per_task=gpus_per_task, auto_set_gpu=share)
    except (KeyError, RuntimeError, ValueError, OSError) as error:
        raise ValueError(
            "cluster_resolver='slurm' needs to run inside a SLURM job step (srun), with "
            f"SLURM_* variables set; SlurmClusterResolver failed: {error!r}.") from error


def _max_tasks_per_node(tasks_per_node):
    """The largest count in SLURM's tasks-per-node list, e.g. `"2(x3),1"` -> 2."""
    counts = [int(match) for match in re.findall(r"(\d+)(?:\(x\d+\))?", tasks_per_node)]
    return max(counts) if counts else 1


def _config_from_resolver(resolver):
    spec = resolver.cluster_spec().as_dict()
    if not spec:
        return None
    if resolver.task_type is None or resolver.task_id is None:
        raise ValueError(
            f"{type(resolver).__name__} names a cluster but not this process's task (task_type="
            f"{resolver.task_type!r}, task_id={resolver.task_id!r}); both are needed.")
    cluster = {kind: tuple(tasks.values() if isinstance(tasks, dict) else tasks)
               for kind, tasks in spec.items()}
    return ClusterConfig(cluster=types.MappingProxyType(cluster), task_type=resolver.task_type,
                         task_index=resolver.task_id)


def _choose(devices, cluster):
    config = cluster.config
    if config is not None:
        if config.cluster.get("ps"):
            return "parameter_server", (
                f"{cluster.source} has {len(config.cluster['ps'])} ps task(s); this is "
                f"{config.task_type} {config.task_index} at {config.own_address}")
        if config.task_type in TRAINING_TASK_TYPES and config.num_workers > 1:
            return "multi_worker_mirrored", (
                f"{cluster.source} names {config.num_workers} workers (chief + worker tasks); "
                f"this is {config.task_type} {config.task_index} at {config.own_address}")
    if config is None:
        where = f"no cluster ({cluster.source} unset)"
    elif config.task_type not in TRAINING_TASK_TYPES:
        where = f"this is the {config.task_type} task, which trains on its own"
    else:
        where = f"{cluster.source} names a single worker"
    if devices is not None:
        count = devices if isinstance(devices, int) else len(devices)
        if count > 1:
            return "mirrored", f"{where}; devices={devices!r} asks for {count} local devices"
        return "one_device", f"{where}; devices={devices!r} asks for one device"
    gpus = gpu_count()
    if gpus > 1:
        return "mirrored", f"{where}; {gpus} GPUs visible"
    return "one_device", (f"{where}; {'1 GPU' if gpus else 'no GPU'} visible (pass devices=N "
                          "for N replicas on this machine)")


# ---------------------------------------------------------------- single machine

def _create_default(devices):
    if devices is not None:
        raise ValueError(f"Strategy 'default' runs on TensorFlow's default device and takes no "
                         f"devices, got devices={devices!r}; use 'one_device' or 'mirrored'.")
    if tf.distribute.has_strategy():
        raise ValueError("create_strategy('default') was called inside another strategy's "
                         "scope; call it outside any `strategy.scope()`.")
    return tf.distribute.get_strategy(), "no distribution (TensorFlow's default strategy)"


def _create_one_device(devices):
    if devices is None or devices == 1:
        device = "/gpu:0" if gpu_count() else "/cpu:0"
    elif isinstance(devices, (list, tuple)) and len(devices) == 1:
        device = _existing_devices(devices)[0]
    else:
        raise ValueError(f"Strategy 'one_device' uses exactly one device, got devices={devices!r};"
                         " use 'mirrored' for several devices.")
    return tf.distribute.OneDeviceStrategy(device), f"one device: {device}"


def _create_mirrored(devices, all_reduce):
    gpus = gpu_count()
    note = ""
    if isinstance(devices, (list, tuple)):
        names = _existing_devices(devices)
    elif isinstance(devices, int) and gpus:
        if devices > gpus:
            raise DeviceConfigError(
                f"mirrored with devices={devices} needs {devices} GPUs, but {gpus} GPU(s) are "
                f"visible; pass devices=1..{gpus} or None for all of them.")
        names = [f"/gpu:{i}" for i in range(devices)]
    elif isinstance(devices, int):
        names = split_cpu_into_logical_devices(devices)
        note = f"no GPU: {devices} logical CPU device(s)"
    elif gpus:
        names = [f"/gpu:{i}" for i in range(gpus)]
    else:
        names = [d.name for d in tf.config.list_logical_devices("CPU")]
        note = (f"no GPU: mirrored over the {len(names)} logical CPU device(s) that exist"
                + ("; pass devices=N to split the CPU into N logical devices for N replicas"
                   if len(names) == 1 else ""))
    cross_device_ops = _mirrored_all_reduce(all_reduce, names)
    return _new_mirrored_strategy(names, cross_device_ops), note


def _mirrored_all_reduce(all_reduce, names):
    if all_reduce is None:
        return None
    if all_reduce == "nccl":
        types_ = {tf.DeviceSpec.from_string(n).device_type for n in names}
        if types_ != {"GPU"}:
            raise ValueError(
                f"all_reduce='nccl' needs GPUs, but the devices are {list(names)}; on CPUs use "
                "'hierarchical_copy', 'reduction_to_one_device' or None.")
        return tf.distribute.NcclAllReduce()
    if all_reduce == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce()
    return tf.distribute.ReductionToOneDevice()


def _existing_devices(devices):
    available = tf.config.list_logical_devices()
    known = {(tf.DeviceSpec.from_string(d.name).device_type,
              tf.DeviceSpec.from_string(d.name).device_index) for d in available}
    for name in devices:
        try:
            spec = tf.DeviceSpec.from_string(name)
        except ValueError as error:
            raise ValueError(f"Device name {name!r} is not a TensorFlow device name such as "
                             f"'/gpu:0': {error}") from None
        if (spec.device_type and spec.device_type.upper(), spec.device_index or 0) not in known:
            raise DeviceConfigError(
                f"Device {name!r} does not exist in this process; available: "
                f"{[d.name for d in available]}. Without GPUs, pass devices=N to split the CPU "
                "into N logical devices.")
    return list(devices)


# ---------------------------------------------------------------- multi-worker

def _create_multi_worker(devices, all_reduce, cluster, collective_timeout, startup_timeout):
    config = cluster.config
    if config is None:
        raise ValueError(
            f"multi_worker_mirrored needs a cluster, but {cluster.source} names none. On one "
            "machine start the workers with `python -m tfdist.launch --workers N -- <command>`;"
            " on a cluster set TF_CONFIG on every worker (Kubeflow's TFJob does), or pass "
            "cluster_resolver='slurm' inside a SLURM job.")
    if config.cluster.get("ps"):
        raise ValueError(
            f"{cluster.source} has 'ps' tasks, which multi_worker_mirrored does not use (every "
            "worker keeps a full copy of the variables). Use strategy 'parameter_server' (or "
            "'auto'), or drop the 'ps' tasks from the cluster.")
    if config.task_type not in TRAINING_TASK_TYPES:
        raise ValueError(
            f"This process is the {config.task_type!r} task, which does not take part in "
            f"multi_worker_mirrored training (only {', '.join(TRAINING_TASK_TYPES)} do); run "
            "it with create_strategy('one_device') or 'mirrored'.")
    count = _devices_per_worker(devices)
    gpus = gpu_count()
    if all_reduce == "nccl" and not gpus:
        raise ValueError("all_reduce='nccl' needs GPUs, but this worker has none; on CPU "
                         "workers use 'ring', 'auto' or None.")
    local = None
    if gpus:
        if count is not None and count > gpus:
            raise DeviceConfigError(f"devices={count} per worker needs {count} GPUs, but {gpus} "
                                    f"GPU(s) are visible on this worker.")
        if count is not None and count < gpus:
            local = ("GPU", count)
    elif count is not None and count > 1:
        split_cpu_into_logical_devices(count)
        local = ("CPU", count)
    if local is None and cluster.resolver is not None:
        # A resolver other than TF_CONFIG (SLURM) would otherwise choose the
        # local devices from its own accelerator count: use what this process sees.
        local = ("GPU", gpus) if gpus else ("CPU", 1)
    implementation = {
        None: tf.distribute.experimental.CommunicationImplementation.AUTO,
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }[all_reduce]
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation, timeout_seconds=collective_timeout)

    # A port another process holds would otherwise show only as peers that
    # never arrive, at the end of the whole start-up deadline.
    check_port_free(int(config.own_address.rpartition(":")[2]),
                    who=f"{config.task_type} {config.task_index} at {config.own_address} "
                        f"({cluster.source})")
    peers = ", ".join(f"{kind} {index} at {address}" for kind, index, address in config.peers())
    logger.info("%s %d at %s waiting up to %g s for its peers: %s", config.task_type,
                config.task_index, config.own_address, startup_timeout, peers or "none")
    started = time.monotonic()
    _bound_cluster_registration(config, startup_timeout)
    try:
        strategy = _new_multi_worker_strategy(cluster.resolver, options, local)
    except tf.errors.OpError as error:
        raise _startup_error(config, startup_timeout, "while forming the cluster", error) from error
    except RuntimeError as error:
        if "program startup" not in str(error):
            raise
        raise RuntimeError(
            "multi_worker_mirrored must be created before TensorFlow initialises (before any "
            "op, variable, dataset or device listing runs in this process): call "
            f"create_strategy first. TensorFlow said: {error}") from error
    remaining = max(startup_timeout - (time.monotonic() - started), 5.0)
    _check_connectivity(strategy, config, remaining, startup_timeout)
    per_worker = len(strategy.extended.worker_devices)
    note = (f"{config.num_workers} workers x {per_worker} "
            f"{'GPU' if gpus else 'CPU'} device(s) from {cluster.source}")
    if not gpus and local is None:
        # Short: it is a line of the recipes' start block. devices=N is the
        # recipes' --devices N and the launcher's --devices-per-worker N.
        note += f"; devices=N or {DEVICES_PER_WORKER_ENV}=N for N logical CPUs each"
    return strategy, note


def _create_parameter_server(devices, cluster, startup_timeout):
    from tfdist.distribute import ps_cluster  # pylint: disable=import-outside-toplevel

    if devices is not None:
        raise ValueError(
            f"parameter_server takes no devices (got devices={devices!r}): each worker uses "
            "its GPU, or its CPU; set CUDA_VISIBLE_DEVICES per worker task to choose.")
    ps_cluster.check_parameter_server_cluster(cluster.config, cluster.source)
    return ps_cluster.create_parameter_server_strategy(cluster.config, cluster.resolver,
                                                       startup_timeout)


def is_parameter_server(strategy):
    """Whether `strategy` is TensorFlow's `ParameterServerStrategy` (asynchronous
    training driven by the chief; see `tfdist.distribute.ps_cluster`).

    Example:

    >>> is_parameter_server(create_strategy("mirrored", devices=2))
    False
    """
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


_mirrored_strategies_created = itertools.count(1)


def _new_mirrored_strategy(devices, cross_device_ops):
    """A MirroredStrategy with collective keys of its own.

    Every MirroredStrategy in a process otherwise starts its collective group
    and instance keys at the same base, so a second strategy over the same
    devices (a benchmark sweep, a test suite) reuses the first one's keys,
    and one shape mismatch aborts every collective of the process. TF reads
    the base from a class attribute at construction, hence the swap.
    """
    base = tf.distribute.MirroredStrategy._collective_key_base
    tf.distribute.MirroredStrategy._collective_key_base = 10_000 * next(_mirrored_strategies_created)
    try:
        return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross_device_ops)
    finally:
        tf.distribute.MirroredStrategy._collective_key_base = base


def _bound_cluster_registration(config, deadline):
    """Makes TensorFlow's cluster registration fail after `deadline` seconds
    instead of waiting for a missing peer for an hour or more.

    MultiWorkerMirroredStrategy configures the coordination service itself when
    nobody did; this does the same (same leader and jobs), adding the register
    timeout and the barrier that makes the leader honour it too. TensorFlow's
    public API exposes no such setting, hence the eager context.
    """
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel

    ctx = context.context()
    if ctx.coordination_service is not None:
        logger.info("the coordination service is already configured; the start-up "
                    "deadline covers only the connectivity check.")
        return
    leader_job = "chief" if "chief" in config.cluster else "worker"
    ctx.configure_coordination_service(
        service_type="standalone", service_leader=f"/job:{leader_job}/replica:0/task:0",
        cluster_register_timeout_in_ms=int(deadline * 1000))
    service = ctx.coordination_service
    for kind in TRAINING_TASK_TYPES:
        if kind in config.cluster:
            service.coordinated_job_list.add(name=kind, num_tasks=len(config.cluster[kind]))
    service.cluster_register_with_barrier = True


def _new_multi_worker_strategy(resolver, options, local):
    if local is None:
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                        communication_options=options)
    return _per_worker_devices_strategy(resolver, options, *local)


def _per_worker_devices_strategy(resolver, options, device_type, count):
    """A MultiWorkerMirroredStrategy with `count` local devices per worker.

    TensorFlow's multi-worker path always uses every GPU, or one CPU. Its
    collectives handle any number of local devices (measured here: 2 workers x
    2 logical CPUs give 4 replicas, correct all-reduces, variable broadcast and
    dataset sharding), so only the local-device choice is overridden.
    """
    try:
        # pylint: disable=import-outside-toplevel
        from tensorflow.python.distribute.collective_all_reduce_strategy import (
            CollectiveAllReduceExtended)
    except ImportError as error:
        raise DeviceConfigError(
            f"This TensorFlow version cannot use {count} {device_type} devices per worker "
            "with multi_worker_mirrored; use devices=None.") from error

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


def _check_connectivity(strategy, config, timeout, deadline):
    """One all-reduce across every replica, failing after `timeout` seconds."""
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)

    def one():
        return tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.constant(1.0), options=options)

    try:
        total = strategy.experimental_local_results(tf.function(lambda: strategy.run(one))())[0]
    except tf.errors.OpError as error:
        raise _startup_error(config, deadline, "in the connectivity check", error) from error
    if round(float(total)) != strategy.num_replicas_in_sync:
        raise StrategyStartupError(
            f"The start-up all-reduce summed to {float(total):g} instead of "
            f"{strategy.num_replicas_in_sync} (one per replica): workers disagree on the "
            "cluster. Check that every worker has the same TF_CONFIG cluster and devices.")


def _startup_error(config, deadline, stage, error):
    message = str(getattr(error, "message", error))
    missing = []
    # The coordination leader's barrier error lists the tasks that never registered,
    # one per line after "Some timed out task names:".
    for tail in message.split("timed out task names:")[1:]:
        for line in tail.strip().splitlines():
            match = re.fullmatch(r"\s*/job:(\w+)/replica:\d+/task:(\d+)\s*", line)
            if not match:
                break
            job, index = match.group(1), int(match.group(2))
            addresses = config.cluster.get(job, ())
            if (job, index) != (config.task_type, config.task_index) and index < len(addresses):
                missing.append(f"{job} {index} at {addresses[index]}")
    peers = ", ".join(f"{kind} {index} at {address}" for kind, index, address in config.peers())
    first_line = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return StrategyStartupError(
        f"multi_worker_mirrored failed {stage}: {config.task_type} {config.task_index} at "
        f"{config.own_address} waited up to {deadline:g} s (start-up deadline) for "
        f"{peers or 'no peers'}"
        + (f"; never arrived: {', '.join(dict.fromkeys(missing))}" if missing else "")
        + ". Check that every worker was started with the same TF_CONFIG cluster and can "
        f"reach these addresses, or raise the deadline (startup_timeout=, "
        f"{STARTUP_TIMEOUT_ENV}). TensorFlow said: {type(error).__name__}: {first_line}")


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
    config = _config_from_resolver(resolver)
    if config is None or config.worker_index is None:
        return 1, 0, True
    return config.num_workers, config.worker_index, config.is_chief
