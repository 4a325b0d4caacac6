"""`python -m MODULE ARGS` in a fresh process, without paying for TensorFlow's import each time.

Every recipe run a test starts imports tfdist, TensorFlow and Keras before
it does anything else: 2-3 s of CPU here, twice that on slower machines,
for each of the suite's recipe runs. `run_module` instead asks a server
process of this pytest worker (tests/helpers/workers/zygote_server.py),
which made those imports once, to fork: the fork then runs the module as
`python -m` would, in its own process, with the request's argv, environment
and working directory, its own stdout and stderr, pid and exit code.

A run takes a fresh interpreter instead (`subprocess.run`) when its
environment differs from the server's in a variable read while TensorFlow,
Keras or Python start (`IMPORT_TIME_PREFIXES`), when its arguments set
TensorFlow's log level (`--tf-log-level`, applied at import), or when
`TFDIST_TEST_ZYGOTE=off`. Tests about what happens at start-up (the quiet
TensorFlow import, what is imported at all) start their processes
themselves.

A process a test signals, or that tfdist's launcher starts as a worker, must
be a real child of its parent: `forked_command` turns its command into one
of a small client (tests/helpers/workers/zygote_client.py) that has the
server fork the run and stands for it (signals passed on, the run's exit
code or signal as its own).

Example:

    result = run_module("tfdist.recipes.cnn", ["--epochs", "1"], env=env, cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, result.stdout
    command, env = forked_command([sys.executable, "-m", "tfdist.recipes.cnn"], env, REPO_ROOT)
    process = subprocess.Popen(command, env=env, cwd=REPO_ROOT)
"""

import atexit
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from helpers.paths import WORKERS_DIR
from helpers.workers.zygote_protocol import (SOCKET_VARIABLE, import_time_environment, message,
                                             read_message, run_target)

SERVER = os.path.join(WORKERS_DIR, "zygote_server.py")
CLIENT = os.path.join(WORKERS_DIR, "zygote_client.py")
IMPORT_TIME_FLAGS = ("--tf-log-level",)
SERVER_START_DEADLINE = 180


class _Server:
    """This pytest worker's server process and the environment it imported with."""

    def __init__(self, env, cwd):
        self.directory = tempfile.mkdtemp(prefix="tfdist-zygote-")
        self.path = os.path.join(self.directory, "socket")
        self.environment = import_time_environment(env)
        self.errors = tempfile.TemporaryFile(mode="w+")  # TensorFlow's start-up lines, kept for a failure
        self.process = subprocess.Popen([sys.executable, SERVER, self.path], cwd=cwd, env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=self.errors, text=True)
        ready, _, _ = select.select([self.process.stdout], [], [], SERVER_START_DEADLINE)
        line = self.process.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.close()
            self.errors.seek(0)
            raise RuntimeError(f"the zygote server did not say ready within {SERVER_START_DEADLINE} s "
                               f"(exit code {self.process.returncode}): {line}{self.errors.read()[-3000:]}")
        atexit.register(self.close)

    def close(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if os.path.exists(self.path):
            os.unlink(self.path)
        if os.path.isdir(self.directory):  # closed once already (by a test, then at exit)
            os.rmdir(self.directory)

    @property
    def alive(self):
        return self.process.poll() is None


# This pytest worker's servers, by the import-time environment they started with,
# least recently used first.
_SERVERS = {}
MAX_SERVERS = 4


def _server_for(env, cwd):
    """The server that can fork a run with `env`, started on first use (closing the least
    recently used one when MAX_SERVERS run already); None when forking is off."""
    if os.environ.get("TFDIST_TEST_ZYGOTE") == "off":
        return None
    key = tuple(sorted(import_time_environment(env).items()))
    server = _SERVERS.pop(key, None)
    if server is None or not server.alive:  # the key is the environment: only its life to check
        if server is not None:
            server.close()
        while len(_SERVERS) >= MAX_SERVERS:
            _SERVERS.pop(next(iter(_SERVERS))).close()
        server = _Server(env, cwd)
    _SERVERS[key] = server  # now the most recently used
    return server


def _as_text(chunks):
    """The bytes read, decoded as `text=True` would: universal newlines."""
    text = b"".join(chunks).decode("utf-8", "replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_all(fd, chunks):
    with os.fdopen(fd, "rb") as stream:
        for chunk in iter(lambda: stream.read1(1 << 16), b""):
            chunks.append(chunk)


def _line(connection, buffer, deadline):
    return read_message(connection, buffer, max(deadline - time.monotonic(), 0.001))


def _sets_an_import_time_flag(args):
    """Whether `args` set something applied while TensorFlow is imported (`--tf-log-level`)."""
    return any(arg.split("=")[0] in IMPORT_TIME_FLAGS for arg in args)


def forked_command(command, env, cwd, run_env=None):
    """`(command, env)` that starts `command` as a process whose run is forked from a
    server of this pytest worker (zygote_client.py), when it can be.

    `command` is `[sys.executable, "-m", MODULE, ...]` or `[sys.executable,
    SCRIPT, ...]`; any other command, or one that sets TensorFlow's log level,
    is returned unchanged, as when `TFDIST_TEST_ZYGOTE=off`. `run_env` is the
    environment the run itself will see when it differs from `env` (tfdist's
    launcher adds its own variables to its workers'): the server is the one
    for that environment. The client starts a fresh interpreter when the
    server is gone or refuses its environment.

    Example:

        command, env = forked_command([sys.executable, "-m", "tfdist.recipes.cnn"], env, REPO_ROOT)
        process = subprocess.Popen(command, env=env, cwd=REPO_ROOT)
    """
    forkable = command[:1] == [sys.executable] and run_target(command[1:]) is not None
    if not forkable or _sets_an_import_time_flag(command):
        return list(command), dict(env)
    server = _server_for(run_env if run_env is not None else env, cwd)
    if server is None:
        return list(command), dict(env)
    return [sys.executable, CLIENT, *command[1:]], dict(env, **{SOCKET_VARIABLE: server.path})


def run_module(module, args, env, cwd, timeout, fork=True):
    """`subprocess.run([python, "-m", module, *args], env=env, cwd=cwd, timeout=timeout,
    stdout=PIPE, stderr=STDOUT, text=True)`, forked from this worker's server when it can be.

    Returns the `subprocess.CompletedProcess` (stdout and stderr merged, as
    text); raises `subprocess.TimeoutExpired` after killing the run, as
    `subprocess.run` does. `fork=False` always starts a fresh interpreter.

    Example: `run_module("tfdist.recipes.cnn", ["--epochs", "1"], env, REPO_ROOT, 300).returncode`
    """
    command = [sys.executable, "-m", module, *args]
    server = _server_for(env, cwd) if fork and not _sets_an_import_time_flag(args) else None
    if server is None:
        return subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    deadline = time.monotonic() + timeout
    read_fd, write_fd = os.pipe()
    chunks = []
    reader = threading.Thread(target=_read_all, args=(read_fd, chunks), daemon=True)
    reader.start()
    request = {"module": module, "args": list(args), "env": dict(env), "cwd": str(cwd)}
    pid = None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(server.path)
        socket.send_fds(connection, [message(request)], [write_fd, write_fd])
        os.close(write_fd)
        buffer = [b""]
        try:
            pid = _line(connection, buffer, deadline)["pid"]  # never refused: its own server
            status = _line(connection, buffer, deadline)["status"]
        except socket.timeout:
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            reader.join(10)
            raise subprocess.TimeoutExpired(command, timeout,
                                            output=_as_text(chunks))
    reader.join(max(deadline - time.monotonic(), 1))
    return subprocess.CompletedProcess(command, os.waitstatus_to_exitcode(status), _as_text(chunks))
