"""`tfdist bench autotune`: is autotune's pick the fastest setting?

For each workload, autotune's trial runs as a recipe would run it (the
candidate grid of this machine, no cache), and then every candidate is
measured again, independently, in the settings comparison's alternating
rounds (`run_comparison`). The figure that matters is the pick's
throughput over the fastest candidate's in that second measurement: 1.00
when the pick was the fastest, 0.95 when it was 5% slower.

Example:

    report = check_autotune(Workload("transformer", size="tiny"), 32)
    report["pick_vs_fastest"]      # e.g. 0.98
    print(format_check([report]))
"""

import argparse
import sys

from tfdist.bench.report import write_json

QUICK = dict(rounds=1, steps=2, trial_seconds=1.0, batch=8)
"""What `--quick` presets (besides tiny data, `workloads_to_check`): flags given
with it win (`tfdist.bench.flags.parse_quick`)."""


def _grid(workload, global_batch_size):
    from tfdist.autotune.tune import machine_grid

    return machine_grid("auto", "auto", xla_blocker=workload.xla_blocker())


def _trial_builder(workload, global_batch_size, seed):
    import tensorflow as tf

    from tfdist.data import make_dataset_fn
    from tfdist.training import Trainer

    strategy = tf.distribute.get_strategy()

    def build(candidate):
        data = workload.build_data(global_batch_size)
        # Deterministic: every candidate gets the very same batch (see the recipes' trial).
        dataset_fn = make_dataset_fn(data.train, global_batch_size, training=True, seed=seed,
                                     deterministic=True)
        dataset = strategy.distribute_datasets_from_function(
            lambda context: dataset_fn(context).take(1).cache().repeat())
        built = workload.build_model(data, global_batch_size)
        optimizer = workload.build_optimizer(global_batch_size)
        if built.prepare_optimizer is not None:
            built.prepare_optimizer(optimizer)
        trainer = Trainer(built.model, optimizer, built.loss, built.metrics, strategy=strategy,
                          jit_compile=candidate.jit_compile)
        return trainer, dataset

    return build


def pick_vs_fastest(pick, throughputs):
    """The pick's throughput over the fastest candidate's, and the fastest's name.

    Args:
        pick: the picked candidate's name.
        throughputs: `{name: examples/s}` from the independent measurement
            (None for a candidate that did not run).

    Raises:
        ValueError: the pick was not measured.

    Example:

    >>> pick_vs_fastest("a", {"a": 95.0, "b": 100.0, "c": None})
    (0.95, 'b')
    """
    measured = {name: value for name, value in throughputs.items() if value}
    if pick not in measured:
        raise ValueError(f"The pick {pick!r} was not measured (measured: {sorted(measured)}).")
    fastest = max(measured, key=measured.get)
    return measured[pick] / measured[fastest], fastest


def check_autotune(workload, global_batch_size, *, rounds=4, steps=3, seed=0, trial_seconds=120.0,
                   log=print):
    """Runs autotune's trial, then measures every candidate again; returns the report.

    Args:
        workload: a `tfdist.bench.workloads.Workload`.
        global_batch_size: examples per step.
        rounds, steps: the independent measurement's alternating rounds and
            steps per candidate and round.
        seed: weights and data.
        trial_seconds: the trial's budget (`--autotune-budget`).
        log: progress lines.

    Returns:
        A JSON-able dict: `workload`, `global_batch_size`, `pick`,
        `trial_seconds`, `trial` (the trial's rows), `measured`
        ({candidate: examples/s}), `fastest`, `pick_vs_fastest`.

    Example:

    >>> check_autotune(Workload("transformer", size="tiny"), 32)["pick_vs_fastest"]
    1.0
    """
    from tfdist.autotune.tune import tune
    from tfdist.bench.compare import Entrant, run_comparison
    from tfdist.bench.engines import Setting

    grid = _grid(workload, global_batch_size)
    decision, _ = tune(grid, _trial_builder(workload, global_batch_size, seed),
                       global_batch_size=global_batch_size, max_seconds=trial_seconds, log=log)
    if decision.choice is None:
        raise ValueError(f"Autotune chose nothing on {workload.label}: {decision.reason}.")
    entrants = [Entrant(c.label, Setting("tfdist", c.policy, "on" if c.jit_compile else "off"))
                for c in grid]
    pick = decision.choice.label
    comparisons = [(f"{c.label} / pick", c.label, pick) for c in grid if c.label != pick]
    report = run_comparison(entrants, comparisons, workload, global_batch_size, rounds=rounds,
                            steps=steps, seed=seed, measure_peaks=False, log=log)
    measured = {name: figures.get("examples_per_sec")
                for name, figures in report["contenders"].items()}
    ratio, fastest = pick_vs_fastest(pick, measured)
    return {"workload": workload.label, "global_batch_size": global_batch_size, "pick": pick,
            "trial_seconds": decision.trial_seconds, "trial": decision.rows,
            "measured": measured, "comparisons": report["comparisons"], "fastest": fastest,
            "pick_vs_fastest": ratio}


def format_check(reports):
    """One table: each workload's pick, the fastest in the second measurement, the ratio.

    Example:

    >>> print(format_check([{"workload": "cnn resnet_tiny (embedded shapes)",
    ...     "global_batch_size": 64, "pick": "float32, XLA on", "trial_seconds": 30.0,
    ...     "fastest": "float32, XLA on", "pick_vs_fastest": 1.0}]))
    autotune's pick vs the fastest candidate measured again (alternating rounds):
      workload                                 batch  pick                     trial   fastest again            pick / fastest
      cnn resnet_tiny (embedded shapes)           64  float32, XLA on           30 s   float32, XLA on                   1.00x
    """
    lines = ["autotune's pick vs the fastest candidate measured again (alternating rounds):",
             f"  {'workload':<40} {'batch':>5}  {'pick':<24} {'trial':>6}   "
             f"{'fastest again':<24} {'pick / fastest':>14}"]
    for report in reports:
        lines.append(f"  {report['workload']:<40} {report['global_batch_size']:>5}  "
                     f"{report['pick']:<24} {report['trial_seconds']:>4.0f} s   "
                     f"{report['fastest']:<24} {report['pick_vs_fastest']:>13.2f}x")
    return "\n".join(lines)


def parser():
    """Flags of `tfdist bench autotune` (see `--help`).

    Example:

    >>> parser().parse_args(["--models", "transformer=tiny"]).models
    'transformer=tiny'
    """
    from tfdist.bench.flags import add_round_flags
    from tfdist.runtime.argtypes import int_at_least

    positive = int_at_least(1)
    result = argparse.ArgumentParser(
        prog="tfdist bench autotune",
        description="Autotune's trial on each model, then every candidate setting measured "
                    "again in alternating rounds: is the pick the fastest?")
    result.add_argument("--models", default="transformer=tiny,transformer=small,"
                        "transformer=base,cnn=resnet_tiny",
                        help="MODEL=SIZE items, comma-separated (default: the Transformer "
                             "tiny, small and base and the CNN resnet_tiny)")
    result.add_argument("--batch", type=positive, default=None,
                        help="global batch (default: the recipes' defaults: transformer tiny 64, "
                             "small 32; cnn resnet_tiny 128; base and large 16)")
    add_round_flags(result, rounds=4, steps=3, sequence_length=None, vocab_size=None,
                    token_defaults=("128; --quick 32", "8000; --quick 256"),
                    quick="small data, batch 8, 1 round of 2 steps, a 1 s trial (for tests); "
                          "flags given with it win")
    return result


def workloads_to_check(args):
    """The `(workload, global batch)` pairs `tfdist bench autotune` checks, from its flags
    (parsed with `tfdist.bench.flags.parse_quick(parser(), argv, QUICK)`).

    Example:

    >>> from tfdist.bench.flags import parse_quick
    >>> args = parse_quick(parser(), ["--quick", "--models", "cnn=resnet_tiny"], QUICK)
    >>> [(workload.image_size, batch) for workload, batch in workloads_to_check(args)]
    [(16, 8)]
    """
    from tfdist.bench.flags import refuse_token_flags_without_tokens
    from tfdist.bench.workloads import Workload, data_options, default_batch

    items = [item.partition("=") for item in
             filter(None, (part.strip() for part in args.models.split(",")))]
    refuse_token_flags_without_tokens(args, any(model == "transformer" for model, _, _ in items))
    workloads = []
    for model, _, size in items:
        workload = Workload(model, size=size or None, **data_options(
            model, args.quick, args.sequence_length, args.vocab_size))
        workloads.append((workload, args.batch or default_batch(model, workload.size)))
    return workloads


def main(argv=None):
    """`tfdist bench autotune [FLAGS]`: runs the check, prints the table; exit code.

    Example:

    >>> main(["--quick", "--models", "transformer=tiny"])  # doctest: +SKIP
    0
    """
    from tfdist.bench.flags import parse_quick
    from tfdist.runtime.tf_logging import import_tensorflow

    args = parse_quick(parser(), sys.argv[1:] if argv is None else argv, QUICK)
    import_tensorflow(args.tf_log_level)
    workloads = workloads_to_check(args)
    budget = dict(trial_seconds=args.trial_seconds) if args.quick else {}
    reports = []
    for workload, batch in workloads:
        print(f"== {workload.label}, global batch {batch}", flush=True)
        reports.append(check_autotune(workload, batch, rounds=args.rounds, steps=args.steps,
                                      log=print, **budget))
    print(format_check(reports))
    if args.json_out:
        write_json(args.json_out, reports)
        print(f"Wrote {args.json_out}")
    return 0
