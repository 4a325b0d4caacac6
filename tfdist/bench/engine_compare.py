"""tfdist's engine vs Keras `model.fit`: same model, data, precision and strategy.

Two kinds of comparison, measured in one process in alternating rounds:

* **same settings**: both engines with the same precision, XLA setting and
  strategy (float32; XLA off, and XLA on);
* **defaults vs defaults**: tfdist as a recipe resolves `--strategy auto
  --precision auto --xla auto` on this machine, against Keras `fit` with
  `compile()` defaults (`jit_compile="auto"`, the float32 policy, no
  strategy), both with the recipe's optimizer, loss and metrics.

Example:

    report = compare_engines(Workload("transformer", size="small"), global_batch_size=32)
    print(format_comparison(report, "tfdist engine vs Keras fit"))
"""

from tfdist.bench.compare import REFERENCE_PEAKS, Entrant, run_comparison
from tfdist.bench.engines import Setting
from tfdist.bench.goals import (DEFAULTS, describe_cpu, evaluate_ceilings, evaluate_goals,
                                goal_entrants)

TITLE = "tfdist engine vs Keras fit"
DEFAULT_STEPS = {"transformer": 3, "cnn": 30}
"""Timed steps per contender and round by default. The CNN's step is about ten
times shorter than the Transformer `small`'s: at 3 steps a round, the input
pipeline filling up again after each round's new iterator decided its ratio
(tfdist / Keras fit 0.82x-1.11x on one Xeon the same day); at 30 steps the
engines measured at parity, as they are at equal settings."""


def default_steps(model):
    """The timed steps per round `tfdist bench engine` uses for a model (`DEFAULT_STEPS`).

    Example:

    >>> default_steps("cnn"), default_steps("transformer")
    (30, 3)
    """
    return DEFAULT_STEPS[model]


def engine_entrants(strategy="default", devices=None, same_xla=("off", "on")):
    """The entrants and comparisons of the engine benchmark.

    Args:
        strategy: strategy of the same-settings pairs ("default" = no
            distribution; "mirrored" with `devices=1` is the other natural
            choice).
        devices: devices of that strategy (None: its default).
        same_xla: XLA settings ("on", "off") of the same-settings pairs.

    Returns:
        `(entrants, comparisons)`: a list of `Entrant`s and a list of
        `(label, tfdist entrant, keras entrant)`.

    Raises:
        ValueError: an XLA setting other than "on"/"off".

    Example:

    >>> entrants, comparisons = engine_entrants(same_xla=("off",))
    >>> [label for label, _, _ in comparisons]
    ['same settings (float32, XLA off, strategy default): tfdist / keras fit', \
'defaults vs defaults: tfdist / keras fit']
    """
    entrants, comparisons = [], []
    where = f"strategy {strategy}" + (f" x{devices}" if devices else "")
    for xla in same_xla:
        if xla not in ("on", "off"):
            raise ValueError(f"same_xla holds {xla!r}; each must be 'on' or 'off'.")
        ours, theirs = f"tfdist fp32 xla-{xla}", f"keras fp32 xla-{xla}"
        entrants += [Entrant(ours, Setting("tfdist", "float32", xla), strategy, devices),
                     Entrant(theirs, Setting("keras", "float32", xla), strategy, devices)]
        comparisons.append((f"same settings (float32, XLA {xla}, {where}): tfdist / keras fit",
                            ours, theirs))
    entrants += [Entrant(DEFAULTS, Setting("tfdist", "auto", "auto"), "auto"),
                 Entrant("keras defaults", Setting("keras", "float32", "auto"), "default")]
    comparisons.append(("defaults vs defaults: tfdist / keras fit", DEFAULTS,
                        "keras defaults"))
    return entrants, comparisons


def compare_engines(workload, global_batch_size, *, strategy="default", devices=None,
                    same_xla=("off", "on"), goals=False, rounds=6, steps=3, warmup_steps=2, seed=0,
                    measure_peaks=True, profile_dir=None, input_share=True, peak_size=None,
                    reference_peaks=REFERENCE_PEAKS, log=None):
    """Runs the engine benchmark; returns a `run_comparison` report.

    Args:
        workload: a `tfdist.bench.workloads.Workload`.
        global_batch_size: examples per step.
        strategy, devices, same_xla: see `engine_entrants`.
        goals: also measure Keras `fit` at each setting its best is chosen
            from, with Keras's standard loss, and the model alone, and add
            the speed-goal and ceiling comparisons (`tfdist.bench.goals`);
            the report then has `goals` and `ceilings`.
        rounds, steps, warmup_steps, seed, measure_peaks, profile_dir, input_share,
            peak_size, reference_peaks, log: see
            `tfdist.bench.compare.run_comparison` (here the input-wait share
            is measured by default).

    Example:

    >>> report = compare_engines(Workload("transformer", size="small"), 32, rounds=6)
    >>> [round(c["ratio"], 2) for c in report["comparisons"]]
    [1.02, 0.99, 1.41]
    """
    entrants, comparisons = engine_entrants(strategy, devices, same_xla)
    if goals:
        goal_contenders, goal_comparisons = goal_entrants()
        entrants += goal_contenders
        comparisons += goal_comparisons
    report = run_comparison(entrants, comparisons, workload, global_batch_size, rounds=rounds,
                            steps=steps, warmup_steps=warmup_steps, seed=seed,
                            measure_peaks=measure_peaks, profile_dir=profile_dir,
                            input_share=input_share, peak_size=peak_size,
                            reference_peaks=reference_peaks, log=log)
    if goals:
        report["goals"] = evaluate_goals(report, workload)
        report["ceilings"] = evaluate_ceilings(report, workload)
        report["goals_cpu"] = describe_cpu()
    return report
