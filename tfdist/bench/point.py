"""One point of the scaling sweep, run in its own process.

Logical CPU devices are fixed when TensorFlow starts, and a TF gRPC server
cannot be stopped inside a process, so every (replicas, workers) point of
the sweep is a fresh process: `python -m tfdist.bench point ...`, alone for
one worker or under `tfdist.launch` for several. It trains the workload with
tfdist's engine in alternating rounds, with the real input pipeline and with
one batch replayed from memory (for the input-wait share), and the chief
writes the figures as JSON.

Example:

    python -m tfdist.bench point --model transformer --size tiny --strategy mirrored \\
        --devices 2 --global-batch-size 32 --json-out /tmp/point.json
"""

import argparse
import json
import os
import shlex
import sys

from tfdist.bench.workloads import DATA_KINDS, MODELS


def build_parser():
    """The `point` sub-command's flags (no arguments; see `--help`).

    Args:
        none.

    Example:

    >>> build_parser().parse_args(["--model", "cnn", "--global-batch-size", "64"]).strategy
    'mirrored'
    """
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.bench point",
        description="Measure one point of the scaling sweep (one process; under tfdist.launch "
                    "for several workers) and write its figures as JSON (chief only).")
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--size", default=None, help="model size (default: the benchmark's)")
    parser.add_argument("--data", choices=sorted({k for v in DATA_KINDS.values() for k in v}),
                        default=None)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--strategy", default="mirrored",
                        help="create_strategy name: mirrored, multi_worker_mirrored, ...")
    parser.add_argument("--devices", type=int, default=None, help="devices per worker")
    parser.add_argument("--global-batch-size", type=int, required=True)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--xla", default="auto", choices=("on", "off", "auto"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--no-input-share", action="store_true",
                        help="skip the rounds with input from memory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipe-flags", default="",
                        help="more recipe flags for the model, e.g. '--dropout 0'")
    parser.add_argument("--json-out", default=None, help="file for the chief's JSON figures")
    return parser


def run_point(args):
    """Measures the point described by parsed `args`.

    Args:
        args: the parsed flags of `build_parser`.

    Returns:
        `(figures, is_chief)`: the figures (a dict: `summarise`'s, plus
        strategy, replicas, workers, batch sizes and machine load, and on
        GPUs `gpu_utilization` from `tfdist.bench.gpu_use`) and whether
        this process is the chief.

    Example:

    >>> figures, chief = run_point(build_parser().parse_args(
    ...     ["--model", "cnn", "--global-batch-size", "64", "--devices", "1", "--rounds", "1"]))
    >>> figures["replicas"]
    1
    """
    from tfdist.bench.alternate import run_rounds, summarise
    from tfdist.bench.engines import Contender, Setting
    from tfdist.bench.gpu_use import UtilizationSampler
    from tfdist.bench.load import LoadMonitor
    from tfdist.bench.workloads import Workload
    from tfdist.distribute.devices import gpu_count
    from tfdist.distribute.strategy_factory import create_strategy
    from tfdist.distribute.introspection import describe_strategy

    workload = Workload(args.model, size=args.size, data=args.data,
                        sequence_length=args.sequence_length, vocab_size=args.vocab_size,
                        image_size=args.image_size, seed=args.seed,
                        recipe_flags=tuple(shlex.split(args.recipe_flags)))
    strategy = create_strategy(args.strategy, devices=args.devices)
    info = describe_strategy(strategy)
    contender = Contender(Setting("tfdist", args.precision, args.xla), workload, strategy,
                          args.global_batch_size, seed=args.seed)
    inputs = ("pipeline",) if args.no_input_share else ("pipeline", "memory")
    monitor = LoadMonitor().start()
    gpus = gpu_count()
    # On GPUs: NVML utilisation of this worker's GPUs while the rounds run.
    sampler = UtilizationSampler(range(min(gpus, len(info.devices)))).start() if gpus else None
    say = print if info.is_chief else (lambda *a, **k: None)
    results = run_rounds({"tfdist": contender}, args.rounds, args.steps, inputs=inputs,
                         warmup_steps=args.warmup_steps, log=say)
    figures = summarise(contender, results["tfdist"])
    if sampler is not None:
        figures.update(sampler.stop())
    figures.update(
        strategy=info.name, replicas=info.num_replicas, workers=info.num_workers,
        devices_per_worker=len(info.devices), global_batch_size=args.global_batch_size,
        per_replica_batch_size=args.global_batch_size // info.num_replicas,
        workload=workload.label, load=monitor.stop())
    return figures, info.is_chief


def main(argv):
    """Runs the `point` sub-command; returns the exit code.

    Args:
        argv: the flags after `point` (see `build_parser`).

    Example:

    >>> main(["--model", "cnn", "--global-batch-size", "64", "--devices", "1",
    ...       "--json-out", "/tmp/p.json"])  # doctest: +SKIP
    0
    """
    args = build_parser().parse_args(argv)
    figures, chief = run_point(args)
    if chief:
        text = json.dumps(figures, indent=1, sort_keys=True)
        if args.json_out:
            temporary = args.json_out + ".tmp"
            with open(temporary, "w") as stream:
                stream.write(text)
            os.replace(temporary, args.json_out)
        else:
            sys.stdout.write(text + "\n")
    return 0
