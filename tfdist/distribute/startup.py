"""Multi-worker start-up: the deadline for the cluster to form, and the ready file.

`MultiWorkerMirroredStrategy` waits for its peers while it is being created
(inside TensorFlow, holding the GIL, so a Python watchdog thread cannot
interrupt it) and would wait for a missing peer for an hour or forever.
tfdist therefore configures TensorFlow's coordination service to register the
cluster behind a barrier with the start-up deadline
(`bound_cluster_registration`), then runs one small all-reduce with the
remaining time as its collective timeout (`check_connectivity`). A peer that
never comes is a `StrategyStartupError` naming the addresses waited for
(`startup_error`). Once the strategy is up, the file named by
`TFDIST_READY_FILE` (set by `tfdist.launch`) is created (`write_ready_file`).
"""

import json
import logging
import os
import re
import tempfile

import tensorflow as tf

from tfdist.distribute.collectives import barrier
from tfdist.distribute.tf_config import TRAINING_TASK_TYPES, StrategyStartupError
from tfdist.runtime.argtypes import check_number
from tfdist.seam import configure_coordination_service

logger = logging.getLogger("tfdist")

DEFAULT_STARTUP_TIMEOUT = 300.0
STARTUP_TIMEOUT_ENV = "TFDIST_STARTUP_TIMEOUT"
READY_FILE_ENV = "TFDIST_READY_FILE"


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


def check_seconds(label, value):
    """Checks a timeout argument: a positive number of seconds, or None (no limit).

    Args:
        label: the argument's name, for the message.
        value: the value given.

    Returns:
        `value` as a float, or None.

    Raises:
        ValueError: `value` is not a positive number (the message names it).

    Example:

    >>> check_seconds("collective_timeout", 30)
    30.0
    """
    return check_number(label, value, above=0, unit="seconds", none_means="no limit")


def startup_timeout_seconds(value):
    """The start-up deadline in seconds: `value`, else env TFDIST_STARTUP_TIMEOUT, else 300.

    Raises:
        ValueError: `value` or the environment variable is not a positive number.

    Example:

    >>> startup_timeout_seconds(None)  # TFDIST_STARTUP_TIMEOUT unset
    300.0
    """
    if value is not None:
        return check_seconds("startup_timeout", value)
    raw = os.environ.get(STARTUP_TIMEOUT_ENV)
    if not raw:
        return DEFAULT_STARTUP_TIMEOUT
    try:
        return check_number(STARTUP_TIMEOUT_ENV, float(raw), above=0, unit="seconds")
    except ValueError:
        raise ValueError(f"Environment variable {STARTUP_TIMEOUT_ENV}={raw!r} must be a finite "
                         "number of seconds > 0.") from None


def bound_cluster_registration(config, deadline):
    """Makes TensorFlow's cluster registration fail after `deadline` seconds
    instead of waiting for a missing peer for an hour or more.

    MultiWorkerMirroredStrategy configures the coordination service itself when
    nobody did; this does the same (same leader and jobs), adding the register
    timeout and the barrier that makes the leader honour it too. TensorFlow's
    public API exposes no such setting, hence the eager context.

    Args:
        config: this process's `tfdist.distribute.tf_config.ClusterConfig`.
        deadline: seconds the whole cluster has to register.

    Example:

    >>> bound_cluster_registration(parse_tf_config(), deadline=300.0)  # before the strategy
    """
    leader_job = "chief" if "chief" in config.cluster else "worker"
    jobs = {kind: len(config.cluster[kind]) for kind in TRAINING_TASK_TYPES
            if kind in config.cluster}
    if not configure_coordination_service(f"/job:{leader_job}/replica:0/task:0", jobs,
                                          deadline):
        logger.info("the coordination service is already configured; the start-up "
                    "deadline covers only the connectivity check.")


def check_connectivity(strategy, config, timeout, deadline):
    """One all-reduce across every replica, failing after `timeout` seconds.

    Args:
        strategy: the multi-worker strategy just created.
        config: this process's `ClusterConfig` (named in the error).
        timeout: seconds left of the start-up deadline.
        deadline: the whole start-up deadline (named in the error).

    Raises:
        StrategyStartupError: a peer did not answer in time, or the workers
            disagree on the number of replicas.

    Example:

    >>> check_connectivity(strategy, config, timeout=250.0, deadline=300.0)
    """
    try:
        total = barrier(strategy, timeout_seconds=timeout)
    except tf.errors.OpError as error:
        raise startup_error(config, deadline, "in the connectivity check", error) from error
    if round(float(total)) != strategy.num_replicas_in_sync:
        raise StrategyStartupError(
            f"The start-up all-reduce summed to {float(total):g} instead of "
            f"{strategy.num_replicas_in_sync} (one per replica): workers disagree on the "
            "cluster. Check that every worker has the same TF_CONFIG cluster and devices.")


def startup_error(config, deadline, stage, error):
    """The `StrategyStartupError` for TensorFlow's `error` while the cluster formed.

    It names this task, the peers waited for, those that never arrived (from
    the coordination service's barrier message) and the way out.

    Args:
        config: this process's `ClusterConfig`.
        deadline: the start-up deadline in seconds.
        stage: where it failed, e.g. "while forming the cluster".
        error: TensorFlow's exception.

    Example:

    >>> raise startup_error(config, 300.0, "while forming the cluster", error) from error
    """
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
