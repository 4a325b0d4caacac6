"""One run owns a model directory: an advisory lock file in it.

`DIR/.tfdist.lock` is locked with `fcntl.flock` by the run that writes into
`DIR` (the chief of a cluster, or a single process) and holds who that is
(host, pid, command, start time) as JSON. The kernel releases a `flock` when
the process ends in any way (SIGKILL and out-of-memory kills included), so the
lock is never stale: the file stays behind, but only a held lock counts.

The lock is advisory: it stops other tfdist runs, not other programs. On
local disks it always works. On NFS it works only where the file system
forwards locks to the server (NFSv4, or NFSv3 with `lockd`; not with the
`nolock` or `local_lock=flock` mount options, which keep locks on one host);
Lustre needs the `flock` mount option (with `localflock` locks are per node).
Where the file system refuses locks, `acquire` warns and goes on without one.

Example:

    lock = acquire("runs/a", command="python -m tfdist.recipes.cnn --model-dir runs/a")
    ...           # train; the lock is released when the process ends
    lock.release()
"""

import errno
import fcntl
import json
import logging
import os
import socket
import time

LOCK_FILE = ".tfdist.lock"

logger = logging.getLogger("tfdist")


class ModelDirInUseError(ValueError):
    """Another run holds the lock of the model directory; the message names it.

    Example:

        try:
            lock = acquire("runs/lm", "python -m tfdist.recipes.transformer")
        except ModelDirInUseError as error:
            print(error)  # names the directory and the run that holds it
    """


class RunLock:
    """A held lock on a directory (see `acquire`).

    Attributes:
        path: the lock file.
        holder: what this process wrote into it (host, pid, command, started).

    Example:

    >>> lock = acquire("runs/a", command="train")
    >>> lock.holder["pid"] == os.getpid()
    True
    """

    def __init__(self, path, fd, holder):
        self.path = path
        self.holder = holder
        self._fd = fd

    def release(self):
        """Releases the lock (the kernel does it anyway when the process ends).

        Example:

        >>> acquire("runs/a", command="train").release()
        """
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def acquire(directory, command):
    """Takes the lock of `directory` (created if missing) for this process.

    Args:
        directory: the model directory.
        command: the command line to name this run by.

    Returns:
        A `RunLock`, or None when the file system does not support locks (a
        warning says so).

    Raises:
        ModelDirInUseError: another process holds the lock; the message
            names it (host, pid, command, start time) and the way out.
        OSError: the directory or the lock file cannot be created
            (read-only, a file in the way, no permission, no space).

    Example:

    >>> lock = acquire("runs/a", command="python -m tfdist.recipes.cnn --model-dir runs/a")
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise ModelDirInUseError(_in_use_message(directory, path, holder)) from None
    except OSError as error:
        os.close(fd)
        if error.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        logger.warning("%s cannot be locked on this file system (%s): another run on the same "
                       "folder would not be noticed; make sure there is none.", path,
                       error.strerror)
        return None
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "command": command,
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    return RunLock(path, fd, holder)


def _read_holder(fd):
    try:
        return json.loads(os.pread(fd, 65536, 0).decode() or "null")
    except (OSError, ValueError):
        return None


def _in_use_message(directory, path, holder):
    if isinstance(holder, dict):
        who = (f"pid {holder.get('pid')} on {holder.get('host')}, started "
               f"{holder.get('started')}: {holder.get('command')}")
    else:
        who = "a process that has not written its name yet"
    return (f"the model dir {directory} is in use by another run ({who}; lock {path}). "
            "Wait for it to end or stop it, or use another --model-dir.")
