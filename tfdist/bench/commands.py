"""`tfdist bench` / `python -m tfdist.bench`: the command line.

    tfdist bench [report] [--quick] [--out DIR] [--models transformer,cnn] ...
    tfdist bench engine [--size small] [--batch 32] [--rounds 6] ...
    tfdist bench point ...        (one sweep point; run by `report`)
    tfdist bench parameter-server [--size tiny] [--batch 64] [--workers 2] [--ps 1] ...
    tfdist bench model-parallel [--size tiny] [--batch 32] [--micro-batches 4] [--steps N] ...
    tfdist bench tensor-parallel [--size tiny] [--batch 32] [--shards 2] [--steps N] ...
    tfdist bench resume [--position 5000] [--sources shapes,text,...] ...

TensorFlow is imported through `tfdist.runtime.tf_logging.import_tensorflow` once
the flags are read, before any work: its C++ logging is quiet unless
`--tf-log-level` (or `$TF_CPP_MIN_LOG_LEVEL`) asks for more; the sweep's
point processes inherit the level.
"""

import argparse
import logging
import sys

from tfdist.runtime.argtypes import int_at_least, seconds
from tfdist.bench.report import write_json
from tfdist.bench.workloads import MODELS
from tfdist.runtime.quick_exit import skip_exit_garbage_collection
from tfdist.runtime.tf_logging import add_tf_log_level_flag, import_tensorflow

SUBCOMMANDS = ("report", "engine", "point", "parameter-server", "model-parallel",
               "tensor-parallel", "autotune", "resume")


def _csv(allowed, name):
    """An argparse type: comma-separated values, each one of `allowed`."""
    def parse(text):
        values = tuple(v.strip() for v in text.split(",") if v.strip())
        if not values:
            raise argparse.ArgumentTypeError(
                f"{name}: {text!r} names none; choose from {', '.join(allowed)} (comma-separated)")
        bad = [v for v in values if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(
                f"{name}: {', '.join(map(repr, bad))} not allowed; choose from "
                f"{', '.join(allowed)} (comma-separated)")
        return values
    return parse


_positive = int_at_least(1)
_non_negative = int_at_least(0)


def report_parser():
    """Flags of `tfdist bench [report]` (no arguments; see `--help`).

    Args:
        none.

    Example:

    >>> report_parser().parse_args(["--quick"]).quick
    True
    """
    from tfdist.bench.settings import FACTORS

    parser = argparse.ArgumentParser(
        prog="tfdist bench [report]",
        description="Benchmark and scaling report: throughput (examples/s, tokens/s) per "
                    "replica and total, step-time percentiles, model FLOP/s and MFU against a "
                    "same-run matmul peak, input-wait share, a scaling sweep over replicas and "
                    "workers, and a settings comparison (precision, XLA, engine), written to "
                    "report.md, results.json and scaling.png.",
        epilog="Examples:\n  tfdist bench --quick --out /tmp/bench\n"
               "  tfdist bench --models transformer --sizes transformer=small --batch 32\n"
               "  tfdist bench engine --size small --batch 32",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench-results", help="output folder (default %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny workloads, one short round per measurement (for tests); "
                             "flags given with it win")
    parser.add_argument("--models", type=_csv(MODELS, "--models"), default=MODELS,
                        help="comma-separated: transformer,cnn (default both)")
    parser.add_argument("--sizes", default="",
                        help="model sizes, e.g. transformer=small,cnn=resnet18 (default: "
                             "transformer tiny, cnn resnet_tiny)")
    parser.add_argument("--data", choices=("synthetic", "embedded"), default=None,
                        help="the Transformer's data (default synthetic tokens; the CNN always "
                             "uses the embedded shapes)")
    parser.add_argument("--sequence-length", type=_positive, default=None)
    parser.add_argument("--vocab-size", type=_positive, default=None)
    parser.add_argument("--batch", type=_positive, default=None,
                        help="per-replica batch (weak scaling) or global batch (strong); "
                             "default: transformer 16, cnn 64")
    parser.add_argument("--scaling", choices=("weak", "strong"), default="weak",
                        help="weak: fixed per-replica batch (default); strong: fixed global batch")
    parser.add_argument("--max-replicas", type=_non_negative, default=None,
                        help="sweep 1, 2, 4, ..., N devices on one worker (default: every "
                             "GPU, or 2 logical CPU devices without GPUs; 0: no sweep)")
    parser.add_argument("--max-workers", type=_positive, default=2,
                        help="sweep 2, 4, ..., W workers of one device each via tfdist.launch "
                             "(default 2; with GPUs each worker gets its own)")
    parser.add_argument("--precision", default="float32",
                        choices=("auto", "float32", "mixed_bfloat16", "mixed_float16"),
                        help="precision of the sweep (default float32)")
    parser.add_argument("--xla", default="auto", choices=("auto", "on", "off"),
                        help="XLA of the sweep (default auto)")
    parser.add_argument("--compare", type=_csv(FACTORS + ("none",), "--compare"),
                        default=FACTORS, help="settings to compare: precision,xla,engine or none")
    parser.add_argument("--rounds", type=_positive, default=None,
                        help="alternating rounds of the settings comparison (default 3; "
                             "--quick 1)")
    parser.add_argument("--steps", type=_positive, default=None,
                        help="measured steps per setting and round (default 3; --quick 2)")
    parser.add_argument("--sweep-rounds", type=_positive, default=None,
                        help="rounds of every sweep point (default 2; --quick 1)")
    parser.add_argument("--sweep-steps", type=_positive, default=None,
                        help="measured steps of every sweep point and round (default 3; "
                             "--quick 2)")
    parser.add_argument("--sweep-repeats", type=_positive, default=1,
                        help="run the whole sweep this many times, alternating its order; each "
                             "point keeps its median (default 1)")
    parser.add_argument("--point-timeout", type=seconds(), default=600.0,
                        help="seconds per sweep point before it is stopped (default 600)")
    parser.add_argument("--no-profile", action="store_true",
                        help="do not profile 2 steps of each compared setting (into "
                             "OUT/profiles/MODEL/); without the profile the step-time shares "
                             "show only the input wait, not matmul/softmax/elementwise")
    add_tf_log_level_flag(parser)
    return parser


def engine_parser():
    """Flags of `tfdist bench engine` (no arguments; see `--help`).

    Args:
        none.

    Example:

    >>> engine_parser().parse_args([]).size
    'small'
    """
    parser = argparse.ArgumentParser(
        prog="tfdist bench engine",
        description="tfdist's engine vs Keras model.fit on the Transformer recipe's model, in "
                    "one process, alternating rounds: same settings (float32; XLA off and on) "
                    "and defaults vs defaults (tfdist: --strategy/--precision/--xla auto as the "
                    "recipe resolves them; Keras: compile() defaults, jit_compile='auto').")
    parser.add_argument("--model", choices=MODELS, default="transformer")
    parser.add_argument("--size", default=None,
                        help="model size (default: transformer small = 4 layers, d=256, 8 heads)")
    parser.add_argument("--batch", type=_positive, default=None,
                        help="global batch (default: the recipe's for the model, the batch the "
                             "speed goals are set at: Transformer small 32, base 16, CNN 128)")
    parser.add_argument("--sequence-length", type=_positive, default=None,
                        help="tokens per example of the Transformer's synthetic data "
                             "(default 128; --quick 32)")
    parser.add_argument("--vocab-size", type=_positive, default=None,
                        help="vocabulary of the Transformer's synthetic data (default 8000; "
                             "--quick 256)")
    parser.add_argument("--data", choices=("synthetic", "embedded"), default=None,
                        help="the Transformer's data: synthetic tokens (default) or the "
                             "recipe's embedded task; the CNN always trains on its embedded "
                             "shapes")
    parser.add_argument("--strategy", default="default",
                        help="strategy of the same-settings pairs: default (none), one_device, "
                             "mirrored (default: default)")
    parser.add_argument("--devices", type=_positive, default=None,
                        help="devices of that strategy (e.g. 1 for mirrored)")
    parser.add_argument("--same-xla", type=_csv(("off", "on"), "--same-xla"),
                        default=("off", "on"), help="XLA settings of the same-settings pairs")
    parser.add_argument("--rounds", type=_positive, default=6)
    parser.add_argument("--steps", type=_positive, default=None,
                        help="timed steps per contender and round (default: Transformer 3, "
                             "CNN 30, whose step is about ten times shorter)")
    parser.add_argument("--warmup-steps", type=_positive, default=2)
    parser.add_argument("--recipe-flags", default="",
                        help="more recipe flags for the model, e.g. '--dropout 0'")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="after the rounds, profile 2 steps of each contender into DIR and "
                             "print where the time goes (op kinds) and the shares of the step "
                             "in input wait, matmul, softmax/loss and elementwise")
    parser.add_argument("--no-input-share", action="store_true",
                        help="skip the rounds on one batch replayed from memory (they measure "
                             "the input-wait share and double the measuring time)")
    parser.add_argument("--goals", action="store_true",
                        help="also time Keras fit with Keras's standard loss at every setting "
                             "autotune would try here (precisions x XLA off/on) and judge the "
                             "speed goals on this CPU: tfdist's defaults >= 1.4x Keras's best, "
                             "and MFU vs the fastest matmul peak (small 60%%, base 75%%, "
                             "resnet_tiny 35%%); also time the model's forward and backward "
                             "alone, the ceiling of both for any engine")
    parser.add_argument("--json-out", default=None, help="also write the report as JSON here")
    parser.add_argument("--quick", action="store_true",
                        help="tiny model on tiny data, batch 8, 1 round of 2 steps (for tests); "
                             "flags given with it win")
    add_tf_log_level_flag(parser)
    return parser


def _sizes(text):
    sizes = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        model, _, size = item.partition("=")
        if model not in MODELS or not size:
            raise ValueError(f"--sizes item {item!r} must be MODEL=SIZE with MODEL one of "
                             f"{', '.join(MODELS)}, e.g. transformer=small.")
        sizes[model] = size
    return sizes


def run_report_command(argv):
    """`tfdist bench [report]`: runs the full report; returns the exit code.

    Args:
        argv: the flags after `report` (see `report_parser`).

    Returns:
        0; 1 when a sweep point failed (the report is still written).

    Example:

    >>> run_report_command(["--quick", "--out", "/tmp/bench"])  # doctest: +SKIP
    0
    """
    from tfdist.bench.flags import prepare_output_folder, refuse_token_flags_without_tokens
    from tfdist.bench.plot import MISSING_MATPLOTLIB, matplotlib_available
    from tfdist.bench.run import ReportOptions, check_report_options, command_line, run_report
    from tfdist.bench.sweep import default_max_replicas

    args = report_parser().parse_args(argv)
    refuse_token_flags_without_tokens(args, "transformer" in args.models, args.data)
    import_tensorflow(args.tf_log_level)
    if args.max_replicas is None:
        args.max_replicas = default_max_replicas()
    if args.max_replicas > 0 and not matplotlib_available():
        print(f"tfdist bench: {MISSING_MATPLOTLIB}", file=sys.stderr, flush=True)
    options = ReportOptions(
        models=args.models, out_dir=args.out, quick=args.quick, sizes=_sizes(args.sizes),
        batch=args.batch, scaling=args.scaling, max_replicas=args.max_replicas,
        max_workers=args.max_workers, precision=args.precision, xla=args.xla,
        factors=() if "none" in args.compare else args.compare, rounds=args.rounds,
        steps=args.steps, sweep_rounds=args.sweep_rounds, sweep_steps=args.sweep_steps,
        sweep_repeats=args.sweep_repeats, profile=not args.no_profile,
        sequence_length=args.sequence_length, vocab_size=args.vocab_size, data=args.data,
        point_timeout=args.point_timeout, command=command_line(["report"] + list(argv)))
    check_report_options(options)  # sizes, data and batches, before any work
    prepare_output_folder(args.out, "--out")
    result = run_report(options)
    print(f"Wrote {', '.join(result['outputs'])}")
    failed = [f"{model} {row['replicas']}x{row['workers']}"
              for model, section in result["scaling"].items() for row in section["rows"]
              if "error" in row]
    if failed:
        print(f"tfdist bench: failed sweep points: {', '.join(failed)} (see points/*.log)",
              file=sys.stderr)
        return 1
    return 0


ENGINE_QUICK = dict(batch=8, rounds=1, steps=2, warmup_steps=1)
"""What `tfdist bench engine --quick` presets (besides the tiny model on tiny
data, `engine_run`): flags given with it win (`tfdist.bench.flags.parse_quick`)."""


def engine_args(argv):
    """`tfdist bench engine`'s flags parsed, `--quick` presets included.

    Args:
        argv: the flags after `engine`.

    Raises:
        ValueError: `--sequence-length` or `--vocab-size` for data they do not
            shape (the CNN's images, the Transformer's embedded task).

    Example:

    >>> args = engine_args(["--quick", "--steps", "5"])
    >>> args.batch, args.rounds, args.steps
    (8, 1, 5)
    """
    from tfdist.bench.flags import (parse_quick, prepare_output_folder,
                                    refuse_token_flags_without_tokens)

    args = parse_quick(engine_parser(), argv, ENGINE_QUICK)
    refuse_token_flags_without_tokens(args, args.model == "transformer", args.data)
    if args.profile:
        prepare_output_folder(args.profile, "--profile")
    return args


def engine_run(args):
    """What `tfdist bench engine` measures: `(workload, global batch, rounds, steps, warmup steps)`.

    Unset `--batch` and `--steps` follow the model: the recipe's default batch
    (`tfdist.bench.workloads.default_batch`) and `DEFAULT_STEPS`; `--quick`
    presets the tiny model on tiny data, batch 8, 1 round of 2 steps
    (`ENGINE_QUICK`), and flags given with it win.

    Args:
        args: `engine_args()`'s namespace.

    Example:

    >>> workload, batch, rounds, steps, warmup = engine_run(engine_args(["--model", "cnn"]))
    >>> workload.size, batch, rounds, steps, warmup
    ('resnet_tiny', 128, 6, 30, 2)
    """
    import shlex

    from tfdist.bench.engine_compare import default_steps
    from tfdist.bench.workloads import Workload, data_options, default_batch

    size = args.size
    if args.quick and size is None:
        size = "tiny" if args.model == "transformer" else "resnet_tiny"
    workload = Workload(args.model, size=size, data=args.data,
                        recipe_flags=tuple(shlex.split(args.recipe_flags)),
                        **data_options(args.model, args.quick, args.sequence_length,
                                       args.vocab_size))
    return (workload, args.batch or default_batch(args.model, workload.size), args.rounds,
            args.steps or default_steps(args.model), args.warmup_steps)


def run_engine_command(argv):
    """`tfdist bench engine`: tfdist vs Keras fit; returns the exit code.

    Args:
        argv: the flags after `engine` (see `engine_parser`).

    Example:

    >>> run_engine_command(["--quick", "--json-out", "/tmp/engine.json"])  # doctest: +SKIP
    0
    """
    from tfdist.bench.compare import format_comparison
    from tfdist.bench.engine_compare import TITLE, compare_engines
    from tfdist.bench.peak import QUICK_SIZE

    args = engine_args(argv)
    import_tensorflow(args.tf_log_level)
    workload, batch, rounds, steps, warmup = engine_run(args)
    report = compare_engines(workload, batch, strategy=args.strategy, devices=args.devices,
                             same_xla=args.same_xla, goals=args.goals, rounds=rounds,
                             steps=steps, warmup_steps=warmup, log=print,
                             profile_dir=args.profile, input_share=not args.no_input_share,
                             peak_size=QUICK_SIZE if args.quick else None)
    print(format_comparison(report, TITLE))
    if args.goals:
        from tfdist.bench.goals import format_goals

        print(format_goals(report["goals"], report["goals_cpu"], report["ceilings"]))
    if args.json_out:
        write_json(args.json_out, report)
        print(f"Wrote {args.json_out}")
    return 0


def main(argv=None):
    """Dispatches `tfdist bench [report|engine|point|parameter-server|model-parallel|
    tensor-parallel|autotune|resume] ARGS`; returns the exit code.

    TensorFlow is imported quietly (`tfdist.runtime.tf_logging.import_tensorflow`)
    as soon as the flags are read, before any work; `--tf-log-level N`
    (report, engine) or `$TF_CPP_MIN_LOG_LEVEL` asks for its log lines.

    Args:
        argv: the arguments after `bench` (default `sys.argv[1:]`); a first
            argument naming a sub-command (`SUBCOMMANDS`) picks it,
            anything else means `report`. Bad values exit 2 with a message.

    Example:

    >>> main(["--quick", "--out", "/tmp/bench"])  # doctest: +SKIP
    0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    skip_exit_garbage_collection()  # each point process exits right after its result
    logging.getLogger("tfdist").setLevel(logging.WARNING)
    # Contenders of one process each trace their own step: TensorFlow's
    # "excessive retracing" warning about that is noise here.
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    command = "report"
    if argv and argv[0] in SUBCOMMANDS:
        command, argv = argv[0], argv[1:]
    try:
        if command == "point":
            from tfdist.bench.point import main as point_main
            # A point process takes its log level from the environment its
            # parent (`report`, which set it) gives it.
            import_tensorflow()
            return point_main(argv)
        if command == "engine":
            return run_engine_command(argv)
        if command == "parameter-server":
            from tfdist.bench.ps_bench import main as parameter_server_main
            return parameter_server_main(argv)
        if command == "autotune":
            from tfdist.bench.autotune_check import main as autotune_main
            return autotune_main(argv)
        if command == "model-parallel":
            from tfdist.bench.pipeline_bench import main as model_parallel_main
            return model_parallel_main(argv)
        if command == "tensor-parallel":
            from tfdist.bench.tensor_parallel_bench import main as tensor_parallel_main
            return tensor_parallel_main(argv)
        if command == "resume":
            from tfdist.bench.resume_bench import main as resume_main
            return resume_main(argv)
        return run_report_command(argv)
    except ValueError as error:
        print(f"tfdist bench {command}: error: {error}", file=sys.stderr)
        return 2
