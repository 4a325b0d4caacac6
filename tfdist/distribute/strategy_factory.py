"""The strategy factory: a `tf.distribute.Strategy` from a name.

`create_strategy("mirrored", devices=2)` is the one place tfdist turns what a
user asked for into a strategy. It checks the request first (names, devices,
all-reduce implementation, TF_CONFIG) and explains every refusal; it never
falls back silently to one device or one worker. `choose_strategy` tells what
"auto" would pick without creating anything.

Multi-worker start-up is bounded by `tfdist.distribute.startup` (the
start-up deadline and the ready file); `tfdist.distribute.introspection`
describes the strategy made; `tfdist.distribute.slurm` resolves a SLURM job.
"""

import dataclasses
import itertools
import logging
import os
import time

import tensorflow as tf

from tfdist.distribute.tf_config import TRAINING_TASK_TYPES, config_from_resolver, parse_tf_config
from tfdist.distribute.devices import DeviceConfigError, gpu_count, split_cpu_into_logical_devices
from tfdist.distribute.ports import check_port_free
from tfdist.distribute.strategy_names import (CLUSTER_RESOLVER_NAMES, check_all_reduce_name,
                                              check_strategy_name)
from tfdist.distribute.introspection import describe_strategy, remember_creation
from tfdist.distribute.slurm import slurm_resolver
from tfdist.seam import mirrored_strategy_with_key_base, multi_worker_strategy_on_local_devices
from tfdist.distribute.startup import (bound_cluster_registration, check_connectivity,
                                       check_seconds, startup_error, startup_timeout_seconds,
                                       write_ready_file)

logger = logging.getLogger("tfdist")

DEVICES_PER_WORKER_ENV = "TFDIST_DEVICES_PER_WORKER"


@dataclasses.dataclass(frozen=True)
class ResolvedCluster:
    """The cluster a `cluster_resolver` argument names (see `resolve_cluster`).

    Args:
        config: the validated `ClusterConfig`, or None (no cluster).
        resolver: the TensorFlow ClusterResolver, or None (TF_CONFIG: the
            strategies' default `TFConfigClusterResolver`).
        source: where the cluster came from, for messages: "TF_CONFIG",
            "SlurmClusterResolver", ...

    Example:

    >>> resolve_cluster(None)  # no TF_CONFIG
    ResolvedCluster(config=None, resolver=None, source='TF_CONFIG')
    """

    config: object
    resolver: object
    source: str


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
            env TFDIST_DEVICES_PER_WORKER, else every GPU or one CPU). None
            takes TFDIST_DEVICES_PER_WORKER (which `tfdist launch
            --devices-per-worker N` sets) for auto and mirrored on one worker
            too; one_device and default refuse a count above 1 there.
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
    collective_timeout = check_seconds("collective_timeout", collective_timeout)
    startup_timeout = startup_timeout_seconds(startup_timeout)
    _check_resolver_argument(cluster_resolver)
    notes = []
    cluster = None
    # `tfdist launch --devices-per-worker N` sets it for each worker, also for one worker.
    local_devices = (_devices_per_worker(None) if devices is None
                     and key in ("auto", "mirrored", "one_device", "default") else None)
    if key == "auto":
        cluster = resolve_cluster(cluster_resolver)
        key, reason = _choose(devices, cluster, local_devices)
        logger.info("strategy 'auto' picked %r: %s", key, reason)
        notes.append(f"auto picked {key}: {reason}")
    if local_devices is not None and key in ("mirrored", "one_device", "default"):
        devices = _devices_from_environment(key, local_devices)
    check_all_reduce_name(key, all_reduce)
    if key == "default":
        strategy, note = _create_default(devices)
    elif key == "one_device":
        strategy, note = _create_one_device(devices)
    elif key == "mirrored":
        strategy, note = _create_mirrored(devices, all_reduce)
    elif key == "parameter_server":
        cluster = cluster or resolve_cluster(cluster_resolver)
        strategy, note = _create_parameter_server(devices, cluster, startup_timeout)
    else:
        cluster = cluster or resolve_cluster(cluster_resolver)
        strategy, note = _create_multi_worker(devices, all_reduce, cluster, collective_timeout,
                                              startup_timeout)
    if note:
        notes.append(note)
    remember_creation(strategy, key, all_reduce, "; ".join(notes))
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
    local_devices = _devices_per_worker(None) if devices is None else None
    return _choose(devices, resolve_cluster(cluster_resolver), local_devices)


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

def resolve_cluster(resolver):
    """Turns a `cluster_resolver` argument into a `ResolvedCluster` (validating TF_CONFIG).

    Args:
        resolver: None or "tf_config" (TF_CONFIG), "slurm" (`SlurmClusterResolver`
            set up by `tfdist.distribute.slurm.slurm_resolver`), or a
            `tf.distribute.cluster_resolver.ClusterResolver`.

    Raises:
        TFConfigError: TF_CONFIG is set but malformed.
        ValueError: "slurm" outside a SLURM job step, or a resolver that names a
            cluster but not this process's task.

    Example:

    >>> resolve_cluster("tf_config").source
    'TF_CONFIG'
    """
    if resolver is None or resolver == "tf_config":
        return ResolvedCluster(config=parse_tf_config(), resolver=None, source="TF_CONFIG")
    if resolver == "slurm":
        resolver = slurm_resolver()
    return ResolvedCluster(config=config_from_resolver(resolver), resolver=resolver,
                           source=type(resolver).__name__)


def _devices_from_environment(key, count):
    """The `devices` that TFDIST_DEVICES_PER_WORKER=`count` asks of a one-machine strategy
    (None for `default`, which takes no devices)."""
    if key in ("one_device", "default") and count > 1:
        raise ValueError(
            f"Strategy {key!r} uses one device, but {DEVICES_PER_WORKER_ENV}={count} (set by "
            "`tfdist launch --devices-per-worker`) asks for "
            f"{count}; use 'mirrored' (or 'auto') for {count} replicas, or unset it.")
    return None if key == "default" else count


def _choose(devices, cluster, local_devices=None):
    """`(name, reason)` of the strategy "auto" picks; `local_devices` is
    TFDIST_DEVICES_PER_WORKER's count (None when unset), used when `devices` is None."""
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
    if local_devices is not None:
        asked = f"{DEVICES_PER_WORKER_ENV}={local_devices}"
        if local_devices > 1:
            return "mirrored", f"{where}; {asked} asks for {local_devices} local devices"
        return "one_device", f"{where}; {asked} asks for one device"
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
    bound_cluster_registration(config, startup_timeout)
    try:
        strategy = _new_multi_worker_strategy(cluster.resolver, options, local)
    except tf.errors.OpError as error:
        raise startup_error(config, startup_timeout, "while forming the cluster", error) from error
    except RuntimeError as error:
        if "program startup" not in str(error):
            raise
        raise RuntimeError(
            "multi_worker_mirrored must be created before TensorFlow initialises (before any "
            "op, variable, dataset or device listing runs in this process): call "
            f"create_strategy first. TensorFlow said: {error}") from error
    remaining = max(startup_timeout - (time.monotonic() - started), 5.0)
    check_connectivity(strategy, config, remaining, startup_timeout)
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

_mirrored_strategies_created = itertools.count(1)


def _new_mirrored_strategy(devices, cross_device_ops):
    """A MirroredStrategy with collective keys of its own.

    Every MirroredStrategy in a process otherwise starts its collective group
    and instance keys at the same base, so a second strategy over the same
    devices (a benchmark sweep, a test suite) reuses the first one's keys,
    and one shape mismatch aborts every collective of the process. TF reads
    the base from a class attribute at construction, hence the swap
    (`tfdist.seam.mirrored_strategy_with_key_base`).
    """
    return mirrored_strategy_with_key_base(10_000 * next(_mirrored_strategies_created),
                                           devices, cross_device_ops)


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
        return multi_worker_strategy_on_local_devices(resolver, options, device_type, count)
    except ImportError as error:
        raise DeviceConfigError(
            f"This TensorFlow version cannot use {count} {device_type} devices per worker "
            "with multi_worker_mirrored; use devices=None.") from error
