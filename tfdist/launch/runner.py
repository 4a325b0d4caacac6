"""`launch`: start N localhost workers of one command and supervise them until
they all succeed, one fails, a deadline passes or the launcher is signalled.
"""

import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time

from tfdist.launch import cluster as cluster_lib
from tfdist.launch import gpus as gpus_lib
from tfdist.launch import processes
from tfdist.launch.output import OutputPump, Sink
from tfdist.stop_signals import PREEMPTED_EXIT_CODE

EXIT_TIMEOUT = 124
"""Exit status when the job deadline (`timeout`) passes."""
EXIT_STARTUP_TIMEOUT = 125
"""Exit status when a worker is not ready by the start-up deadline."""
EXIT_CANNOT_START = 127
"""Exit status when the command cannot be started (e.g. not found)."""

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals to the launcher that are forwarded to the workers before stopping."""

TICK = 0.05
DRAIN_SECONDS = 2.0
MESSAGE_PREFIX = "tfdist.launch: "
DEFAULT_GRACE_PERIOD = 30.0
"""Seconds workers get to save a backup and exit after SIGTERM (Kubernetes' default)."""
NOT_RESTARTED = (EXIT_TIMEOUT, EXIT_CANNOT_START, 126)
"""Job outcomes a restart cannot mend: the job deadline, a command that cannot start."""


def launch(command, workers, *, devices_per_worker=None, gpus_per_worker=None,
           startup_timeout=300.0, timeout=None, host="127.0.0.1", output=None, errors=None,
           env=None, grace_period=DEFAULT_GRACE_PERIOD, max_restarts=0):
    """Runs `command` as `workers` localhost workers and returns the exit status.

    Each worker gets TF_CONFIG for a cluster of `workers` workers on `host`
    (worker 0 is the chief), TFDIST_RANK, TFDIST_WORLD_SIZE,
    TFDIST_READY_FILE, PYTHONUNBUFFERED=1 and, when given,
    TFDIST_DEVICES_PER_WORKER and a CUDA_VISIBLE_DEVICES of its own GPUs
    (`gpus_per_worker`, see `tfdist.launch.gpus`). Every line a worker prints is written to
    `output` (its stdout) or `errors` (its stderr) prefixed "[worker i] ".

    When a worker exits non-zero or is killed by a signal, the others get
    SIGTERM, then SIGKILL after `grace_period` seconds, and the failed worker's
    status is returned (128 + N for signal N). A worker that exits with
    `PREEMPTED_EXIT_CODE` (143: it saved its backup after SIGTERM/SIGINT) is
    not a failure of the others: they stop at the same step, so the launcher
    waits up to `grace_period` for them. SIGINT and SIGTERM sent to the
    launcher (when called from the main thread) are forwarded to the workers,
    followed by the same shutdown, and 128 + N is returned (SIGHUP too, so
    closing the terminal stops the job).

    With `max_restarts=N`, a job that ended with a failed or preempted worker
    or a missed start-up deadline is started again (new ports, the same
    command, which resumes from its backups), up to N times, each restart
    announced with its reason. A signal to the launcher, the job deadline and
    a command that cannot start are not restarted.

    Args:
        command: the worker command as a non-empty list of strings.
        workers: the number of workers, an int >= 1.
        devices_per_worker: exported as TFDIST_DEVICES_PER_WORKER (int >= 1),
            or None to leave it unset.
        gpus_per_worker: GPUs of its own for each worker (int >= 1): worker i
            gets the i-th group of that many of the launcher's GPUs as its
            CUDA_VISIBLE_DEVICES; more than there are is a ValueError. None
            (default): every worker sees every GPU.
        startup_timeout: seconds within which every worker must create its
            TFDIST_READY_FILE or exit 0; 0 or None disables the check.
            Failing it returns `EXIT_STARTUP_TIMEOUT` (125).
        timeout: the job deadline in seconds; 0 or None means none. Passing it
            returns `EXIT_TIMEOUT` (124).
        host: the loopback address the workers listen on.
        output: text stream for the workers' stdout (default `sys.stdout`).
        errors: text stream for the workers' stderr and the launcher's own
            messages (default `sys.stderr`).
        env: the base environment of the workers (default `os.environ`). A
            TF_CONFIG in it is replaced, with a note on `errors`.
        grace_period: seconds between SIGTERM and SIGKILL when stopping
            (default 30: time for every worker to save its backup).
        max_restarts: how many times a failed job is started again (an int
            >= 0; torchrun's name).

    Returns:
        0 when every worker exited 0; otherwise the failure's exit status.

    Raises:
        ValueError: a bad argument (the message names it and what is allowed).

    Example:

    >>> import sys
    >>> launch([sys.executable, "-c", "import os; print(os.environ['TFDIST_RANK'])"],
    ...        workers=2)  # doctest: +SKIP
    [worker 0] 0
    [worker 1] 1
    0
    """
    command = _check_command(command)
    workers = _check_count("workers", workers)
    if devices_per_worker is not None:
        devices_per_worker = _check_count("devices_per_worker", devices_per_worker)
    if gpus_per_worker is not None:
        gpus_per_worker = _check_count("gpus_per_worker", gpus_per_worker)
    startup_timeout = _check_seconds("startup_timeout", startup_timeout)
    timeout = _check_seconds("timeout", timeout)
    grace_period = _check_seconds("grace_period", grace_period) or 0.0
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}.")
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty address such as '127.0.0.1', got {host!r}.")
    out = Sink(sys.stdout if output is None else output)
    err = Sink(sys.stderr if errors is None else errors)
    base_env = dict(os.environ if env is None else env)
    gpu_groups = [None] * workers
    if gpus_per_worker is not None:
        gpu_groups = gpus_lib.assign_gpus(gpus_lib.visible_gpus(base_env), workers,
                                          gpus_per_worker)

    if "TF_CONFIG" in base_env:
        err.write_line(MESSAGE_PREFIX + "TF_CONFIG from the environment is replaced "
                       "by the launcher's localhost cluster for each worker.")
    if gpus_per_worker is not None:
        err.write_line(MESSAGE_PREFIX + "GPUs per worker: " + "; ".join(
            f"worker {rank}: {','.join(group)}" for rank, group in enumerate(gpu_groups)))
    started = time.monotonic()
    restarts = 0
    while True:
        remaining = None if not timeout else max(timeout - (time.monotonic() - started), 0.001)
        job = _run_once(command, workers, host, base_env, devices_per_worker, gpu_groups,
                        startup_timeout, remaining, out, err, grace_period)
        status = job.status
        if (status == 0 or restarts >= max_restarts or job.signals
                or status in NOT_RESTARTED):
            if status != 0 and max_restarts and restarts >= max_restarts and not job.signals:
                err.write_line(MESSAGE_PREFIX + f"no restart left (--max-restarts "
                               f"{max_restarts} used); exit status {status}.")
            return status
        restarts += 1
        err.write_line(MESSAGE_PREFIX + f"restart {restarts} of {max_restarts}: the job ended "
                       f"with {job.reason}; starting it again (it resumes from its backups).")


def _run_once(command, workers, host, base_env, devices_per_worker, gpu_groups,
              startup_timeout, timeout, out, err, grace_period):
    """Starts the workers on fresh ports and supervises them; returns the `_Job`."""
    ports = cluster_lib.free_ports(workers, host)
    cluster = cluster_lib.cluster_spec(host, ports)
    ready_dir = tempfile.mkdtemp(prefix="tfdist-launch-")
    try:
        ready_files = [os.path.join(ready_dir, f"worker-{rank}.ready")
                       for rank in range(workers)]
        worker_deadline = cluster_lib.worker_startup_timeout(startup_timeout)
        envs = [cluster_lib.worker_env(base_env, cluster, rank, ready_files[rank],
                                       devices_per_worker, worker_deadline,
                                       gpus=gpu_groups[rank])
                for rank in range(workers)]
        err.write_line(MESSAGE_PREFIX + f"starting {workers} worker(s) on "
                       f"{', '.join(cluster['worker'])}: {shlex.join(command)}")
        job = _Job(command, envs, ready_files, out, err, grace_period)
        job.status = job.run(startup_timeout, timeout)
        return job
    finally:
        shutil.rmtree(ready_dir, ignore_errors=True)


class _Job:
    """The supervising loop of one launch."""

    def __init__(self, command, envs, ready_files, out, err, grace_period):
        self.command = command
        self.envs = envs
        self.ready_files = ready_files
        self.out = out
        self.err = err
        self.grace_period = grace_period
        self.procs = []
        self.pump = OutputPump()
        self.signals = []
        self.status = None
        self.reason = None

    def say(self, text):
        self.err.write_line(MESSAGE_PREFIX + text)

    def run(self, startup_timeout, timeout):
        previous = self._install_signal_handlers()
        try:
            status = self._start()
            if status is None:
                status = self._supervise(startup_timeout, timeout)
            return status
        finally:
            self._cleanup()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in FORWARDED_SIGNALS:
            previous[signum] = signal.signal(
                signum, lambda received, frame: self.signals.append(received))
        return previous

    def _start(self):
        for rank, env in enumerate(self.envs):
            try:
                proc = processes.start_worker(self.command, env)
            except OSError as error:
                self.say(f"cannot start worker {rank} ({shlex.join(self.command)}): "
                         f"{error}; stopping the workers already started.")
                self._stop(signal.SIGTERM)
                return 126 if isinstance(error, PermissionError) else EXIT_CANNOT_START
            self.procs.append(proc)
            self.pump.add(proc.stdout, f"[worker {rank}] ", self.out)
            self.pump.add(proc.stderr, f"[worker {rank}] ", self.err)
        return None

    def _supervise(self, startup_timeout, timeout):
        started = time.monotonic()
        ready = [False] * len(self.procs)
        while True:
            self.pump.poll(TICK)
            if self.signals:
                signum = self.signals[0]
                self.say(f"received {processes.signal_name(signum)}; forwarding it to "
                         "the workers and stopping them.")
                self._stop(signum)
                return 128 + signum
            codes = [proc.poll() for proc in self.procs]
            for rank, code in enumerate(codes):
                if code == PREEMPTED_EXIT_CODE:
                    self.reason = f"worker {rank} preempted (exit {code}, backup written)"
                    self.say(f"worker {rank} stopped after SIGTERM/SIGINT with its backup "
                             "written; waiting for the others, which stop at the same step.")
                    self._stop(None)
                    return code
                if code is not None and code != 0:
                    self.reason = f"worker {rank} failed ({processes.describe_exit(code)})"
                    self.say(f"worker {rank} failed with {processes.describe_exit(code)}; "
                             "stopping the other workers.")
                    self._stop(signal.SIGTERM)
                    return processes.exit_status(code)
            if all(code == 0 for code in codes):
                return 0
            elapsed = time.monotonic() - started
            if startup_timeout and not all(ready):
                ready = [r or code == 0 or os.path.exists(path)
                         for r, code, path in zip(ready, codes, self.ready_files)]
                if not all(ready) and elapsed > startup_timeout:
                    late = [rank for rank, r in enumerate(ready) if not r]
                    self.reason = f"worker(s) {', '.join(map(str, late))} not ready in time"
                    self.say(f"worker(s) {', '.join(map(str, late))} did not become ready "
                             f"within the start-up deadline of {startup_timeout:g}s "
                             "(no TFDIST_READY_FILE created and not exited 0); "
                             "stopping all workers.")
                    self._stop(signal.SIGTERM)
                    return EXIT_STARTUP_TIMEOUT
            if timeout and elapsed > timeout:
                self.say(f"job deadline of {timeout:g}s (--timeout) exceeded; "
                         "stopping all workers.")
                self._stop(signal.SIGTERM)
                return EXIT_TIMEOUT

    def _stop(self, signum):
        """Sends `signum` to every worker group (None: sends nothing, the
        workers are stopping), waits the grace period (cut short by another
        signal to the launcher), then SIGKILLs the rest."""
        if signum is not None:
            for proc in self.procs:
                processes.signal_group(proc, signum)
        seen = len(self.signals)
        deadline = time.monotonic() + self.grace_period
        while (any(proc.poll() is None for proc in self.procs)
               and time.monotonic() < deadline and len(self.signals) <= seen):
            self.pump.poll(TICK)
        stubborn = [rank for rank, proc in enumerate(self.procs) if proc.poll() is None]
        if stubborn:
            after = processes.signal_name(signum) if signum is not None else "the first one stopped"
            self.say(f"worker(s) {', '.join(map(str, stubborn))} still running "
                     f"{self.grace_period:g}s after {after}; sending SIGKILL.")
        for proc in self.procs:
            processes.signal_group(proc, signal.SIGKILL)

    def _cleanup(self):
        """Reaps every worker, writes the rest of their output and makes sure
        nothing they started is left running."""
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - never leave without trying the rest
                processes.signal_group(proc, signal.SIGKILL)
        # Anything a worker started in its group outlives it only as an orphan
        # (possibly holding the worker's pipes open): stop it too.
        for proc in self.procs:
            processes.signal_group(proc, signal.SIGKILL)
        self.pump.drain(DRAIN_SECONDS)
        self.pump.close()


def _check_command(command):
    if (isinstance(command, (str, bytes)) or not command
            or not all(isinstance(part, str) for part in command)):
        raise ValueError("command must be a non-empty list of strings such as "
                         f"['python', 'train.py'], got {command!r}.")
    return list(command)


def _check_count(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    return value


def _check_seconds(name, value):
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0 "
                         f"(0 disables it) or None, got {value!r}.")
    return float(value) or None
