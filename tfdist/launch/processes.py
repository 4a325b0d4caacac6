"""Worker processes: start each in its own process group, signal whole groups,
and describe how a process ended.
"""

import ctypes
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _die_with_parent(parent_pid):
    """Returns a preexec_fn asking Linux to SIGKILL the child when the launcher
    dies, even by SIGKILL (a launcher killed that way cannot stop its workers)."""
    def preexec():
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the launcher died before prctl
            os._exit(1)
    return preexec


def start_worker(command, env):
    """Starts `command` in a new session (its own process group) with piped
    stdout and stderr and no stdin. On Linux the process is also SIGKILLed
    when the launcher dies, so a launcher killed with SIGKILL leaves no worker
    behind (what the worker itself started is not covered).

    Args:
        command: the argument list, e.g. ["python", "train.py"].
        env: the full environment of the process.

    Returns:
        The `subprocess.Popen`; its pid is also its process group id.

    Raises:
        OSError: the command cannot be started (e.g. FileNotFoundError).

    Example:

    >>> proc = start_worker(["true"], {})
    >>> proc.wait()
    0
    """
    return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True,
                            preexec_fn=_die_with_parent(os.getpid()) if _PRCTL else None)


def signal_group(proc, signum):
    """Sends `signum` to the process group of `proc` (the worker and anything it
    started). A group that no longer exists is ignored.

    Args:
        proc: a `subprocess.Popen` from `start_worker`.
        signum: e.g. `signal.SIGTERM`.

    Example:

    >>> proc = start_worker(["sleep", "30"], {})
    >>> signal_group(proc, signal.SIGKILL); proc.wait()
    -9
    """
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def exit_status(returncode):
    """Maps a `Popen.returncode` to a shell exit status: the code itself, or
    128 + N for a process killed by signal N.

    Args:
        returncode: `Popen.returncode` (negative for a signal).

    Example:

    >>> exit_status(3), exit_status(-9)
    (3, 137)
    """
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode):
    """Returns how a process ended, in words.

    Args:
        returncode: `Popen.returncode` (negative for a signal).

    Example:

    >>> describe_exit(3), describe_exit(-9)
    ('exit code 3', 'signal 9 (SIGKILL), exit status 137')
    """
    if returncode >= 0:
        return f"exit code {returncode}"
    return (f"signal {-returncode} ({signal_name(-returncode)}), "
            f"exit status {exit_status(returncode)}")


def signal_name(signum):
    """Returns the name of signal `signum`, e.g. "SIGTERM".

    Args:
        signum: a signal number.

    Example:

    >>> signal_name(15)
    'SIGTERM'
    """
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
