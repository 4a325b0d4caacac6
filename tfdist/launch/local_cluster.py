"""The localhost cluster a launch runs on: free ports, TF_CONFIG, worker env.

A job is a list of tasks, (task type, index) pairs, started in that order and
given one port each: N workers (`job_tasks(N)`), or, for a parameter-server
job, a chief, N workers and M ps tasks (`job_tasks(N, ps=M)`).

Nothing here imports TensorFlow; the layout is plain data.
"""

import socket

from tfdist.distribute.tf_config import tf_config_text
from tfdist.runtime.tf_logging import LOG_LEVEL_ENV, QUIET_LEVEL


def free_ports(count, host="127.0.0.1"):
    """Returns `count` distinct TCP ports that are free on `host` right now.

    All sockets are held open until every port is picked, so the ports are
    distinct; they are closed before returning, so another process could still
    take one before the worker binds it (rare with kernel-chosen ports).

    Args:
        count: how many ports, >= 1.
        host: the address to bind, e.g. "127.0.0.1" or "::1".

    Returns:
        A list of `count` port numbers.

    Raises:
        ValueError: `host` cannot be bound on this machine.

    Example:

    >>> ports = free_ports(2)
    >>> len(set(ports))
    2
    """
    try:
        family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError) as error:  # UnicodeError: not a valid host name at all
        raise ValueError(f"Cannot resolve host {host!r}: {error}. Use a local "
                         "address such as '127.0.0.1' or '::1'.") from error
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            try:
                sock.bind((host, 0))
            except OSError as error:
                raise ValueError(f"Cannot bind a port on host {host!r}: {error}. "
                                 "Use an address of this machine such as "
                                 "'127.0.0.1'.") from error
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def address(host, port):
    """Returns "host:port", with brackets around an IPv6 host.

    Args:
        host: a host name or IP address.
        port: a port number.

    Example:

    >>> address("127.0.0.1", 2222), address("::1", 2222)
    ('127.0.0.1:2222', '[::1]:2222')
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def job_tasks(workers, ps=0):
    """Returns the tasks of a job, in start order, as (task type, index) pairs.

    Without ps tasks every task is a worker (worker 0 is the chief). With
    `ps` >= 1 it is a parameter-server job: one chief (the coordinator, which
    runs the training loop), `workers` workers and `ps` ps tasks.

    Args:
        workers: the number of workers, >= 1.
        ps: the number of parameter-server tasks, >= 0.

    Example:

    >>> job_tasks(2)
    [('worker', 0), ('worker', 1)]
    >>> job_tasks(2, ps=1)
    [('chief', 0), ('worker', 0), ('worker', 1), ('ps', 0)]
    """
    tasks = [("worker", index) for index in range(workers)]
    if not ps:
        return tasks
    return [("chief", 0)] + tasks + [("ps", index) for index in range(ps)]


def task_label(task):
    """Returns how the launcher names `task` in its output: "chief",
    "worker 1", "ps 0".

    Example:

    >>> task_label(("chief", 0)), task_label(("worker", 1))
    ('chief', 'worker 1')
    """
    kind, index = task
    return kind if kind == "chief" else f"{kind} {index}"


def cluster_spec(host, ports, tasks=None):
    """Returns the TF_CONFIG cluster: task i of `tasks` listens on ports[i].

    Args:
        host: the address every task listens on.
        ports: one port per task.
        tasks: the tasks from `job_tasks`, in the order of `ports`; default:
            one worker per port.

    Example:

    >>> cluster_spec("127.0.0.1", [2222, 2223])
    {'worker': ['127.0.0.1:2222', '127.0.0.1:2223']}
    >>> cluster_spec("127.0.0.1", [2222, 2223, 2224], job_tasks(1, ps=1))
    {'chief': ['127.0.0.1:2222'], 'worker': ['127.0.0.1:2223'], 'ps': ['127.0.0.1:2224']}
    """
    if tasks is None:
        tasks = job_tasks(len(ports))
    cluster = {}
    for (kind, _), port in zip(tasks, ports, strict=True):
        cluster.setdefault(kind, []).append(address(host, port))
    return cluster


def training_rank(cluster, task):
    """Returns the rank of `task` among the training tasks (the chief first,
    then the workers; TensorFlow's `id_in_cluster`), or None for a ps task.

    Example:

    >>> cluster = cluster_spec("127.0.0.1", [2222, 2223, 2224], job_tasks(1, ps=1))
    >>> [training_rank(cluster, task) for task in job_tasks(1, ps=1)]
    [0, 1, None]
    """
    kind, index = task
    if kind == "chief":
        return 0
    if kind == "worker":
        return index + len(cluster.get("chief", ()))
    return None


def worker_startup_timeout(startup_timeout):
    """The start-up deadline given to workers: 90% of the launcher's (at most
    30 s less), so that a worker reports which peer it waited for before the
    launcher gives up on it. None when the launcher has no deadline.

    Example:

    >>> worker_startup_timeout(300.0), worker_startup_timeout(20.0)
    (270.0, 18.0)
    """
    if not startup_timeout:
        return None
    return max(startup_timeout * 0.9, startup_timeout - 30.0)


def task_env(base_env, cluster, task, ready_file, devices_per_worker=None,
             startup_timeout=None, gpus=None):
    """Returns the environment of `task`: `base_env` plus tfdist's vars.

    Sets TF_CONFIG (this task in `cluster`), TFDIST_RANK (`training_rank`:
    the chief 0, then the workers; unset for a ps task), TFDIST_WORLD_SIZE
    (the number of chief and worker tasks), TFDIST_READY_FILE,
    PYTHONUNBUFFERED=1, TF_CPP_MIN_LOG_LEVEL=3 (TensorFlow's C++ logging off)
    unless `base_env` sets it, and, when given, TFDIST_DEVICES_PER_WORKER
    (chief and workers only) and TFDIST_STARTUP_TIMEOUT (read by
    `tfdist.distribute.strategy_factory.create_strategy`) and
    CUDA_VISIBLE_DEVICES (this task's own GPUs; an empty list hides every GPU).
    `base_env` is not modified.

    Args:
        base_env: the environment to start from (a mapping of str to str).
        cluster: the cluster from `cluster_spec`.
        task: this task, a (task type, index) pair from `job_tasks`.
        ready_file: the path the task creates once it is up.
        devices_per_worker: devices each chief/worker should use, or None.
        startup_timeout: the tasks' own start-up deadline in seconds, or None.
        gpus: this task's GPU ids (see `tfdist.launch.gpus.assign_gpus`), or
            None to leave CUDA_VISIBLE_DEVICES as it is.

    Example:

    >>> cluster = cluster_spec("127.0.0.1", [2222, 2223, 2224], job_tasks(1, ps=1))
    >>> env = task_env({"TFDIST_RANK": "7"}, cluster, ("ps", 0), "/tmp/ps0", gpus=[])
    >>> "TFDIST_RANK" in env, env["TFDIST_WORLD_SIZE"], env["CUDA_VISIBLE_DEVICES"]
    (False, '2', '')
    """
    kind, index = task
    env = dict(base_env)
    env["TF_CONFIG"] = tf_config_text(cluster, kind, index)
    rank = training_rank(cluster, task)
    if rank is None:
        env.pop("TFDIST_RANK", None)
    else:
        env["TFDIST_RANK"] = str(rank)
    env["TFDIST_WORLD_SIZE"] = str(len(cluster.get("chief", ())) + len(cluster["worker"]))
    env["TFDIST_READY_FILE"] = ready_file
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault(LOG_LEVEL_ENV, str(QUIET_LEVEL))
    if devices_per_worker is not None and rank is not None:
        env["TFDIST_DEVICES_PER_WORKER"] = str(devices_per_worker)
    if startup_timeout is not None:
        env["TFDIST_STARTUP_TIMEOUT"] = f"{startup_timeout:g}"
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return env


def worker_env(base_env, cluster, rank, ready_file, devices_per_worker=None, startup_timeout=None,
               gpus=None):
    """Returns the environment of worker `rank`: `task_env` for ("worker", rank).

    Example:

    >>> env = worker_env({}, cluster_spec("127.0.0.1", [2222, 2223]), 1, "/tmp/r1")
    >>> env["TFDIST_RANK"], env["TFDIST_WORLD_SIZE"]
    ('1', '2')
    """
    return task_env(base_env, cluster, ("worker", rank), ready_file, devices_per_worker,
                    startup_timeout, gpus)
