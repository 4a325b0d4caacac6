"""The scaling sweep: throughput over 1..N replicas and 1..W workers.

Each point is a fresh process (`tfdist.bench.point`): `--strategy mirrored
--devices R` for R replicas on one worker (logical CPU devices on a machine
without GPUs), and W workers with one device each through tfdist's launcher
(`tfdist.launch.launch`, `--strategy multi_worker_mirrored`). Weak scaling
keeps the per-replica batch fixed (the global batch grows with the
replicas); strong scaling keeps the global batch fixed.

Example:

    points = sweep_points(max_replicas=2, max_workers=2)   # [(1, 1), (2, 1), (1, 2)]
    results = run_sweep(workload, points, mode="weak", batch=16, out_dir="bench-out")
"""

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time

from tfdist.runtime.argtypes import check_int_at_least

SCALING_MODES = ("weak", "strong")


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One point: `devices` replicas on each of `workers` workers.

    Args:
        devices: devices (replicas) per worker, >= 1.
        workers: worker processes, >= 1.

    Example:

    >>> SweepPoint(devices=2, workers=1).replicas
    2
    """

    devices: int
    workers: int

    @property
    def replicas(self):
        """Replicas in sync: devices per worker x workers."""
        return self.devices * self.workers

    @property
    def name(self):
        """A file-name friendly label, e.g. 'r2-w1'."""
        return f"r{self.replicas}-w{self.workers}"


def sweep_counts(maximum):
    """The counts a sweep visits up to `maximum`: powers of two, then `maximum`.

    Args:
        maximum: the largest count, >= 1.

    Example:

    >>> sweep_counts(8), sweep_counts(6), sweep_counts(3)
    ([1, 2, 4, 8], [1, 2, 4, 6], [1, 2, 3])
    """
    counts, count = [], 1
    while count < maximum:
        counts.append(count)
        count *= 2
    return counts + [maximum]


def sweep_points(max_replicas, max_workers):
    """The sweep: 1..max_replicas devices on one worker, then 2..max_workers
    workers of one device each (powers of two and the maximum, see
    `sweep_counts`, as scaling tables usually show 1, 2, 4, 8 GPUs).

    Args:
        max_replicas: largest replica count on one worker, >= 1.
        max_workers: largest worker count, >= 1.

    Example:

    >>> [p.name for p in sweep_points(2, 2)]
    ['r1-w1', 'r2-w1', 'r2-w2']
    >>> [p.name for p in sweep_points(8, 1)]
    ['r1-w1', 'r2-w1', 'r4-w1', 'r8-w1']
    """
    for name, value in (("max_replicas", max_replicas), ("max_workers", max_workers)):
        check_int_at_least(name, value, 1)
    points = [SweepPoint(devices, 1) for devices in sweep_counts(max_replicas)]
    points += [SweepPoint(1, workers) for workers in sweep_counts(max_workers) if workers > 1]
    return points


def default_max_replicas(env=None):
    """The sweep's default extent on one worker: every GPU the machine has,
    or 2 logical CPU devices without GPUs.

    Args:
        env: the environment to read CUDA_VISIBLE_DEVICES from (default
            `os.environ`); without it, `nvidia-smi -L` is asked.

    Example:

    >>> default_max_replicas({"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    4
    >>> default_max_replicas({"CUDA_VISIBLE_DEVICES": ""})
    2
    """
    from tfdist.launch.gpus import visible_gpus

    return len(visible_gpus(os.environ if env is None else env)) or 2


def global_batch_for(point, mode, batch):
    """The global batch of a point.

    Args:
        point: a `SweepPoint`.
        mode: "weak" (`batch` is per replica: global = batch x replicas) or
            "strong" (`batch` is the global batch for every point).
        batch: the batch size, an int >= 1.

    Raises:
        ValueError: an unknown mode, or a strong-scaling batch that does not
            split evenly over the point's replicas.

    Example:

    >>> point = SweepPoint(2, 1)
    >>> global_batch_for(point, "weak", 16), global_batch_for(point, "strong", 16)
    (32, 16)
    """
    if mode not in SCALING_MODES:
        raise ValueError(f"Scaling mode {mode!r} is not one of {', '.join(SCALING_MODES)}.")
    check_int_at_least("batch", batch, 1)
    if mode == "weak":
        return batch * point.replicas
    if batch % point.replicas:
        raise ValueError(f"Strong scaling: the global batch {batch} does not split evenly over "
                         f"{point.replicas} replicas; use a multiple of {point.replicas}.")
    return batch


def point_command(workload, point, global_batch_size, precision, xla, rounds, steps,
                  warmup_steps, json_out, input_share=True):
    """The command line of one point's process (one worker's, under the launcher).

    Args:
        workload: the `Workload`.
        point: the `SweepPoint` (1 worker: mirrored over its devices; more:
            multi_worker_mirrored).
        global_batch_size: the point's global batch.
        precision, xla: the tfdist settings.
        rounds, steps, warmup_steps: the measurement.
        json_out: where the chief writes its figures.
        input_share: also run the memory rounds.

    Example:

    >>> point_command(Workload("cnn"), SweepPoint(2, 1), 64, "float32", "auto", 2, 3, 2,
    ...               "/tmp/p.json")[:4]
    ['/usr/bin/python3', '-m', 'tfdist.bench', 'point']
    """
    command = [sys.executable, "-m", "tfdist.bench", "point", "--model", workload.model,
               "--size", workload.size, "--data", workload.data,
               "--sequence-length", str(workload.sequence_length),
               "--vocab-size", str(workload.vocab_size), "--seed", str(workload.seed),
               "--global-batch-size", str(global_batch_size), "--precision", precision,
               "--xla", xla, "--rounds", str(rounds), "--steps", str(steps),
               "--warmup-steps", str(warmup_steps), "--json-out", json_out]
    if workload.image_size:
        command += ["--image-size", str(workload.image_size)]
    if workload.recipe_flags:
        command += ["--recipe-flags", " ".join(shlex.quote(f) for f in workload.recipe_flags)]
    if point.workers == 1:
        command += ["--strategy", "mirrored", "--devices", str(point.devices)]
    else:
        command += ["--strategy", "multi_worker_mirrored", "--devices", str(point.devices)]
    if not input_share:
        command.append("--no-input-share")
    return command


def run_point_process(command, point, log_path, timeout, gpus=False):
    """Runs one point's command (under `tfdist.launch` for several workers,
    each with `point.devices` GPUs of its own when `gpus`).

    Args:
        command: from `point_command`.
        point: the `SweepPoint`.
        log_path: file receiving the processes' stdout and stderr.
        timeout: seconds before the point is stopped and reported as failed.
        gpus: whether this machine has GPUs to share out among the workers
            (see `tfdist.launch.gpus.visible_gpus`).

    Returns:
        The exit status (0 on success).

    Example:

    >>> run_point_process(point_command(...), SweepPoint(1, 2), "p.log", timeout=300)
    0
    """
    from tfdist.launch import launch

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
               PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    with open(log_path, "w") as log:
        if point.workers == 1:
            try:
                return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      timeout=timeout, start_new_session=True).returncode
            except subprocess.TimeoutExpired:
                log.write(f"\ntfdist bench: point stopped after its {timeout:.0f} s timeout\n")
                return 124
        # On a GPU machine each worker gets GPUs of its own (not all of them each).
        gpus_per_worker = point.devices if gpus else None
        return launch(command, point.workers, gpus_per_worker=gpus_per_worker, timeout=timeout,
                      startup_timeout=min(timeout, 180), output=log, errors=log, env=env,
                      grace_period=2.0)


def run_sweep(workload, points, *, mode, batch, precision="float32", xla="auto", rounds=2,
              steps=3, warmup_steps=2, out_dir, timeout=600, input_share=True, repeats=1,
              log=None):
    """Runs every point in its own process(es) and collects the chief's figures.

    With `repeats > 1` the whole sweep runs that many times, in reverse order
    every other time, and each point keeps the repeat with its median
    throughput (a shared machine's speed drifts; points in separate
    processes cannot alternate step by step). The machine load is measured
    here, around each point, counting every process of the point as its own.
    A point that fails is reported (`error`, the tail of its log) and the
    sweep goes on.

    Args:
        workload: a `tfdist.bench.workloads.Workload`.
        points: `SweepPoint`s (e.g. from `sweep_points`).
        mode: "weak" or "strong".
        batch: per-replica batch (weak) or global batch (strong).
        precision, xla: the tfdist settings of every point.
        rounds, steps, warmup_steps: measurement per point (see `point`).
        out_dir: folder for the points' JSON and logs (`points/`).
        timeout: seconds per point.
        input_share: also measure the input-wait share (memory rounds).
        repeats: runs of the whole sweep, >= 1.
        log: progress lines, or None.

    Returns:
        A list of dicts, one per point: `devices`, `workers`, `replicas`,
        `global_batch_size`, `seconds`, `load`, `repeat_examples_per_sec`,
        and the figures, or `error`.

    Example:

    >>> run_sweep(Workload("cnn"), sweep_points(2, 2), mode="weak", batch=64,
    ...           out_dir="bench-results")[1]["examples_per_sec"]  # doctest: +SKIP
    """
    from tfdist.bench.load import LoadMonitor
    from tfdist.launch.gpus import visible_gpus

    check_int_at_least("repeats", repeats, 1)
    log = log or (lambda line: None)
    folder = os.path.join(out_dir, "points")
    os.makedirs(folder, exist_ok=True)
    runs = {point: [] for point in points}
    gpus = bool(visible_gpus(os.environ))  # asked once (nvidia-smi), not per point
    for repeat in range(repeats):
        for point in (points if repeat % 2 == 0 else list(reversed(points))):
            global_batch = global_batch_for(point, mode, batch)
            stem = os.path.join(folder, f"{workload.model}-{point.name}"
                                + (f"-{repeat + 1}" if repeats > 1 else ""))
            json_out = stem + ".json"
            if os.path.exists(json_out):
                os.remove(json_out)
            command = point_command(workload, point, global_batch, precision, xla, rounds, steps,
                                    warmup_steps, json_out, input_share)
            monitor = LoadMonitor().start()
            start = time.perf_counter()
            status = run_point_process(command, point, stem + ".log", timeout, gpus=gpus)
            seconds = time.perf_counter() - start
            entry = {"devices": point.devices, "workers": point.workers,
                     "replicas": point.replicas, "global_batch_size": global_batch,
                     "seconds": seconds, "precision": precision, "xla_asked": xla}
            if status == 0 and os.path.exists(json_out):
                with open(json_out) as stream:
                    entry.update(json.load(stream))
                entry["load"] = monitor.stop()
                log(f"  {workload.model} {point.name}: {entry['examples_per_sec']:.1f} "
                    f"examples/s (global batch {global_batch}, {seconds:.0f} s, other "
                    f"processes {100 * entry['load'].get('others_share', 0):.0f}% of the CPUs)")
            else:
                entry["error"] = f"exit status {status}; log {stem}.log: " + _tail(stem + ".log")
                log(f"  {workload.model} {point.name}: FAILED ({entry['error'][:300]})")
            runs[point].append(entry)
    return [median_run(runs[point]) for point in points]


def median_run(entries):
    """The entry with the median throughput among a point's repeats (the
    lower median for an even count); a failed entry only when all failed.
    Every repeat's throughput is kept as `repeat_examples_per_sec`.

    Args:
        entries: one point's entries of `run_sweep`, one per repeat.

    Example:

    >>> median_run([{"examples_per_sec": 3.0}, {"examples_per_sec": 1.0},
    ...             {"examples_per_sec": 2.0}])["examples_per_sec"]
    2.0
    """
    good = sorted((e for e in entries if "error" not in e), key=lambda e: e["examples_per_sec"])
    if not good:
        return entries[-1]
    chosen = dict(good[(len(good) - 1) // 2])
    chosen["repeat_examples_per_sec"] = [e["examples_per_sec"] for e in entries
                                         if "error" not in e]
    return chosen


def _tail(path, lines=6):
    try:
        with open(path) as stream:
            return " | ".join(line.strip() for line in stream.readlines()[-lines:])
    except OSError:
        return "(no log)"
