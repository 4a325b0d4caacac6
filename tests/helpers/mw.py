"""Run a command as N localhost workers through tfdist's launcher, for tests.

Every multi-worker test goes through here so that each uses fresh processes
(a TF gRPC server cannot be stopped inside a process), has a hard deadline,
and sees every exit code. The launcher is tfdist's own, as a user runs it; a
Python worker's run is forked from one of this pytest worker's fork servers
(`forked_workers`, helpers.zygote), so it skips TensorFlow's import but is
still a process of its own that the launcher starts, signals and waits for.
"""

import os
import subprocess
import sys

from helpers.paths import REPO_ROOT  # noqa: E402,F401
from helpers.zygote import forked_command


def launch(args, workers=2, timeout=240, startup_timeout=180, devices_per_worker=None, env=None,
           ps=0, grace_period=2, fork=True):
    """Runs `python -m tfdist.launch --workers N -- <args>` and returns the
    `subprocess.CompletedProcess` (text, stdout and stderr merged into stdout).

    `args` is the worker command *without* the interpreter when it starts with
    a `.py` path or `-m`: the current interpreter is prepended. The launcher is
    given `timeout` as its job deadline, and the test kills it 30 s later at
    the latest, so a hung job fails the test instead of hanging it.
    `fork=False` starts each worker as a fresh interpreter, for a test about
    what a worker's start-up prints (`forked_workers`).
    """
    command, full_env = _launcher_command(args, workers, timeout, startup_timeout,
                                          devices_per_worker, env, ps, grace_period, fork)
    return subprocess.run(command, cwd=REPO_ROOT, env=full_env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout + 30)


def start_launch(args, workers=2, timeout=240, startup_timeout=180, devices_per_worker=None,
                 env=None, ps=0, grace_period=2, fork=True):
    """`launch` without waiting: the launcher's `subprocess.Popen` (text, stdout and stderr
    merged), for a test that signals it; end it with `helpers.processes.finish`.

    Example: `launcher = start_launch(["-m", "tfdist.recipes.transformer", ...])`
    """
    command, full_env = _launcher_command(args, workers, timeout, startup_timeout,
                                          devices_per_worker, env, ps, grace_period, fork)
    return subprocess.Popen(command, cwd=REPO_ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _launcher_command(args, workers, timeout, startup_timeout, devices_per_worker, env, ps,
                      grace_period, fork):
    """`(command, environment)` of the launcher running `args` (see `launch`)."""
    command = [sys.executable, "-m", "tfdist.launch", "--workers", str(workers),
               "--timeout", str(timeout), "--startup-timeout", str(startup_timeout),
               # TF workers ignore SIGTERM; a short grace period stops a failed job sooner.
               "--grace-period", str(grace_period)]
    if devices_per_worker is not None:
        command += ["--devices-per-worker", str(devices_per_worker)]
    if ps:
        command += ["--ps", str(ps)]  # a chief, `workers` workers and `ps` ps tasks
    worker = list(args)
    if worker and (worker[0] == "-m" or worker[0].endswith(".py")):
        worker = [sys.executable] + worker
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    full_env.pop("TF_CONFIG", None)
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in [REPO_ROOT, full_env.get("PYTHONPATH", "")] if p)
    full_env.update(env or {})
    for name in [name for name, value in full_env.items() if value is None]:
        del full_env[name]  # env={"NAME": None} unsets NAME
    command = command + ["--"] + worker
    if fork:
        return with_forked_workers(command, full_env, devices_per_worker, startup_timeout)
    return command, full_env


def with_forked_workers(launcher_command, launcher_env, devices_per_worker=None,
                        startup_timeout=None):
    """`(launcher command, environment)` whose worker command (after `--`) is
    `forked_workers`'s.

    Example: `command, env = with_forked_workers([..., "tfdist.launch", "--", python, "-m", ...], env)`
    """
    split = launcher_command.index("--") + 1
    worker, env = forked_workers(launcher_command[split:], launcher_env, devices_per_worker,
                                 startup_timeout)
    return launcher_command[:split] + worker, env


def forked_workers(worker, launcher_env, devices_per_worker=None, startup_timeout=None):
    """`(worker command, launcher environment)` whose workers' runs are forked from the
    fork server for the environment the launcher gives them (`helpers.zygote.forked_command`;
    a command that is not `python -m ...` or `python SCRIPT.py ...` stays as it is).

    Example: `worker, env = forked_workers([sys.executable, "-m", "tfdist.recipes.cnn"], env)`
    """
    from tfdist.launch.local_cluster import cluster_spec, task_env

    run_env = task_env(launcher_env, cluster_spec("127.0.0.1", [1, 2]), ("worker", 0), "ready",
                       devices_per_worker, startup_timeout)
    return forked_command(worker, launcher_env, REPO_ROOT, run_env=run_env)
