"""A process that has imported tfdist, TensorFlow and Keras once and forks a
fresh run of a module for each request (the server half of tests/helpers/zygote.py).

    python tests/helpers/workers/zygote_server.py SOCKET_PATH

Imports as a recipe does (`import tfdist`, then TensorFlow through
`tfdist.runtime.tf_logging.import_tensorflow` and Keras), without starting
TensorFlow's runtime, then prints "ready" and serves on the Unix socket
SOCKET_PATH. A request is one JSON line (`module`, `args`, `env`, `cwd`) sent
with the file descriptors for the run's stdout and stderr. The server forks
a handler for it, which forks the run and writes two JSON lines back: the
run's pid as soon as it starts, then its wait status when it ends. The run
itself is what `python -m MODULE ARGS` would do from there: `runpy` runs the
module as `__main__` with the request's argv, environment and working
directory, and the interpreter's own exit (atexit handlers, flushing, the
exit code or the traceback) ends it.

The server ends when the process that started it ends (Linux's parent-death
signal), or on SIGTERM.
"""

import ctypes
import importlib
import json
import os
import random
import runpy
import signal
import socket
import sys

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
    sys.argv = [request["module"], *request["args"]]
    sys.path[0] = request["cwd"]  # `python -m` puts the working directory first
    random.seed()  # a fork shares its parent's random state; a fresh process would not
    import numpy

    numpy.random.seed()
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)


def handle(connection):
    """Forks the run of one request, reports its pid and then its wait status; never returns."""
    request, fds = receive_request(connection)
    pid = os.fork()
    if pid == 0:
        connection.close()
        become_the_run(request, fds)
    for fd in fds:
        os.close(fd)
    connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    try:
        connection.sendall(json.dumps({"status": status}).encode() + b"\n")
    finally:
        os._exit(0)  # pylint: disable=protected-access  # a forked handler: no cleanup of the server's


def serve(socket_path):
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
            handle(connection)
        connection.close()


if __name__ == "__main__":
    end_with_parent()
    import_like_a_recipe()
    serve(sys.argv[1])
