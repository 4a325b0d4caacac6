"""`launch`: start N localhost workers of one command and supervise them until
they all succeed, one fails, a deadline passes or the launcher is signalled.

With ps tasks (`launch(..., ps=M)`) the job is a parameter-server job: a chief
that runs the training loop, N workers and M ps tasks that serve it, and the
chief's exit decides the job (see `launch`).
"""

import os
import shlex
import shutil
import signal
import sys
import threading
import time

from tfdist.launch import local_cluster as cluster_lib
from tfdist.launch import gpus as gpus_lib
from tfdist.launch import processes, scratch
from tfdist.runtime.argtypes import check_number
from tfdist.runtime.exit_codes import (LAUNCH_CANNOT_START, LAUNCH_NOT_EXECUTABLE,
                               LAUNCH_STARTUP_TIMEOUT, LAUNCH_TIMEOUT)
from tfdist.runtime.exit_codes import PREEMPTED as PREEMPTED_EXIT_CODE
from tfdist.launch.output import OutputPump, Sink
from tfdist.runtime.tf_logging import worker_stderr_sink

EXIT_TIMEOUT = LAUNCH_TIMEOUT
"""Exit status when the job deadline (`timeout`) passes (124)."""
EXIT_STARTUP_TIMEOUT = LAUNCH_STARTUP_TIMEOUT
"""Exit status when a worker is not ready by the start-up deadline (125)."""
EXIT_CANNOT_START = LAUNCH_CANNOT_START
"""Exit status when the command cannot be started, e.g. not found (127)."""

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals to the launcher that are forwarded to the workers before stopping."""

TICK = 0.05
DRAIN_SECONDS = 2.0
MESSAGE_PREFIX = "tfdist.launch: "
DEFAULT_GRACE_PERIOD = 30.0
"""Seconds workers get to save a backup and exit after SIGTERM (Kubernetes' default)."""
NOT_RESTARTED = (EXIT_TIMEOUT, EXIT_CANNOT_START, LAUNCH_NOT_EXECUTABLE)
"""Job outcomes a restart cannot mend: the job deadline, a command that cannot start."""


def launch(command, workers, *, ps=0, devices_per_worker=None, gpus_per_worker=None,
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
    waits up to `grace_period` for them (a second signal to the launcher cuts
    that short; the line then says how long it waited). SIGINT, SIGTERM and
    SIGHUP sent to the launcher (when called from the main thread; SIGHUP so
    that closing the terminal stops the job) are forwarded to the workers,
    followed by the same shutdown, and the workers' outcome is returned, the
    same for every signal: 143 when they stopped with their backup (exit 143),
    0 when every worker exited 0 (the job had finished), else the first other
    status (e.g. 137 for a worker killed before it could save anything).

    Temporary folders (`tfdist-launch-PID-*`, the workers' ready files) of
    launchers that were killed are removed when a launcher starts, once their
    launcher is gone (see `tfdist.launch.scratch`).

    With `max_restarts=N`, a job that ended with a failed or preempted worker
    or a missed start-up deadline is started again (new ports, the same
    command, which resumes from its backups), up to N times, each restart
    announced with its reason. A signal to the launcher, the job deadline and
    a command that cannot start are not restarted.

    With `ps=M` >= 1 it is a parameter-server job of 1 + `workers` + M
    processes of `command`: TF_CONFIG names a "chief" (the coordinator, the
    only task that runs the training loop; TFDIST_RANK 0), `workers` "worker"
    tasks (TFDIST_RANK 1..N) and M "ps" tasks (no TFDIST_RANK), prefixed
    "[chief] ", "[worker i] " and "[ps j] ". Workers and ps tasks serve until
    stopped, so:

    - the job's status is the chief's: when the chief exits (any status) the
      workers and ps tasks are stopped (SIGTERM, SIGKILL after
      `grace_period`), and how they end then is no failure;
    - a worker that exits while the chief runs is not fatal (a line says so):
      the chief's coordinator re-schedules its steps on the other workers;
    - a ps task that exits, or the last worker, makes the chief fail: it gets
      `grace_period` seconds to exit (its status is then the job's), after
      which the job is stopped with the lost task's status (1 if it exited 0);
    - every task, ps tasks included, must create its TFDIST_READY_FILE (or
      have exited) within `startup_timeout`;
    - `max_restarts` restarts the whole job when it ends with a non-zero
      status, as without ps tasks.

    Args:
        command: the worker command as a non-empty list of strings.
        workers: the number of workers, an int >= 1.
        ps: the number of parameter-server tasks, an int >= 0 (default 0: no
            chief and no ps tasks, every task is a worker).
        devices_per_worker: exported as TFDIST_DEVICES_PER_WORKER (int >= 1)
            to the workers (and the chief; never to ps tasks), or None to leave
            it unset.
        gpus_per_worker: GPUs of its own for each worker (int >= 1): worker i
            gets the i-th group of that many of the launcher's GPUs as its
            CUDA_VISIBLE_DEVICES; more than there are is a ValueError. With ps
            tasks the chief gets the first group, worker i the (i+1)-th, and
            ps tasks none (CUDA_VISIBLE_DEVICES=""). None (default): every
            task sees every GPU.
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
    >>> launch(["python", "ps_train.py"], workers=2, ps=1)  # doctest: +SKIP
    0
    """
    command = _check_command(command)
    workers = _check_count("workers", workers)
    ps = _check_count("ps", ps, minimum=0)
    if devices_per_worker is not None:
        devices_per_worker = _check_count("devices_per_worker", devices_per_worker)
    if gpus_per_worker is not None:
        gpus_per_worker = _check_count("gpus_per_worker", gpus_per_worker)
    startup_timeout = _check_seconds("startup_timeout", startup_timeout, "no check")
    timeout = _check_seconds("timeout", timeout, "no deadline")
    grace_period = _check_seconds("grace_period", grace_period, "SIGKILL at once") or 0.0
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}.")
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a non-empty address such as '127.0.0.1', got {host!r}.")
    out = Sink(sys.stdout if output is None else output)
    err = Sink(sys.stderr if errors is None else errors)
    base_env = dict(os.environ if env is None else env)
    tasks = cluster_lib.job_tasks(workers, ps)
    gpu_groups = _gpu_groups(tasks, base_env, gpus_per_worker)

    removed = scratch.remove_stale_ready_dirs()
    if removed:
        err.write_line(MESSAGE_PREFIX + f"removed {len(removed)} temporary folder(s) of launchers "
                       f"that are no longer running: {', '.join(removed)}")
    if "TF_CONFIG" in base_env:
        err.write_line(MESSAGE_PREFIX + "TF_CONFIG from the environment is replaced "
                       "by the launcher's localhost cluster for each worker.")
    if gpus_per_worker is not None:
        err.write_line(MESSAGE_PREFIX + "GPUs per worker: " + "; ".join(
            f"{cluster_lib.task_label(task)}: {','.join(group) or 'none'}"
            for task, group in zip(tasks, gpu_groups)))
    started = time.monotonic()
    restarts = 0
    while True:
        remaining = None if not timeout else max(timeout - (time.monotonic() - started), 0.001)
        job = _run_once(command, tasks, host, base_env, devices_per_worker, gpu_groups,
                        startup_timeout, remaining, timeout, out, err, grace_period)
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


def _gpu_groups(tasks, base_env, gpus_per_worker):
    """Each task's GPU ids (None for all: no --gpus-per-worker). The chief and
    the workers get a group each, in task order; ps tasks get none ([])."""
    if gpus_per_worker is None:
        return [None] * len(tasks)
    computing = [task for task in tasks if task[0] != "ps"]
    try:
        groups = iter(gpus_lib.assign_gpus(gpus_lib.visible_gpus(base_env), len(computing),
                                           gpus_per_worker))
    except ValueError as error:
        if len(computing) == len(tasks):
            raise
        raise ValueError(f"{error} With ps tasks the chief counts as a worker: "
                         f"{len(computing)} = 1 chief + {len(computing) - 1} worker(s); "
                         "ps tasks get no GPU.") from None
    return [[] if task[0] == "ps" else next(groups) for task in tasks]


def _run_once(command, tasks, host, base_env, devices_per_worker, gpu_groups,
              startup_timeout, remaining, job_deadline, out, err, grace_period):
    """Starts the tasks on fresh ports and supervises them for at most
    `remaining` seconds of the `job_deadline` (--timeout, counted over restarts);
    returns the `_Job`."""
    ports = cluster_lib.free_ports(len(tasks), host)
    cluster = cluster_lib.cluster_spec(host, ports, tasks)
    ready_dir = scratch.make_ready_dir()
    try:
        ready_files = [os.path.join(ready_dir, f"{kind}-{index}.ready") for kind, index in tasks]
        task_deadline = cluster_lib.worker_startup_timeout(startup_timeout)
        envs = [cluster_lib.task_env(base_env, cluster, task, ready_file, devices_per_worker,
                                     task_deadline, gpus=gpus)
                for task, ready_file, gpus in zip(tasks, ready_files, gpu_groups)]
        job_class = _ParameterServerJob if "ps" in cluster else _Job
        err.write_line(MESSAGE_PREFIX + f"starting {job_class.describe_cluster(cluster)}: "
                       f"{shlex.join(command)}")
        job = job_class(command, tasks, envs, ready_files, out, err, grace_period)
        job.status = job.run(startup_timeout, remaining, job_deadline)
        return job
    finally:
        shutil.rmtree(ready_dir, ignore_errors=True)


def _name_tasks(labels):
    """"worker(s) 0, 2" when all are workers, else the labels: "chief, ps 0"."""
    if all(label.startswith("worker ") for label in labels):
        return "worker(s) " + ", ".join(label.split()[1] for label in labels)
    return ", ".join(labels)


class _Job:
    """The supervising loop of one launch, where every task is a worker and
    all are peers: the job succeeds when every worker exits 0 and fails with
    the first that does not."""

    EVERYONE = "all workers"
    """How messages name every task of the job."""

    def __init__(self, command, tasks, envs, ready_files, out, err, grace_period):
        self.command = command
        self.kinds = [kind for kind, _ in tasks]
        self.labels = [cluster_lib.task_label(task) for task in tasks]
        self.envs = envs
        self.ready_files = ready_files
        self.out = out
        self.err = err
        self.grace_period = grace_period
        self.procs = []
        self.pump = OutputPump()
        self.signals = []
        self.blocked_before = set()  # the signals the caller had blocked (restored at the end)
        self.status = None
        self.reason = None

    @staticmethod
    def describe_cluster(cluster):
        """What the start-up line says is being started."""
        return f"{len(cluster['worker'])} worker(s) on {', '.join(cluster['worker'])}"

    def say(self, text):
        self.err.write_line(MESSAGE_PREFIX + text)

    def run(self, startup_timeout, remaining, job_deadline):
        previous = self._install_signal_handlers()
        try:
            status = self._start()
            if status is None:
                status = self._supervise(startup_timeout, remaining, job_deadline)
            return status
        finally:
            self._cleanup()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if previous:
                signal.pthread_sigmask(signal.SIG_BLOCK,
                                       self.blocked_before & set(FORWARDED_SIGNALS))

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in FORWARDED_SIGNALS:
            previous[signum] = signal.signal(
                signum, lambda received, frame: self.signals.append(received))
        # A launcher started by a process that blocks these signals inherits
        # the mask; its handlers would never run and a SIGTERM would be lost.
        self.blocked_before = signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
        return previous

    def _start(self):
        for label, env in zip(self.labels, self.envs):
            try:
                proc = processes.start_worker(self.command, env)
            except OSError as error:
                self.say(f"cannot start {label} ({shlex.join(self.command)}): "
                         f"{error}; stopping the workers already started.")
                self._stop(signal.SIGTERM)
                return (LAUNCH_NOT_EXECUTABLE if isinstance(error, PermissionError)
                        else EXIT_CANNOT_START)
            self.procs.append(proc)
            self.pump.add(proc.stdout, f"[{label}] ", self.out)
            # TensorFlow's import-time C++ lines ignore TF_CPP_MIN_LOG_LEVEL: filtered here.
            self.pump.add(proc.stderr, f"[{label}] ",
                          worker_stderr_sink(self.err, f"[{label}] ", env))
        return None

    def _supervise(self, startup_timeout, remaining, job_deadline):
        started = time.monotonic()
        ready = [False] * len(self.procs)
        while True:
            self.pump.poll(TICK)
            if self.signals:
                signum = self.signals[0]
                self.say(f"received {processes.signal_name(signum)}; forwarding it to "
                         "the workers and stopping them.")
                self._stop(signum)
                return self._stopped_status(signum)
            codes = [proc.poll() for proc in self.procs]
            status = self._check_exits(codes)
            if status is not None:
                return status
            elapsed = time.monotonic() - started
            if startup_timeout and not all(ready):
                # A task that has exited is not waited for: a worker that failed
                # has ended the job already, one that exited 0 counts as ready.
                ready = [r or code is not None or os.path.exists(path)
                         for r, code, path in zip(ready, codes, self.ready_files)]
                if not all(ready) and elapsed > startup_timeout:
                    late = _name_tasks([label for label, r in zip(self.labels, ready) if not r])
                    self.reason = f"{late} not ready in time"
                    self.say(f"{late} did not become ready "
                             f"within the start-up deadline of {startup_timeout:g}s "
                             "(no TFDIST_READY_FILE created and still running); "
                             f"stopping {self.EVERYONE}.")
                    self._stop(signal.SIGTERM)
                    return EXIT_STARTUP_TIMEOUT
            if remaining and elapsed > remaining:
                # The user's value, not the time left of it after restarts.
                self.say(f"job deadline of {job_deadline:g}s (--timeout) exceeded; "
                         f"stopping {self.EVERYONE}.")
                self._stop(signal.SIGTERM)
                return EXIT_TIMEOUT

    def _check_exits(self, codes):
        """Called every tick with each task's `Popen.poll()`; returns the job's
        exit status once it is decided (the others stopped), else None."""
        for label, code in zip(self.labels, codes):
            if code == PREEMPTED_EXIT_CODE:
                self.reason = f"{label} preempted (exit {code}, backup written)"
                self.say(f"{label} stopped after SIGTERM/SIGINT with its backup "
                         "written; waiting for the others, which stop at the same step.")
                self._stop(None)
                return code
            if code is not None and code != 0:
                self.reason = f"{label} failed ({processes.describe_exit(code)})"
                self.say(f"{label} failed with {processes.describe_exit(code)}; "
                         "stopping the other workers.")
                self._stop(signal.SIGTERM)
                return processes.exit_status(code)
        if all(code == 0 for code in codes):
            return 0
        return None

    def _stop(self, signum):
        """Sends `signum` to every worker group (None: sends nothing, the
        workers are stopping), waits the grace period (cut short by another
        signal to the launcher), then SIGKILLs the rest."""
        if signum is not None:
            for proc in self.procs:
                processes.signal_group(proc, signum)
        seen = len(self.signals)
        began = time.monotonic()
        deadline = began + self.grace_period
        while (any(proc.poll() is None for proc in self.procs)
               and time.monotonic() < deadline and len(self.signals) <= seen):
            self.pump.poll(TICK)
        waited = time.monotonic() - began
        stubborn = [label for label, proc in zip(self.labels, self.procs) if proc.poll() is None]
        if stubborn:
            after = processes.signal_name(signum) if signum is not None else "the first one stopped"
            if len(self.signals) > seen:
                why = (f"another {processes.signal_name(self.signals[seen])} to the launcher cut "
                       f"the {self.grace_period:g}s grace period short")
            else:
                why = f"the {self.grace_period:g}s grace period (--grace-period) is over"
            self.say(f"{_name_tasks(stubborn)} still running {waited:.1f}s after {after} "
                     f"({why}); sending SIGKILL.")
        for proc in self.procs:
            processes.signal_group(proc, signal.SIGKILL)

    def _stopped_status(self, signum):
        """The job's status after `signum` to the launcher stopped it: the
        workers' own (every worker 143: backups written; every worker 0: the
        job had finished; else the first other status, e.g. 137 for a worker
        killed before it could save), with a line saying which."""
        codes = self._final_codes()
        labels = [label for label, code in zip(self.labels, codes) if code is not None]
        return self._judge_stop(signum, labels, [code for code in codes if code is not None])

    def _final_codes(self):
        """Every task's `returncode` once reaped (after `_stop`'s SIGKILL), None if not."""
        deadline = time.monotonic() + DRAIN_SECONDS
        for proc in self.procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: judged without it
                pass
        return [proc.poll() for proc in self.procs]

    def _judge_stop(self, signum, labels, codes):
        name = processes.signal_name(signum)
        others = [(label, code) for label, code in zip(labels, codes)
                  if code not in (0, PREEMPTED_EXIT_CODE)]
        if others:
            label, code = others[0]
            status = processes.exit_status(code)
            self.say(f"stopped on {name}: {label} ended with {processes.describe_exit(code)}; "
                     f"exit status {status}.")
            return status
        if not codes:
            self.say(f"stopped on {name}; exit status {PREEMPTED_EXIT_CODE}.")
            return PREEMPTED_EXIT_CODE
        if all(code == 0 for code in codes):
            self.say(f"stopped on {name}: {_name_tasks(labels)} exited 0 (the job had finished); "
                     "exit status 0.")
            return 0
        stopped = [label for label, code in zip(labels, codes) if code == PREEMPTED_EXIT_CODE]
        self.say(f"stopped on {name}: {_name_tasks(stopped)} exited {PREEMPTED_EXIT_CODE} "
                 f"(stopped after writing a backup); exit status {PREEMPTED_EXIT_CODE}.")
        return PREEMPTED_EXIT_CODE

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


class _ParameterServerJob(_Job):
    """The supervising loop of a parameter-server job: task 0 is the chief,
    the only task that runs the training loop; the workers and ps tasks serve
    it until they are stopped. The chief's exit is the job's."""

    EVERYONE = "the chief, the workers and the ps tasks"

    def __init__(self, *args):
        super().__init__(*args)
        self.announced = set()
        self.lost = None  # (label, exit status, monotonic deadline) of a task the chief needs

    @staticmethod
    def describe_cluster(cluster):
        return (f"a parameter-server job: chief on {cluster['chief'][0]}, "
                f"{len(cluster['worker'])} worker(s) on {', '.join(cluster['worker'])}, "
                f"{len(cluster['ps'])} ps task(s) on {', '.join(cluster['ps'])}")

    def _check_exits(self, codes):
        if codes[0] is not None:
            return self._chief_exited(codes[0])
        for index, code in enumerate(codes):
            if code is not None and index not in self.announced:
                self.announced.add(index)
                self._server_exited(index, code, codes)
        if self.lost and time.monotonic() > self.lost[2]:
            label, status, _ = self.lost
            self.reason = f"{label} lost (exit status {status})"
            self.say(f"the chief did not exit within {self.grace_period:g}s (--grace-period) "
                     f"after {label} was lost; stopping the job with {label}'s exit "
                     f"status {status}.")
            self._stop(signal.SIGTERM)
            return status
        return None

    def _stopped_status(self, signum):
        """The chief's status decides, as when it exits by itself."""
        chief = self._final_codes()[0]
        return self._judge_stop(signum, self.labels[:1], [] if chief is None else [chief])

    def _chief_exited(self, code):
        """The job ends with the chief: stop the servers, return its status."""
        how = processes.describe_exit(code)
        if code == PREEMPTED_EXIT_CODE:
            self.reason = f"chief preempted (exit {code}, backup written)"
        elif code != 0:
            self.reason = f"chief failed ({how})"
        self.say(f"chief exited with {how}, the job's exit status; stopping the workers "
                 "and ps tasks (how they end now is not a failure).")
        self._stop(signal.SIGTERM)
        return processes.exit_status(code)

    def _server_exited(self, index, code, codes):
        """Task `index`, a worker or ps task, ended while the chief runs: a lost
        worker is replaced by the others; without a ps task, or any worker,
        the chief cannot go on and gets the grace period to exit."""
        label, how = self.labels[index], processes.describe_exit(code)
        workers_left = [c for kind, c in zip(self.kinds, codes) if kind == "worker" and c is None]
        is_worker = self.kinds[index] == "worker"
        if is_worker and workers_left:
            self.say(f"{label} exited with {how}; the chief's coordinator re-schedules its "
                     "steps on the other workers.")
            return
        why = "no worker is left" if is_worker else "its share of the variables is lost"
        self.say(f"{label} exited with {how}; the chief will fail ({why}): waiting up to "
                 f"{self.grace_period:g}s (--grace-period) for the chief to exit.")
        if self.lost is None:
            status = processes.exit_status(code) or 1
            self.lost = (label, status, time.monotonic() + self.grace_period)


def _check_command(command):
    if (isinstance(command, (str, bytes)) or not command
            or not all(isinstance(part, str) for part in command)):
        raise ValueError("command must be a non-empty list of strings such as "
                         f"['python', 'train.py'], got {command!r}.")
    return list(command)


def _check_count(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return value


def _check_seconds(name, value, none_means):
    """`value` as seconds > 0, or None for 0 and None (the argument's `none_means`)."""
    return check_number(name, value, at_least=0, unit="seconds", none_means=none_means,
                        hint="0 means the same") or None
