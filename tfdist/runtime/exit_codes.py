"""The exit codes of tfdist's commands: one table, used by the code and the README.

Cluster managers decide from the exit code whether to start a job again
(Kubernetes' `restartPolicy: ExitCode` and Kubeflow restart on 128-255, a
SLURM script requeues on them), so every way a recipe or the launcher ends has
one documented code. `render_table()` is the README's table under "Running on
a cluster" (a test compares the two).

Example:

    from tfdist.runtime.exit_codes import CLUSTER_LOST
    sys.exit(CLUSTER_LOST)
"""

import dataclasses

FINISHED = 0
"""The run finished (also when a stop signal arrived after its last training step)."""
FAILED = 1
"""Any other error, or an output the run announced is missing (one line names it)."""
BAD_INPUT = 2
"""A bad flag, config or TF_CONFIG, or an environment fault to fix before rerunning (a full
disk, a tensor that did not fit in memory)."""
INTERRUPTED = 130
"""128 + SIGINT: Ctrl-C before training was set up (nothing trained or saved)."""
KILLED = 137
"""128 + SIGKILL: killed, or a stop signal before the first training step ended."""
CLUSTER_LOST = 141
"""128 + SIGPIPE: a peer or ps task was lost, or the cluster did not form in time."""
PREEMPTED = 143
"""128 + SIGTERM: stopped by SIGTERM/SIGINT after writing a backup (TensorFlow's own
preemption code, restartable under Kubernetes' `restartPolicy: ExitCode`)."""
LAUNCH_TIMEOUT = 124
"""`tfdist launch`: the job deadline (`--timeout`) passed."""
LAUNCH_STARTUP_TIMEOUT = 125
"""`tfdist launch`: a worker was not ready by the start-up deadline."""
LAUNCH_NOT_EXECUTABLE = 126
"""`tfdist launch`: the command exists but cannot be executed."""
LAUNCH_CANNOT_START = 127
"""`tfdist launch`: the command cannot be started (not found)."""


@dataclasses.dataclass(frozen=True)
class ExitCode:
    """One row of the table: the code, what it means, and whether to run again.

    Example:

    >>> ExitCode(2, "bad flag", "no: fix the command").code
    2
    """

    code: int
    meaning: str
    restart: str


TABLE = (
    ExitCode(FINISHED, "finished (also when SIGTERM/SIGINT arrives after the last training "
                       "step: one line says the run had finished)", "no"),
    ExitCode(PREEMPTED, "stopped by SIGTERM/SIGINT, backup written (the line names it)",
             "yes, resumes from the backup"),
    ExitCode(KILLED, "killed (SIGKILL, out of memory), or SIGTERM before the first step ended "
                     "(nothing to save yet)", "yes, resumes from the last backup"),
    ExitCode(CLUSTER_LOST, "a peer or ps task was lost during training, or the cluster did not "
                           "form by the start-up deadline (one line names it and the backup)",
             "yes, resumes from the last backup"),
    ExitCode(INTERRUPTED, "Ctrl-C before training was set up (nothing trained or saved)",
             "yes, starts over"),
    ExitCode(BAD_INPUT, "bad flag, config or TF_CONFIG; or the environment: the model dir is "
                        "read-only, a file, cannot be created, or used by another run "
                        "(`.tfdist.lock`), the disk "
                        "is full, a tensor did not fit in memory (TensorFlow's out-of-memory "
                        "error: lower the batch); or a refused resume or a diverged run "
                        "(one-line error)",
             "no: fix the command or the environment; a rerun then resumes from the last "
             "backup"),
    ExitCode(FAILED, "any other error, or an output the run announced is missing (one line "
                     "names it)", "after a look at the error"),
    ExitCode(LAUNCH_TIMEOUT, "`tfdist launch`: the job deadline (`--timeout`) passed", "no"),
    ExitCode(LAUNCH_STARTUP_TIMEOUT, "`tfdist launch`: a worker was not ready by the start-up "
                                     "deadline", "yes (`--max-restarts`)"),
    ExitCode(LAUNCH_NOT_EXECUTABLE, "`tfdist launch`: the command cannot be executed", "no"),
    ExitCode(LAUNCH_CANNOT_START, "`tfdist launch`: the command was not found", "no"),
)
"""Every exit code tfdist's recipes and launcher use, in the README's order."""


def meaning(code):
    """What an exit code means, from `TABLE` (None for a code tfdist does not use).

    Example:

    >>> meaning(141).startswith("a peer or ps task was lost")
    True
    """
    return next((row.meaning for row in TABLE if row.code == code), None)


def render_table():
    """The Markdown table of `TABLE`, as the README shows it.

    Example:

    >>> print(render_table().splitlines()[0])
    | code | meaning | restart? |
    """
    lines = ["| code | meaning | restart? |", "| --- | --- | --- |"]
    lines += [f"| {row.code} | {row.meaning} | {row.restart} |" for row in TABLE]
    return "\n".join(lines)
