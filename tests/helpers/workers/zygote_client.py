"""`python -m MODULE ARGS` or `python SCRIPT.py ARGS` as a process of its own
whose run is forked from a fork server (zygote_server.py) that has TensorFlow
imported: the client half of the suite's forking, for the processes a test or
tfdist's launcher starts and then signals.

    python tests/helpers/workers/zygote_client.py -m tfdist.recipes.transformer --epochs 1
    python tests/helpers/workers/zygote_client.py tests/helpers/workers/train_worker.py --out d

The server is the one at $TFDIST_TEST_ZYGOTE_SOCKET (helpers.zygote.forked_command
sets it). This process (Python without TensorFlow, a few tens of milliseconds)
hands the server its own stdout and stderr, environment, working directory
and arguments; the server forks the run, which writes straight into them.
The client then stands for the run:

- SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to it (or to its
  process group, as the launcher does) are passed on to the run;
- SIGKILL ends it, and the server then kills the run (it watches the connection);
- it exits as the run did: the same exit code, or killed by the same signal.

Without the variable, for another command (`-c`, a non-Python program), or
when the server's start-up environment differs from this one in a variable
read while Python, TensorFlow or Keras start, it becomes a fresh interpreter
running the command (`exec`), as if the client were not there.
"""

import os
import resource
import signal
import socket
import sys

from zygote_protocol import SOCKET_VARIABLE, message, read_message, run_target

RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
           signal.SIGUSR2)


def run_fresh(argv, mask):
    """Becomes `python ARGV` (the signal mask as it was at start); never returns.

    Example: `run_fresh(["-m", "tfdist.recipes.cnn"], signal.pthread_sigmask(signal.SIG_BLOCK, []))`
    """
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.execv(sys.executable, [sys.executable, *argv])


def request_for(argv):
    """The server's request for `python ARGV`, or None when only a fresh interpreter can run it.

    Example: `request_for(["-m", "tfdist.recipes.cnn", "--epochs", "1"])["module"]`
    """
    target = run_target(argv)
    if target is None or ("path" in target and not os.path.isfile(target["path"])):
        return None  # a missing script: a fresh python says so, as it would
    env = {name: value for name, value in os.environ.items() if name != SOCKET_VARIABLE}
    return dict(target, env=env, cwd=os.getcwd())


def end_as(status):
    """Exits as a process with wait status `status` did; never returns.

    Example: `end_as(os.waitpid(pid, 0)[1])`
    """
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)  # pylint: disable=protected-access
    signum = -code
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the run dumped its core, if it could
    if signum not in (signal.SIGKILL, signal.SIGSTOP):  # the two no process can catch or block
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # pylint: disable=protected-access  # a signal it could not take


def main(argv):
    """Runs `python ARGV` forked (or fresh) and ends as it ends.

    Example: `main(["-m", "tfdist.recipes.cnn", "--epochs", "1"])`
    """
    # Held until the run's pid is known, then passed on.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)
    path, request = os.environ.get(SOCKET_VARIABLE), request_for(argv)
    if not path or request is None:
        run_fresh(argv, mask)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
        socket.send_fds(connection, [message(request)], [sys.stdout.fileno(), sys.stderr.fileno()])
        buffer = [b""]
        answer = read_message(connection, buffer)
    except OSError:  # the server is gone (closed by its pytest worker): start fresh
        connection.close()
        run_fresh(argv, mask)
    if "refused" in answer:
        connection.close()
        run_fresh(argv, mask)
    pid = answer["pid"]
    for signum in RELAYED:
        signal.signal(signum, lambda number, _frame: os.kill(pid, number))
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        status = read_message(connection, buffer)["status"]
    except ConnectionError:
        sys.stderr.write(f"zygote_client: the fork server's handler of run {pid} ended without "
                         "its exit status\n")
        os._exit(1)  # pylint: disable=protected-access
    end_as(status)


if __name__ == "__main__":
    main(sys.argv[1:])
