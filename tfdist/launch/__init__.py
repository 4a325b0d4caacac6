"""The local multi-worker launcher: tfdist's torchrun.

Runs one command as N TensorFlow workers on this machine. Each worker gets a
free loopback port and its own TF_CONFIG (worker 0 is the chief), so
`tf.distribute.MultiWorkerMirroredStrategy` (or tfdist's strategy factory)
forms a real multi-worker cluster without any other set-up. It never imports
TensorFlow, so it starts instantly.

Command line:

    python -m tfdist.launch --workers N [--ps P] [--devices-per-worker M] [--gpus-per-worker K]
        [--startup-timeout S] [--timeout T] [--grace-period G] [--max-restarts R]
        [--network private|shared] [--host 127.0.0.1] -- <command...>

    python -m tfdist.launch --workers 2 -- python -m tfdist.recipes.cnn \\
        --strategy multi_worker_mirrored

Every worker's environment has:

- TF_CONFIG = {"cluster": {"worker": ["127.0.0.1:p0", ...]},
  "task": {"type": "worker", "index": i}} (one already set is replaced);
- TFDIST_RANK = i, TFDIST_WORLD_SIZE = N, PYTHONUNBUFFERED = 1;
- TF_CPP_MIN_LOG_LEVEL = 3 (TensorFlow's C++ logging off) unless set already;
- TFDIST_DEVICES_PER_WORKER = M when --devices-per-worker is given;
- CUDA_VISIBLE_DEVICES = the i-th K of the launcher's GPUs when
  --gpus-per-worker K is given (too few GPUs is an error before any worker
  starts; see `tfdist.launch.gpus`);
- TFDIST_READY_FILE: a path in a temporary directory the launcher owns
  ($TMPDIR/tfdist-launch-PID-*, removed when it ends; that of a killed
  launcher is removed by the next launcher to start). The worker creates it
  once its strategy is up (tfdist's strategy factory does; other programs can
  touch it themselves).

Each output line is prefixed with its worker, e.g. "[worker 1] loss 0.3";
workers' stdout goes to stdout, their stderr and the launcher's own messages
to stderr.

By default (--network private) the job runs in a Linux network namespace of
its own, where the workers reach each other over loopback and nothing else:
TensorFlow's unauthenticated gRPC servers listen on every interface, and
this keeps them off the machine's network (see `tfdist.launch.network`).

Exit status: 0 when every worker exits 0. When one worker fails (non-zero exit
or a signal) the others get SIGTERM, then SIGKILL after the grace period
(default 30 s), and the launcher exits with that worker's status (128 + N for
signal N). A worker that exits 143 was preempted and wrote its backup; the
others stop at the same step and are waited for. --max-restarts R starts a
failed or preempted job again, up to R times. A worker
that neither creates its ready file nor exits 0 within --startup-timeout
(default 300 s, 0 disables) stops the job with 125; passing --timeout stops it
with 124; SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to the workers
and it exits with their outcome, the same for every signal: 143 when they
stopped with their backups, 0 when all of them had finished, else the first
other status (137: a worker killed before it could save). Bad arguments exit 2; a command that cannot be started,
127. Each worker runs in its own process group (stopping a worker stops what it
started) and, on Linux, is SIGKILLed if the launcher itself is SIGKILLed.

Python API:

    from tfdist.launch import launch
    status = launch(["python", "train.py"], workers=2, timeout=600)

Parameter-server jobs (--ps P, P >= 1; `tf.distribute.ParameterServerStrategy`):
the launcher starts 1 + N + P processes of the command, with TF_CONFIG cluster
{"chief": [a], "worker": [N addresses], "ps": [P addresses]} and output
prefixed "[chief] ", "[worker i] ", "[ps j] ". The chief (TFDIST_RANK 0) runs
the training loop; the workers (TFDIST_RANK 1..N) and ps tasks (no
TFDIST_RANK) serve it until stopped; TFDIST_WORLD_SIZE is 1 + N for every task.
--devices-per-worker and --gpus-per-worker apply to the chief and the workers
(the chief gets the first group of GPUs); ps tasks get no
TFDIST_DEVICES_PER_WORKER and, with --gpus-per-worker, CUDA_VISIBLE_DEVICES="".
Every task, ps tasks too, must create its TFDIST_READY_FILE by the start-up
deadline. The job's exit status is the chief's: when the chief exits, the
workers and ps tasks are stopped (SIGTERM, then SIGKILL after the grace
period) and how they end is not a failure. A worker that exits while the
chief runs is not fatal (the chief's coordinator re-schedules its steps on the
other workers; the launcher does not restart it). A ps task that exits, or the
last worker, makes the chief fail: the chief gets the grace period to exit
(its status is the job's), then the job is stopped with the lost task's status
(1 if it exited 0). --max-restarts restarts the whole job when it ends
non-zero.

On a real cluster no launcher is needed: TF_CONFIG is set by the cluster
(Kubeflow's TFJob, SLURM through `SlurmClusterResolver`, ...) and each machine
simply runs the training command.
"""

from tfdist.launch.arguments import main
from tfdist.launch.supervisor import (EXIT_CANNOT_START, EXIT_STARTUP_TIMEOUT,
                                  EXIT_TIMEOUT, launch)

__all__ = ["launch", "main", "EXIT_TIMEOUT", "EXIT_STARTUP_TIMEOUT", "EXIT_CANNOT_START"]
