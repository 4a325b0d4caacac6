"""How busy the machine was with other work while the benchmark ran.

On a shared machine the same benchmark gives different speeds from one
minute to the next. The report says how much of the CPU other processes
took during the measurement, so a reader can tell a quiet run from a
disturbed one. Linux only (`/proc/stat`); elsewhere nothing is reported.
"""

import os
import resource
import time


def others_share(busy_cpu_seconds, own_cpu_seconds, wall_seconds, cores):
    """Fraction of the machine's CPU time used by other processes.

    Args:
        busy_cpu_seconds: CPU seconds all processes used (from /proc/stat).
        own_cpu_seconds: CPU seconds this process and its finished
            children used.
        wall_seconds: length of the window, > 0.
        cores: logical CPUs, >= 1.

    Returns:
        `(busy - own) / (wall * cores)`, clamped to `[0, 1]`.

    Example:

    >>> others_share(busy_cpu_seconds=30.0, own_cpu_seconds=10.0, wall_seconds=20.0, cores=2)
    0.5
    """
    if not wall_seconds > 0 or not cores >= 1:
        raise ValueError(f"wall_seconds must be > 0 and cores >= 1, got {wall_seconds!r} and "
                         f"{cores!r}.")
    return min(1.0, max(0.0, (busy_cpu_seconds - own_cpu_seconds) / (wall_seconds * cores)))


def _busy_cpu_seconds(stat_path="/proc/stat"):
    with open(stat_path) as stream:
        fields = stream.readline().split()
    if not fields or fields[0] != "cpu":
        raise OSError(f"{stat_path} does not start with a 'cpu' line")
    ticks = [int(value) for value in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    # guest time is already counted in user time.
    total = sum(ticks[:8])
    return (total - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class LoadMonitor:
    """Measures what other processes took of the CPU between `start` and `stop`.

    "Own" CPU time is this process's and that of its children that have
    exited (a sweep point's processes count as its own once they are done).

    Args:
        none.

    Example:

    >>> monitor = LoadMonitor().start()
    >>> ...  # the benchmark
    >>> monitor.stop()
    {'wall_seconds': 61.2, 'cores': 2, 'busy_share': 0.97, 'own_share': 0.71,
     'others_share': 0.26, 'load_average_1min': 2.9}
    """

    def __init__(self):
        self._start = None

    def start(self):
        """Starts the window; returns self (see the class example)."""
        try:
            self._start = (time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds())
        except (OSError, ValueError, IndexError):
            self._start = None
        return self

    def stop(self):
        """Ends the window; returns the shares (see the class example; an
        empty dict where /proc is missing)."""
        if self._start is None:
            return {}
        try:
            now, busy, own = time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds()
        except (OSError, ValueError, IndexError):
            return {}
        wall = max(now - self._start[0], 1e-9)
        cores = os.cpu_count() or 1
        busy_delta, own_delta = busy - self._start[1], own - self._start[2]
        return {"wall_seconds": wall, "cores": cores,
                "busy_share": min(1.0, max(0.0, busy_delta / (wall * cores))),
                "own_share": min(1.0, max(0.0, own_delta / (wall * cores))),
                "others_share": others_share(busy_delta, own_delta, wall, cores),
                "load_average_1min": os.getloadavg()[0]}
