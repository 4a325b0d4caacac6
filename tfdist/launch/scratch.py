"""The launcher's temporary folders (its workers' ready files), and the removal
of those left behind by launchers that were killed.

A launcher removes its folder when it ends; one killed with SIGKILL cannot.
Each folder is named `tfdist-launch-PID-XXXXXXXX` after the launcher that made
it and holds an `owner` file saying which process that was (its pid, when it
started, the boot and the pid namespace). At its next start a launcher removes
the folders whose owner is gone, and never one whose owner may still run: a
folder of another user, of another pid namespace (another container sharing
/tmp), without a readable owner file, or whose pid runs the process that made
it, is kept.
"""

import json
import os
import shutil
import tempfile

PREFIX = "tfdist-launch-"
OWNER_FILE = "owner"


def make_ready_dir(directory=None):
    """Creates this launcher's temporary folder and its owner file.

    Args:
        directory: where (default: `tempfile.gettempdir()`).

    Returns:
        The folder's path, `TMPDIR/tfdist-launch-PID-XXXXXXXX`.

    Example:

    >>> folder = make_ready_dir()
    >>> os.path.basename(folder).startswith(f"tfdist-launch-{os.getpid()}-")
    True
    """
    folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=directory)
    with open(os.path.join(folder, OWNER_FILE), "w") as stream:
        json.dump(process_identity(os.getpid()), stream)
    return folder


def remove_stale_ready_dirs(directory=None):
    """Removes the temporary folders of launchers that are no longer running.

    Args:
        directory: where to look (default: `tempfile.gettempdir()`, where
            `make_ready_dir` creates them).

    Returns:
        The paths removed, sorted.

    Example:

    >>> remove_stale_ready_dirs()   # after a launcher was SIGKILLed
    ['/tmp/tfdist-launch-4711-k2j3h4g5']
    """
    directory = directory or tempfile.gettempdir()
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        path = os.path.join(directory, name)
        if name.startswith(PREFIX) and _is_stale(path):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(path)
    return removed


def _is_stale(path):
    """Whether the launcher that made `path` is certainly gone."""
    try:
        if not os.path.isdir(path) or os.path.islink(path) or os.stat(path).st_uid != os.getuid():
            return False
        with open(os.path.join(path, OWNER_FILE)) as stream:
            owner = json.load(stream)
        pid = int(owner["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False  # no owner file yet (being made), or not ours to judge
    if pid == os.getpid():
        return False
    here = process_identity(os.getpid())
    if owner.get("boot") and here["boot"] and owner["boot"] != here["boot"]:
        return True  # made before the machine last started
    if owner.get("pid_namespace") != here["pid_namespace"]:
        return False  # another container's processes are not visible from here
    now = process_identity(pid)
    if not now["alive"]:
        return True
    # A live pid is the owner unless it started at another time (a reused pid).
    return owner.get("started") is not None and now["started"] != owner["started"]


def process_identity(pid):
    """What identifies process `pid`: its start time, the boot, the pid namespace.

    A pid alone is reused; with its start time, the boot id and the pid
    namespace it names one process, so a stale owner file is told apart from
    a live launcher.

    Example:

    >>> sorted(process_identity(os.getpid()))
    ['alive', 'boot', 'pid', 'pid_namespace', 'started']
    """
    return {"pid": pid, "alive": _alive(pid), "started": _start_time(pid),
            "boot": _read("/proc/sys/kernel/random/boot_id"),
            "pid_namespace": _link("/proc/self/ns/pid")}


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_time(pid):
    """Clock ticks since boot when `pid` started (/proc/PID/stat field 22), or None."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    try:
        return int(stat.rpartition(")")[2].split()[19])
    except (IndexError, ValueError):
        return None


def _read(path):
    try:
        with open(path) as stream:
            return stream.read().strip()
    except OSError:
        return None


def _link(path):
    try:
        return os.readlink(path)
    except OSError:
        return None
