"""What a recipe run prints: the start block, the results, the outputs, and
the one line each way a run stops (a signal, a fault of the machine).

Example:

    print(outputs_block("runs/a", "runs/a/backup", None)[0])
"""

import errno
import os
import re
import socket
import sys
import tempfile
import time

from tfdist.recipes.preflight import describe_warmup
from tfdist.runtime import exit_codes
from tfdist.runtime.cpu_allocator import POOL_LIMIT_ENV
from tfdist.runtime.gpu_memory import check_allow_growth_env, describe_gpu_memory

# What TensorFlow's file errors say when the environment, not the input, is at fault.
_ENVIRONMENT_FAULTS = {
    "No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
    "Read-only file system": errno.EROFS, "Permission denied": errno.EACCES,
}
SUMMARY_LENGTH = 200
"""Characters of a TensorFlow error quoted in a one-line stop message (cut at a word)."""


def error_summary(text, limit=SUMMARY_LENGTH):
    """The first meaningful line of an error, cut at a word boundary with "…".

    Example:

    >>> error_summary("Graph execution error:\n\n" + "Connection reset by peer " * 3, 30)
    'Connection reset by peer…'
    """
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and "Graph execution error" not in line]
    first = lines[0] if lines else ""
    if len(first) <= limit:
        return first
    cut = first[:limit].rsplit(" ", 1)[0].rstrip(" ,;:")
    return (cut or first[:limit]) + "…"


def environment_errno(error):
    """The errno a TensorFlow file error stands for (disk full, read-only...), or None.

    Example:

    >>> environment_errno(OSError("No space left on device")) == errno.ENOSPC
    True
    """
    text = str(getattr(error, "message", error))
    return next((number for phrase, number in _ENVIRONMENT_FAULTS.items() if phrase in text),
                None)


def environment_line(prog, error, where, number=None):
    """One line for a fault of the machine (disk, permissions), naming the file and the way out.

    Example:

    >>> environment_line("prog", PermissionError(13, "Permission denied", "/ro/x"), {})[:41]
    'prog: error: cannot write /ro/x: Permissi'
    """
    backup = resume_target(where)
    resume = f" A rerun then resumes from {backup}." if backup else ""
    if type(error).__module__.startswith("tfdist"):  # tfdist's own errors (BackupWriteError) say it all
        return f"{prog}: error: {type(error).__name__}: {error}{resume}"
    number = number if number is not None else (getattr(error, "errno", None)
                                                 or environment_errno(error))
    path = getattr(error, "filename", None)
    text = (error.strerror if getattr(error, "strerror", None)
            else error_summary(str(getattr(error, "message", error))))
    if number in (errno.ENOSPC, errno.EDQUOT):
        advice = ("The disk is full: free space there (a backup needs about the size of the "
                  "last one), or use a --model-dir on a larger disk, and rerun." + resume)
    elif number in (errno.EROFS, errno.EACCES, errno.EPERM):
        advice = ("The folder is read-only or not writable by this user: use a writable "
                  "--model-dir (and --backup-dir).")
    elif number in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        advice = "A file is in the way where a folder is needed: --model-dir must name a folder."
    else:
        advice = "Fix the file system problem and rerun." + resume
    return f"{prog}: error: cannot write{f' {path}' if path else ''}: {text}. {advice}"


_OOM = re.compile(r"OOM when allocating tensor with shape\s*\[([^\]]*)\] and type (\w+) on "
                  r"(\S+) by allocator (\S+)")
_OOM_IN_A_GRAPH = re.compile(r"Out of memory while trying to allocate ([0-9.]+ ?[KMGT]?i?B)")


def out_of_memory_line(prog, error, where):
    """One line for a tensor that did not fit in memory (TensorFlow's ResourceExhaustedError).

    Names the device, the tensor and its allocator as TensorFlow reported
    them, the flags that shrink what a step holds (with their values, from
    `where["batch"]`: global batch, accumulation steps and precision), the
    backup a rerun resumes from, and the file the full error went to.

    Example:

    >>> error = MemoryError("OOM when allocating tensor with shape[128,512] and type float on "
    ...                     "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")
    >>> out_of_memory_line("prog", error, {"batch": (64, 1, "float32")})[:100]
    'prog: error: out of memory on GPU:0: a float tensor of shape [128, 512] did not fit (allocator GPU_0'
    """
    text = str(getattr(error, "message", error))
    found = _OOM.search(text)
    if found:
        shape, dtype, device, allocator = found.groups()
        dims = ", ".join(d.strip() for d in shape.split(",") if d.strip())
        device = device.rsplit("device:", 1)[-1]
        what = (f"out of memory on {device}: a {dtype} tensor of shape [{dims}] did not fit "
                f"(allocator {allocator}")
        limit = os.environ.get(POOL_LIMIT_ENV)
        if "cpu" in allocator.lower() and limit:
            what += f", limited to {limit} MiB by ${POOL_LIMIT_ENV}"
        what += ")"
    else:
        size = _OOM_IN_A_GRAPH.search(text)  # a compiled step names only the size
        what = (f"out of memory while allocating {size.group(1)} in a step" if size
                else f"out of memory: {error_summary(text)}")
    global_batch, accumulation, precision = where.get("batch", (None, 1, None))
    advice = ("Lower --global-batch-size" + (f" (now {global_batch})" if global_batch else "")
              + f", or keep it with --grad-accum-steps {2 * (accumulation or 1)} (micro-batches "
              f"half as large)")
    if precision is not None and not str(precision).startswith("mixed"):
        advice += f", or train in mixed precision (--precision mixed_bfloat16; now {precision})"
    backup = resume_target(where)
    resume = f" A rerun then resumes from {backup}." if backup else ""
    full = save_full_error(error, where)
    saved = f" Full error: {full}" if full else ""
    return f"{prog}: error: {what}. {advice}.{resume}{saved}"


def newest_backup(backup_dir):
    """The newest readable backup in `backup_dir` (None without TensorFlow or backups).

    Example:

    >>> newest_backup(None) is None
    True
    """
    if not backup_dir or "tensorflow" not in sys.modules:
        return None
    from tfdist.callbacks import latest_backup

    try:
        return latest_backup(backup_dir)
    except (OSError, ValueError):
        return None


def _describe_backup(info):
    """`ckpt-N (global step S) in DIR` for a BackupInfo (the backup package's wording)."""
    from tfdist.callbacks import describe_backup

    return describe_backup(info)


def backup_name(info):
    """`ckpt-N, global step S` for a BackupInfo, for lines that name its folder already.

    Example:

    >>> backup_name(types.SimpleNamespace(path="run/backup/ckpt-3", global_step=30))
    'ckpt-3, global step 30'
    """
    return f"{os.path.basename(info.path)}, global step {info.global_step}"


def resume_target(where):
    """The backup a rerun resumes from, described, or None.

    Example:

    >>> resume_target({"backup_dir": None}) is None
    True
    """
    info = newest_backup(where.get("backup_dir"))
    return _describe_backup(info) if info is not None else None


def save_full_error(error, where):
    """Writes the full text of `error` to a file and returns its path (None if it cannot).

    Example:

    >>> save_full_error(ValueError("long text"), {"model_dir": "runs/a"})  # doctest: +SKIP
    'runs/a/errors/20260101-120000-host-123.txt'
    """
    folder = (os.path.join(where["model_dir"], "errors") if where.get("model_dir")
              else tempfile.gettempdir())
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{socket.gethostname()}-{os.getpid()}.txt"
    path = os.path.join(folder, name if where.get("model_dir") else f"tfdist-error-{name}")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path, "w") as stream:
            stream.write(f"{type(error).__module__}.{type(error).__name__}: "
                         f"{getattr(error, 'message', error)}\n")
    except OSError:
        return None
    return path


def gpu_memory_line(config, gpus):
    """What `--gpu-memory` does with `gpus` GPUs, for the record and the start block.

    Example:

    >>> gpu_memory_line(config, gpus=0)  # doctest: +SKIP
    'grow (no GPU here)'
    """
    note = check_allow_growth_env(config.gpu_memory, explicit="gpu_memory" in config.explicit)
    return describe_gpu_memory(config.gpu_memory, gpus, note)


def start_block(config, info, precision, jit_compile, xla_reason, data, built, steps_per_epoch,
                 gpu_memory=None, autotune=None):
    """The block the chief prints before training: strategy, devices, batch,
    precision, XLA, data, model, optimizer and schedule, one line each.

    Example:

    >>> print(start_block(config, info, precision, False, "off", data, built, 100))  # doctest: +SKIP
    tfdist run
      strategy      one_device: 1 replica(s) on 1 worker(s)
    ...
    """
    per_replica = config.global_batch_size // info.num_replicas
    placement = f"{info.num_replicas} replica(s) on {info.num_workers} worker(s)"
    if info.name == "parameter_server":
        placement = (f"asynchronous, {info.num_replicas} replica(s) per worker, each step "
                     "the whole global batch")
    lines = [
        "tfdist run",
        f"  strategy      {info.name}: {placement}" + (f" ({info.note})" if info.note else ""),
        f"  devices       {', '.join(info.devices)}",
    ]
    if gpu_memory:
        lines.append(f"  GPU memory    {gpu_memory}")
    lines += [
        f"  batch         global {config.global_batch_size}, per replica {per_replica}"
        + (f", {config.grad_accum_steps} micro-batches per optimizer step" if config.grad_accum_steps > 1 else ""),
        f"  precision     {precision.policy} ({precision.reason})",
        f"  XLA           {'on' if jit_compile else 'off'} ({xla_reason})",
    ]
    if autotune:
        lines.append(f"  autotune      {autotune}")
    lines += [
        f"  dataset       {data.description}",
    ]
    unread = getattr(config, "unread_config_options", ())
    if unread:
        lines.append("  not read      " + ", ".join(f"{name}: {value}" for name, value in unread)
                     + f" from {os.path.basename(config.config_file)} (--dataset "
                     f"{config.dataset} does not read {'it' if len(unread) == 1 else 'them'})")
    lines += [
        f"  model         {built.description}",
        f"  optimizer     {config.optimizer}, lr {config.learning_rate:g}, {config.schedule} schedule, "
        f"{describe_warmup(config)}"
        + (f", clip norm {config.clip_norm:g}" if config.clip_norm else ""),
        f"  schedule      {config.epochs} epoch(s) x {steps_per_epoch} steps",
    ]
    if info.name == "parameter_server":
        from tfdist.training.ps_loop import variable_bytes_by_ps_task

        lines.append("  ps variables  " + ", ".join(
            f"{task}: {size / 2**20:.2f} MiB"
            for task, size in variable_bytes_by_ps_task(built.model).items()))
    if config.config_file:
        lines.append(f"  config        {config.config_file}")
    return "\n".join(lines)


def final_block(history, data, speed):
    """Model metrics (first epoch -> last, beside chance), then the speed figures.

    Example:

    >>> print(final_block(history, data, meter.summary))  # doctest: +SKIP
    Results (first epoch -> last):
      loss             2.0794 -> 0.3120  (chance: 2.0794)
    ...
    """
    from tfdist.callbacks import format_summary
    from tfdist.callbacks.progress import model_metrics

    lines = ["Results (first epoch -> last):"]
    for name, values in model_metrics(history.history).items():
        if not values:
            continue
        chance = data.chance.get(name.removeprefix("val_"))
        first = f"{values[0]:.4f} -> " if len(values) > 1 else ""
        suffix = f"  (chance: {chance:.4f})" if chance is not None else ""
        lines.append(f"  {name:<16} {first}{values[-1]:.4f}{suffix}")
    lines.append(format_summary(speed))
    return "\n".join(lines)


def skipped_line(sources, num_workers):
    """What --skip-corrupt-records skipped in the files this process read.

    Example:

    >>> skipped_line([], num_workers=1)
    'Corrupt TFRecord data skipped (--skip-corrupt-records): none'
    """
    logs = [source.skipped for source in sources if getattr(source, "skipped", None) is not None]
    damaged = {damage.path: damage for log in logs for damage in log.files}
    summary = "; ".join(log.summary() for log in logs if log.files) if damaged else "none"
    if num_workers > 1:
        return (f"Corrupt TFRecord data skipped (--skip-corrupt-records) in the files the chief "
                f"read: {summary}; other workers warn as they skip")
    return f"Corrupt TFRecord data skipped (--skip-corrupt-records): {summary}"


def outputs_block(model_dir, backup_dir, profile_steps):
    """Where the run's outputs went, and how to look at them: only what is there.

    Returns:
        (text, missing): the block, and the announced outputs not found.

    Example:

    >>> outputs_block("runs/a", None, None)[1]  # an empty folder: nothing was written
    ['config.yaml', 'training_log.csv', 'tensorboard/', 'checkpoints/']
    """
    tensorboard = os.path.join(model_dir, "tensorboard")
    checkpoints = os.path.join(model_dir, "checkpoints")
    announced = [
        ("config.yaml", os.path.isfile(os.path.join(model_dir, "config.yaml")),
         "  config.yaml        the configuration of the run that wrote the newest backup "
         "(every run's: runs/)"),
        ("training_log.csv", os.path.isfile(os.path.join(model_dir, "training_log.csv")),
         "  training_log.csv   one row per epoch"),
        ("tensorboard/", os.path.isdir(tensorboard),
         f"  tensorboard/       tensorboard --logdir {tensorboard}"
         + (f" (profile of steps {profile_steps}: Profile tab)" if profile_steps else "")),
        ("checkpoints/", os.path.isdir(checkpoints) and bool(os.listdir(checkpoints)),
         "  checkpoints/       weights at each epoch end"),
    ]
    if backup_dir:
        backup = newest_backup(backup_dir)
        announced.append(("a backup", backup is not None,
                          f"  backups            {backup_dir} (rerun the same command to resume "
                          f"from {backup_name(backup) if backup else 'it'})"))
    lines = [f"Outputs in {model_dir}:"] + [line for _, there, line in announced if there]
    return "\n".join(lines), [name for name, there, _ in announced if not there]


def preempted_line(stop, where):
    """The one line a SIGTERM/SIGINT stop prints: where, the backup written (its
    name and global step) and how to resume from it.

    Example:

    >>> preempted_line(Preempted("SIGTERM"), {})[:22]  # doctest: +SKIP
    'Stopped by SIGTERM: no'
    """
    stopped = f"Stopped by {stop}"
    if stop.backup is not None:
        name = os.path.basename(stop.backup.path)
        # Only the chief's backup has a path; the other workers took part in writing it.
        written = f"({name})" if name else "(written by the chief)"
        return (f"{stopped}: backup written at global step {stop.backup.global_step} in "
                f"{where.get('backup_dir')} {written}. Rerun the same command to resume from it.")
    if where.get("backup_dir"):
        backup = resume_target(where)
        return (f"{stopped}: no backup could be written (the loss was not finite); rerunning "
                + (f"resumes from the last backup, {backup}." if backup
                   else f"starts over: there is no backup in {where['backup_dir']}."))
    return (f"{stopped}: nothing was saved (add --model-dir DIR or --backup-dir to make runs "
            "resumable); rerunning starts over.")


def interrupted_line():
    """The one line Ctrl-C prints before training is set up (once it is, SIGINT
    waits for a step boundary and stops like a preemption).

    Example:

    >>> interrupted_line()
    'Interrupted before training started: nothing was trained or saved.'
    """
    return "Interrupted before training started: nothing was trained or saved."


def finished_anyway_line(signal_name):
    """The line for a stop signal that arrived after the last training step.

    Example:

    >>> finished_anyway_line("SIGTERM")[:45]
    'SIGTERM arrived after the last training step:'
    """
    return (f"{signal_name} arrived after the last training step: the run had finished, so "
            "there is nothing to resume (exit 0).")


def missing_outputs_line(recipe, model_dir, missing):
    """The line for outputs the run announced but did not write.

    Example:

    >>> missing_outputs_line(RECIPE, "runs/a", ["config.yaml"])[:44]  # doctest: +SKIP
    'python -m tfdist.recipes.transformer: error:'
    """
    return (f"python -m tfdist.recipes.{recipe.name}: error: the run finished but did not write "
            f"{', '.join(missing)} in {model_dir}; check that the folder is writable and has "
            f"space, and that TF_CONFIG does not make this run a non-chief worker "
            f"(exit {exit_codes.FAILED}).")
