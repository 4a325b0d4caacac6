"""The localhost cluster a launch runs on: free ports, TF_CONFIG, worker env.

Nothing here imports TensorFlow; the layout is plain data.
"""

import json
import socket

from tfdist.tf_logging import LOG_LEVEL_ENV, QUIET_LEVEL


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
    except socket.gaierror as error:
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


def cluster_spec(host, ports):
    """Returns the TF_CONFIG cluster for one worker per port.

    Args:
        host: the address every worker listens on.
        ports: one port per worker; worker i gets ports[i].

    Example:

    >>> cluster_spec("127.0.0.1", [2222, 2223])
    {'worker': ['127.0.0.1:2222', '127.0.0.1:2223']}
    """
    return {"worker": [address(host, port) for port in ports]}


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


def worker_env(base_env, cluster, rank, ready_file, devices_per_worker=None, startup_timeout=None,
               gpus=None):
    """Returns the environment of worker `rank`: `base_env` plus tfdist's vars.

    Sets TF_CONFIG (worker 0 is the chief), TFDIST_RANK, TFDIST_WORLD_SIZE,
    TFDIST_READY_FILE, PYTHONUNBUFFERED=1, TF_CPP_MIN_LOG_LEVEL=3 (TensorFlow's
    C++ logging off) unless `base_env` sets it, and, when given,
    TFDIST_DEVICES_PER_WORKER and TFDIST_STARTUP_TIMEOUT (read by
    `tfdist.strategy.create_strategy`) and CUDA_VISIBLE_DEVICES (this
    worker's own GPUs). `base_env` is not modified.

    Args:
        base_env: the environment to start from (a mapping of str to str).
        cluster: the cluster from `cluster_spec`.
        rank: this worker's index in `cluster["worker"]`.
        ready_file: the path the worker creates once it is up.
        devices_per_worker: devices each worker should use, or None.
        startup_timeout: the workers' own start-up deadline in seconds, or None.
        gpus: this worker's GPU ids (see `tfdist.launch.gpus.assign_gpus`), or
            None to leave CUDA_VISIBLE_DEVICES as it is.

    Example:

    >>> env = worker_env({}, cluster_spec("127.0.0.1", [2222, 2223]), 1, "/tmp/r1")
    >>> env["TFDIST_RANK"], env["TFDIST_WORLD_SIZE"]
    ('1', '2')
    """
    env = dict(base_env)
    env["TF_CONFIG"] = json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": rank}})
    env["TFDIST_RANK"] = str(rank)
    env["TFDIST_WORLD_SIZE"] = str(len(cluster["worker"]))
    env["TFDIST_READY_FILE"] = ready_file
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault(LOG_LEVEL_ENV, str(QUIET_LEVEL))
    if devices_per_worker is not None:
        env["TFDIST_DEVICES_PER_WORKER"] = str(devices_per_worker)
    if startup_timeout is not None:
        env["TFDIST_STARTUP_TIMEOUT"] = f"{startup_timeout:g}"
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return env
