"""tfdist.bench: throughput, MFU, scaling and settings benchmarks of the recipes' models.

    python -m tfdist.bench                  # full report into bench-results/ (< 10 min, 2 CPUs)
    python -m tfdist.bench --quick          # tiny workloads, for tests
    python -m tfdist.bench engine           # tfdist's engine vs Keras fit, alternating

Modules, one job each:

    figures         the arithmetic of every reported figure (no TensorFlow)
    workloads       the recipes' models and data, sized for a benchmark
    engines         one contender: a setting (engine, precision, XLA) built and runnable
    timing          StepClock: per-step wall times
    alternate       alternating rounds and their summary figures
    compare         entrants, comparisons, ratios (used by engine_compare and settings)
    engine_compare  tfdist vs Keras fit: same settings, defaults vs defaults
    settings        float32 vs bf16 vs fp16, XLA on vs off, tfdist vs Keras fit
    peak            the same-run matmul peak for MFU
    point, sweep    the scaling sweep, one fresh process (or launcher job) per point
    load            how busy the machine was with other work
    profile         where a step's time goes (op kinds from a profile)
    report, plot    report.md, results.json, scaling.png
    run, cli        the full report and the command line

Example:

    from tfdist.bench import main
    main(["--quick", "--out", "/tmp/bench"])
"""

from tfdist.bench.commands import main

__all__ = ["main"]
