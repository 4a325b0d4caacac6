"""A process that has imported tfdist, TensorFlow and Keras once and forks a
fresh run of a module or script for each request (the server half of
tests/helpers/zygote.py and of zygote_client.py).

    python tests/helpers/workers/zygote_server.py SOCKET_PATH

Imports as a recipe does (`import tfdist`, then TensorFlow through
`tfdist.runtime.tf_logging.import_tensorflow` and Keras), without starting
TensorFlow's runtime, then prints "ready" and serves on the Unix socket
SOCKET_PATH. A request is one JSON line (`module` or `path`, `args`, `env`,
`cwd`) sent with the file descriptors for the run's stdout and stderr. The
server forks a handler for it. The handler refuses a request whose
environment differs from the server's in a variable read at start-up
(`{"refused": NAME}`); otherwise it forks the run and writes two JSON lines
back: the run's pid as soon as it starts, then its wait status when it ends.
If the requester closes the connection first (it died), the handler kills
the run. The run itself is what `python -m MODULE ARGS` or `python PATH ARGS`
would do from there: `runpy` runs the module or script as `__main__` with the
request's argv, environment and working directory, and the interpreter's own
exit (atexit handlers, flushing, the exit code or the traceback) ends it.

The server ends when the process that started it ends (Linux's parent-death
signal), or on SIGTERM.
"""

import ctypes
import importlib
import json
import os
import random
import runpy
import select
import signal
import socket
import sys
import tempfile

from zygote_protocol import first_difference, message

PR_SET_PDEATHSIG = 1
MAX_REQUEST_BYTES = 1 << 20


def end_with_parent():
    """Asks Linux to send this process SIGTERM when its parent ends."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the parent ended before the request took effect
        sys.exit(0)


def import_like_a_recipe():
    """The imports every recipe process makes first, and nothing that starts TensorFlow's runtime."""
    importlib.import_module("tfdist")  # installs the quiet TensorFlow import and Keras's import hook
    from tfdist.runtime.tf_logging import import_tensorflow

    import_tensorflow()
    importlib.import_module("keras")


def receive_request(connection):
    """(request dict, [stdout fd, stderr fd]) from one connection."""
    data, fds, _, _ = socket.recv_fds(connection, MAX_REQUEST_BYTES, 2)
    while not data.endswith(b"\n"):
        more = connection.recv(MAX_REQUEST_BYTES)
        if not more:
            raise ConnectionError("the request ended before its last line")
        data += more
    return json.loads(data), fds


def become_the_run(request, fds):
    """Turns this forked process into `python -m MODULE ARGS`; never returns normally."""
    stdout_fd, stderr_fd = fds
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    for fd in {devnull, stdout_fd, stderr_fd} - {0, 1, 2}:
        os.close(fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from this run's TMPDIR (the server's was cached)
    # What `import tfdist` sets where the environment does not (the server's own
    # values went with os.environ.clear()): a fresh process would set them.
    from tfdist.runtime.cpu_allocator import pool_cpu_memory

    pool_cpu_memory()
    random.seed()  # a fork shares its parent's random state; a fresh process would not
    import numpy

    numpy.random.seed()
    if "path" in request:  # `python PATH`: the script's folder first on the path
        sys.argv = [request["path"], *request["args"]]
        sys.path[0] = os.path.dirname(os.path.realpath(request["path"]))
        runpy.run_path(request["path"], run_name="__main__")
    else:
        sys.argv = [request["module"], *request["args"]]
        sys.path[0] = request["cwd"]  # `python -m` puts the working directory first
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)


def wait_for_the_run_or_its_requester(pid, connection):
    """The run's wait status; SIGKILLs the run first if the requester closes the
    connection before the run ends (a client killed with SIGKILL, a test gone)."""
    run = os.pidfd_open(pid)
    while True:
        ready, _, _ = select.select([connection, run], [], [])
        if run in ready:
            break
        if connection in ready and not connection.recv(4096):
            os.kill(pid, signal.SIGKILL)
            break
    os.close(run)
    return os.waitpid(pid, 0)[1]


def handle(connection, own_environment):
    """Forks the run of one request (or refuses it), reports its pid and then its wait
    status; never returns."""
    request, fds = receive_request(connection)
    differs = first_difference(request["env"], own_environment)
    pid = os.fork() if differs is None else None
    if pid == 0:
        connection.close()
        become_the_run(request, fds)  # the run's own exit, outside the handler's
    try:
        for fd in fds:
            os.close(fd)
        if differs is not None:
            connection.sendall(message({"refused": differs}))
        else:
            connection.sendall(message({"pid": pid}))
            status = wait_for_the_run_or_its_requester(pid, connection)
            connection.sendall(message({"status": status}))
    finally:
        os._exit(0)  # pylint: disable=protected-access  # a forked handler: no cleanup of the server's


def serve(socket_path, own_environment):
    """Accepts requests until killed, each in a forked handler."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    print("ready", flush=True)
    while True:
        connection, _ = server.accept()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            handle(connection, own_environment)
        connection.close()


if __name__ == "__main__":
    end_with_parent()
    environment_at_start = dict(os.environ)  # before tfdist's import sets its own defaults
    import_like_a_recipe()
    serve(sys.argv[1], environment_at_start)
