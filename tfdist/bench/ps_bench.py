"""`tfdist bench parameter-server`: asynchronous parameter servers vs all-reduce.

Runs a recipe as a real localhost job through `tfdist.launch`, alternating
in every round:

    all-reduce        --workers W            --strategy multi_worker_mirrored
    parameter-server  --workers W --ps P     --strategy parameter_server

at the same global batch (examples per optimizer update: under
multi_worker_mirrored each worker computes 1/W of it per synchronous step;
under parameter_server each worker step computes all of it and updates the
variables on its own). Each run's figure is the recipe's own throughput line
(examples/s after its first steps); the table shows every round, the median
and the ratio parameter-server / all-reduce of the medians. The processes
share this machine's cores (the ps tasks and the chief too), so on a small
CPU machine the figures say how the two compare here, not on a cluster.

Example:

    tfdist bench parameter-server --size tiny --batch 64 --steps 40 --rounds 2
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

from tfdist.runtime.argtypes import int_at_least, seconds
from tfdist.bench.report import print_report

MODES = ("all-reduce", "parameter-server")
_THROUGHPUT = re.compile(r"Throughput: ([\d.]+)([kM]?) examples/s")
_STEPS_PER_WORKER = re.compile(r"steps per worker +(.*)")
_positive = int_at_least(1)


def build_parser():
    """Flags of `tfdist bench parameter-server`.

    Example:

    >>> build_parser().parse_args(["--quick"]).quick
    True
    """
    parser = argparse.ArgumentParser(
        prog="tfdist bench parameter-server",
        description="Parameter-server (asynchronous) vs all-reduce (synchronous) throughput at "
                    "the same global batch, as real localhost jobs, alternating per round.")
    parser.add_argument("--model", choices=("transformer", "cnn"), default="transformer")
    parser.add_argument("--size", default="tiny", help="the recipe's --model-size")
    parser.add_argument("--batch", type=_positive, default=64,
                        help="global batch: examples per optimizer update (default 64)")
    parser.add_argument("--workers", type=_positive, default=2)
    parser.add_argument("--ps", type=_positive, default=1)
    parser.add_argument("--steps", type=_positive, default=40, help="steps per run (default 40)")
    parser.add_argument("--rounds", type=_positive, default=2)
    parser.add_argument("--timeout", type=seconds(), default=600.0, help="seconds per run")
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--quick", action="store_true",
                        help="1 round of 8 steps (a smoke test, not a measurement); flags "
                             "given with it win")
    return parser


QUICK = dict(rounds=1, steps=8)
"""What `--quick` presets: flags given with it win (`tfdist.bench.flags.parse_quick`)."""


def parse_args(argv):
    """`tfdist bench parameter-server`'s flags parsed, `--quick` presets included.

    Example:

    >>> args = parse_args(["--quick", "--rounds", "2"])
    >>> args.rounds, args.steps
    (2, 8)
    """
    from tfdist.bench.flags import parse_quick

    return parse_quick(build_parser(), sys.argv[1:] if argv is None else argv, QUICK)


def run_command(mode, args):
    """The launcher command line of one run.

    Example:

    >>> run_command("parameter-server", build_parser().parse_args([]))[:6]
    ['...python', '-m', 'tfdist.launch', '--workers', '2', '--ps']
    """
    launcher = [sys.executable, "-m", "tfdist.launch", "--workers", str(args.workers)]
    strategy = "multi_worker_mirrored"
    if mode == "parameter-server":
        launcher += ["--ps", str(args.ps)]
        strategy = "parameter_server"
    launcher += ["--timeout", f"{args.timeout:g}", "--grace-period", "5", "--"]
    recipe = [sys.executable, "-m", f"tfdist.recipes.{args.model}", "--strategy", strategy,
              "--model-size", args.size, "--global-batch-size", str(args.batch),
              "--epochs", "1", "--steps-per-epoch", str(args.steps), "--warmup-steps", "1",
              "--verbose", "2"]
    return launcher + recipe


def parse_run(output):
    """`(examples per second, steps per worker text or None)` from a run's output.

    Raises:
        ValueError: the output has no throughput line (the run failed).

    Example:

    >>> parse_run("[chief] Throughput: 1.26k examples/s (1.26k per replica)")
    (1260.0, None)
    """
    match = _THROUGHPUT.search(output)
    if not match:
        raise ValueError("the run printed no throughput line; its last lines:\n"
                         + "\n".join(output.splitlines()[-15:]))
    value = float(match.group(1)) * {"": 1, "k": 1e3, "M": 1e6}[match.group(2)]
    steps = _STEPS_PER_WORKER.search(output)
    return value, steps.group(1).strip() if steps else None


def measure(args, log=print):
    """Runs the alternating rounds; returns the report dict.

    Example:

    >>> report = measure(parse_args(["--quick"]))
    >>> sorted(report["median"])
    ['all-reduce', 'parameter-server']
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    env.pop("TF_CONFIG", None)
    figures = {mode: [] for mode in MODES}
    steps_per_worker = []
    for index in range(args.rounds):
        for mode in MODES:
            started = time.monotonic()
            result = subprocess.run(run_command(mode, args), env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    timeout=args.timeout + 60)
            if result.returncode != 0:
                raise ValueError(f"the {mode} run exited {result.returncode}:\n"
                                 + "\n".join(result.stdout.splitlines()[-20:]))
            value, per_worker = parse_run(result.stdout)
            figures[mode].append(value)
            if per_worker:
                steps_per_worker.append(per_worker)
            log(f"round {index + 1}/{args.rounds} {mode:17s} {value:9.1f} examples/s "
                f"({time.monotonic() - started:.0f} s)")
    median = {mode: statistics.median(values) for mode, values in figures.items()}
    return {"model": args.model, "size": args.size, "global_batch": args.batch,
            "workers": args.workers, "ps": args.ps, "steps": args.steps, "rounds": args.rounds,
            "examples_per_second": figures, "median": median,
            "ratio_ps_to_all_reduce": median["parameter-server"] / median["all-reduce"],
            "steps_per_worker": steps_per_worker}


def format_report(report):
    """The report as a text table.

    Example:

    >>> print(format_report(report))  # doctest: +SKIP
    """
    lines = [f"Parameter servers vs all-reduce: {report['model']} {report['size']}, global batch "
             f"{report['global_batch']}, {report['workers']} workers (+ {report['ps']} ps task(s) "
             f"and the chief for parameter-server), {report['steps']} steps per run, "
             f"{report['rounds']} round(s) alternating",
             f"  {'mode':17s} {'examples/s per round':>28s} {'median':>9s}"]
    for mode in MODES:
        values = " ".join(f"{v:8.1f}" for v in report["examples_per_second"][mode])
        lines.append(f"  {mode:17s} {values:>28s} {report['median'][mode]:9.1f}")
    lines.append(f"  parameter-server / all-reduce: {report['ratio_ps_to_all_reduce']:.2f}x")
    if report["steps_per_worker"]:
        lines.append(f"  steps per worker (parameter-server): {report['steps_per_worker'][-1]}")
    return "\n".join(lines)


def main(argv=None):
    """Runs `tfdist bench parameter-server`; returns the exit code.

    Example:

    >>> main(["--quick"])  # doctest: +SKIP
    0
    """
    args = parse_args(argv)
    report = measure(args)
    print_report(format_report(report), report, args.json_out)
    return 0
