"""The speed goals `tfdist bench engine --goals` measures on the CPU at hand.

Both goals are measured in the engine benchmark's one process, in
alternating rounds, as ratios (never as absolute speeds):

* **throughput**: the recipe's defaults (`--strategy/--precision/--xla
  auto`) train at least `RATIO_GOAL` times as many examples per second as
  Keras `fit` at its best setting, with Keras's standard loss and accuracy
  (`Workload.keras_standard_loss`) and Keras's own optimizer class (the
  recipe's AdamW is tfdist's fused one). "Best" is the fastest, in the same
  rounds, of every precision tfdist's autotune would try on this machine,
  each with XLA off and on;
* **MFU**: the defaults' model FLOP/s reach at least `MFU_GOALS[(model,
  size)]` of the same-run matmul peak of the machine's fastest precision.

Both engines train the same model, so the throughput ratio can only come
from what an engine adds around the model's forward and backward passes.
The same rounds therefore also time the model alone (`MODEL_ALONE`: its
forward and backward in the defaults' precision and XLA setting, with no
loss, metric or optimizer update; `tfdist.bench.model_alone`) and report
the **ceiling**: the model alone / Keras's best. No engine that runs this
model's TensorFlow forward and backward reaches a ratio above it on this
machine; a ceiling under `RATIO_GOAL` says the goal cannot be met by the
engine, only by a faster model. The model alone's MFU is the ceiling of
the MFU goal in the same sense.

Example:

    entrants, comparisons = goal_entrants(cpu_flags={"avx2", "avx512_bf16"})
    # ... run_comparison(entrants + ..., [*comparisons, ...], workload, 32)
    for goal in evaluate_goals(report, workload):
        print(goal["goal"], goal["met"])
"""

from tfdist.bench.compare import Entrant
from tfdist.bench.engines import Setting

RATIO_GOAL = 1.4
"""tfdist's defaults / Keras fit's best setting with Keras's loss."""

MFU_GOALS = {("transformer", "small"): 0.60, ("transformer", "base"): 0.75,
             ("cnn", "resnet_tiny"): 0.35}
"""MFU of tfdist's defaults against the fastest same-run matmul peak, by (model, size)."""

GOAL_LABEL = "goal: tfdist defaults / keras fit's best setting with Keras's loss"
CEILING_LABEL = "ceiling: the model alone / keras fit's best setting with Keras's loss"
DEFAULTS = "tfdist defaults"
"""The engine benchmark's entrant for the recipe's defaults."""
MODEL_ALONE = "model alone"
"""The entrant timing the model's forward and backward alone (engine "model")."""

_SHORT = {"float32": "fp32", "mixed_bfloat16": "bf16", "mixed_float16": "fp16"}


def keras_best_candidates(cpu_flags, gpu_capabilities=()):
    """The Keras `fit` settings whose fastest is "Keras's best": `Setting`s with Keras's loss.

    The precisions are those tfdist's autotune would try on this hardware
    (`tfdist.autotune.candidates.candidate_precisions`), each with XLA off
    and on.

    Args:
        cpu_flags: the CPU's feature flags (`tfdist.precision.cpu_flags`).
        gpu_capabilities: `(major, minor)` of each GPU (none: CPU only).

    Example:

    >>> [s.label for s in keras_best_candidates({"avx2"})]
    ["keras fit, float32, XLA off, Keras's loss", "keras fit, float32, XLA on, Keras's loss"]
    """
    from tfdist.autotune.candidates import candidate_precisions

    policies, _ = candidate_precisions("auto", bool(gpu_capabilities), gpu_capabilities,
                                       cpu_flags)
    return [Setting("keras", policy, xla, loss="keras") for policy in policies
            for xla in ("off", "on")]


def goal_entrants(cpu_flags=None, gpu_capabilities=None):
    """The Keras-best entrants and the goal comparison to add to the engine benchmark.

    Args:
        cpu_flags, gpu_capabilities: the hardware (default: this machine's,
            `tfdist.autotune.tune.machine_hardware`, which honours
            `TFDIST_CPU_FLAGS`).

    Returns:
        `(entrants, comparisons)`: the Keras `Entrant`s (a precision other
        than float32 is optional: reported as unsupported if it fails here)
        and the model alone (`MODEL_ALONE`, in the defaults' precision and
        XLA setting); and two comparisons against the fastest of the Keras
        entrants (`tfdist.bench.compare.fastest_of`): `(GOAL_LABEL, DEFAULTS,
        their names)` and `(CEILING_LABEL, MODEL_ALONE, their names)`.

    Example:

    >>> entrants, [(label, ours, theirs), ceiling] = goal_entrants({"avx2"}, [])
    >>> theirs
    ('keras fp32 xla-off keras-loss', 'keras fp32 xla-on keras-loss')
    """
    if cpu_flags is None or gpu_capabilities is None:
        from tfdist.autotune.tune import machine_hardware

        flags, capabilities = machine_hardware()
        cpu_flags = flags if cpu_flags is None else cpu_flags
        gpu_capabilities = capabilities if gpu_capabilities is None else gpu_capabilities
    keras_best = [Entrant(f"keras {_SHORT.get(s.precision, s.precision)} xla-{s.xla} keras-loss",
                          s, "default", optional=s.precision != "float32")
                  for s in keras_best_candidates(cpu_flags, gpu_capabilities)]
    theirs = tuple(e.name for e in keras_best)
    model_alone = Entrant(MODEL_ALONE, Setting("model", "auto", "auto"), "default")
    return [*keras_best, model_alone], [(GOAL_LABEL, DEFAULTS, theirs),
                                        (CEILING_LABEL, MODEL_ALONE, theirs)]


def evaluate_goals(report, workload):
    """Each goal's measured value against its target, from an engine report.

    Args:
        report: a `run_comparison` report holding the `GOAL_LABEL` comparison.
        workload: its `Workload` (the MFU goal depends on the model and size).

    Returns:
        A list of dicts: `goal`, `value` (None when not measured), `target`
        (None when no goal is set for this model size), `met` (True, False,
        or None when either is missing) and `detail`.

    Raises:
        ValueError: the report has no goal comparison (run with `--goals`).

    Example:

    >>> [(g["goal"], g["met"]) for g in evaluate_goals(report, Workload("transformer"))]
    [('throughput vs keras fit', False), ('MFU vs fastest peak', False)]
    """
    comparison = _find_comparison(report, GOAL_LABEL)
    if comparison is None:
        raise ValueError(f"The report has no {GOAL_LABEL!r} comparison; run the engine "
                         f"benchmark with --goals.")
    goals = [_goal("throughput vs keras fit", *_ratio_and_detail(comparison), RATIO_GOAL)]
    figures = report["contenders"].get(comparison["numerator"], {})
    mfu = figures.get("mfu_vs_fastest_peak")
    target = MFU_GOALS.get((workload.model, workload.size))
    if mfu is None:
        detail = "not measured (no matmul peak or model FLOPs)"
    else:
        detail = (f"{comparison['numerator']} vs the {figures['fastest_peak_precision']} peak "
                  f"{figures['fastest_peak_flops_per_sec'] / 1e9:.1f} GFLOP/s")
    if target is None:
        detail += (f"; no MFU goal for {workload.model} {workload.size} (goals: "
                   + ", ".join(f"{m} {s}" for m, s in MFU_GOALS) + ")")
    goals.append(_goal("MFU vs fastest peak", mfu, detail, target))
    return goals


def evaluate_ceilings(report, workload):
    """How far the engine alone could take each goal: the model alone's ratio and MFU.

    Args:
        report: a `run_comparison` report; one without the `CEILING_LABEL`
            comparison (written before it existed) has no ceilings.
        workload: its `Workload`.

    Returns:
        A list of dicts: `ceiling` ("throughput ratio", "MFU"), `value`
        (None when not measured), `target` (the goal's; None when none is
        set), `reachable` (`value >= target`, or None when either is
        missing) and `detail`.

    Example:

    >>> [(c["ceiling"], c["reachable"]) for c in evaluate_ceilings(report, Workload("cnn"))]
    [('throughput ratio', False), ('MFU', True)]
    """
    comparison = _find_comparison(report, CEILING_LABEL)
    if comparison is None:
        return []
    figures = report["contenders"].get(comparison["numerator"], {})
    return [_ceiling("throughput ratio", *_ratio_and_detail(comparison), RATIO_GOAL),
            _ceiling("MFU", figures.get("mfu_vs_fastest_peak"),
                     f"{comparison['numerator']} vs the fastest peak",
                     MFU_GOALS.get((workload.model, workload.size)))]


def _find_comparison(report, label):
    return next((c for c in report["comparisons"] if c["label"] == label), None)


def _ratio_and_detail(comparison):
    """`(ratio, detail)` of a comparison; `(None, why)` when a side was not measured."""
    if "error" in comparison:
        return None, f"not measured: {comparison['error'][:160]}"
    return comparison["ratio"], f"{comparison['numerator']} / {comparison['denominator']}"


def _at_least(value, target):
    return None if value is None or target is None else value >= target


def _ceiling(name, value, detail, target):
    return {"ceiling": name, "value": value, "target": target,
            "reachable": _at_least(value, target), "detail": detail}


def _goal(name, value, detail, target):
    return {"goal": name, "value": value, "target": target, "met": _at_least(value, target),
            "detail": detail}


def format_goals(goals, cpu_description, ceilings=()):
    """The goal lines of the engine benchmark's output, then the ceilings' lines.

    Args:
        goals: what `evaluate_goals` returns.
        cpu_description: the CPU they were measured on (name and flags).
        ceilings: what `evaluate_ceilings` returns (none: no ceiling lines).

    Example:

    >>> print(format_goals(goals, "Intel Xeon (amx_bf16)", ceilings))
    speed goals on this CPU (Intel Xeon (amx_bf16)):
      throughput vs keras fit: 1.21x, goal >= 1.40x: NOT MET (tfdist defaults / ...)
      MFU vs fastest peak: 14.3%, goal >= 60%: NOT MET (...)
    ceilings (the model's forward and backward alone: no loss, metric or update):
      throughput ratio: 1.31x, goal >= 1.40x: out of any engine's reach here (...)
      MFU: 17.0%, goal >= 60%: out of any engine's reach here (...)
    """
    lines = [f"  speed goals on this CPU ({cpu_description}):"]
    for goal in goals:
        verdict = {True: "met", False: "NOT MET", None: "not judged"}[goal["met"]]
        lines.append(f"    {goal['goal']}: {_value_and_target(goal, goal['goal'])}: {verdict} "
                     f"({goal['detail']})")
    if ceilings:
        lines.append("  ceilings (the model's forward and backward alone: no loss, metric "
                     "or update):")
    for ceiling in ceilings:
        verdict = {True: "within an engine's reach",
                   False: "out of any engine's reach here",
                   None: "not judged"}[ceiling["reachable"]]
        lines.append(f"    {ceiling['ceiling']}: {_value_and_target(ceiling, ceiling['ceiling'])}"
                     f": {verdict} ({ceiling['detail']})")
    return "\n".join(lines)


def _value_and_target(entry, name):
    percent = name.startswith("MFU")
    value = ("not measured" if entry["value"] is None else
             f"{100 * entry['value']:.1f}%" if percent else f"{entry['value']:.2f}x")
    target = ("no goal" if entry["target"] is None else
              f"goal >= {100 * entry['target']:.0f}%" if percent
              else f"goal >= {entry['target']:.2f}x")
    return f"{value}, {target}"


def describe_cpu():
    """This CPU's model name and its flags that decide the precisions, e.g.
    'Intel(R) Xeon(R) Processor (amx_bf16 avx512_bf16 avx2)'.

    Example:

    >>> describe_cpu()  # doctest: +SKIP
    'AMD EPYC 9B14 (avx512_bf16 avx2)'
    """
    import os

    from tfdist.precision import CPU_FLAGS_ENV, cpu_flags, cpu_model_name

    shown = " ".join(f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2")
                     if f in cpu_flags()) or "no AVX2"
    if CPU_FLAGS_ENV in os.environ:
        shown = f"flags as {CPU_FLAGS_ENV} describes them: {shown}"
    return f"{cpu_model_name()} ({shown})"
