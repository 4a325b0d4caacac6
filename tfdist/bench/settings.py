"""The settings comparison: precision, XLA and engine, in one run, alternating.

With tfdist's engine, float32 with XLA off is the baseline; against it:
mixed_bfloat16 and mixed_float16 (XLA off, where this machine runs them),
XLA on (float32), and Keras `fit` (float32, XLA off). Each precision's MFU
is taken against a matmul peak measured in that precision in the same run,
and against the fastest peak of the run (float32 and mixed_bfloat16 are
always measured); every contender also runs on one batch replayed from
memory for its input-wait share and, with a profile folder, gets the
shares of its step in input wait, matmul, softmax/loss and elementwise.

Example:

    report = compare_settings(Workload("transformer", size="small"), 32)
    print(format_comparison(report, TITLE))
"""

from tfdist.bench.compare import REFERENCE_PEAKS, Entrant, run_comparison
from tfdist.bench.engines import Setting

TITLE = "Settings"
FACTORS = ("precision", "xla", "engine")
BASELINE = "tfdist fp32"


def settings_entrants(factors=FACTORS, strategy="default"):
    """The entrants and comparisons of the settings benchmark.

    Args:
        factors: which of "precision", "xla", "engine" to vary (each against
            the tfdist float32, XLA off baseline).
        strategy: the strategy of every entrant.

    Returns:
        `(entrants, comparisons)` for `run_comparison`.

    Raises:
        ValueError: an unknown factor (the allowed ones are named).

    Example:

    >>> entrants, comparisons = settings_entrants(("xla",))
    >>> [e.name for e in entrants], comparisons[0][0]
    (['tfdist fp32', 'tfdist fp32 xla'], 'XLA on / off (tfdist, float32)')
    """
    unknown = [f for f in factors if f not in FACTORS]
    if unknown:
        raise ValueError(f"Unknown settings factor(s) {unknown}; choose from {', '.join(FACTORS)}.")
    entrants = [Entrant(BASELINE, Setting("tfdist", "float32", "off"), strategy)]
    comparisons = []
    if "precision" in factors:
        for short, policy in (("bf16", "mixed_bfloat16"), ("fp16", "mixed_float16")):
            name = f"tfdist {short}"
            entrants.append(Entrant(name, Setting("tfdist", policy, "off"), strategy,
                                    optional=True))
            comparisons.append((f"{policy} / float32 (tfdist, XLA off)", name, BASELINE))
    if "xla" in factors:
        entrants.append(Entrant("tfdist fp32 xla", Setting("tfdist", "float32", "on"), strategy))
        comparisons.append(("XLA on / off (tfdist, float32)", "tfdist fp32 xla", BASELINE))
    if "engine" in factors:
        entrants.append(Entrant("keras fit fp32", Setting("keras", "float32", "off"), strategy))
        comparisons.append(("tfdist / keras fit (float32, XLA off)", BASELINE, "keras fit fp32"))
    return entrants, comparisons


def compare_settings(workload, global_batch_size, *, factors=FACTORS, strategy="default",
                     rounds=3, steps=3, warmup_steps=2, seed=0, input_check=True,
                     input_share=True, profile_dir=None, peak_size=None,
                     reference_peaks=REFERENCE_PEAKS, log=None):
    """Runs the settings comparison (and the input-bound check); returns the report.

    Args:
        workload: a `tfdist.bench.workloads.Workload`.
        global_batch_size: examples per step.
        factors, strategy: see `settings_entrants`.
        rounds, steps, warmup_steps, seed, input_share, profile_dir, peak_size,
            reference_peaks, log: see `run_comparison`.
        input_check: alternate the input pipeline alone too, and compare its
            rate with the baseline's training rate.

    Example:

    >>> report = compare_settings(Workload("cnn"), 128, factors=("xla",), rounds=2)
    >>> report["comparisons"][0]["ratio"] > 0
    True
    """
    entrants, comparisons = settings_entrants(factors, strategy)
    return run_comparison(entrants, comparisons, workload, global_batch_size, rounds=rounds,
                          steps=steps, warmup_steps=warmup_steps, seed=seed,
                          pipeline_probe=input_check, input_share=input_share,
                          profile_dir=profile_dir, peak_size=peak_size,
                          reference_peaks=reference_peaks, log=log)
