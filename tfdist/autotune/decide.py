"""Choosing from a trial: the fastest setting whose loss agrees with float32.

A half-precision setting is eligible only if its first loss (its own
evaluation step on the same batch from the same initial weights, in
inference mode) is within
`LOSS_RTOL` of float32's and every loss it logged was finite; float32 with
XLA must agree the same way with float32 without. Among the eligible, the
highest median throughput wins.

Example:

    decision = choose(timings, global_batch_size=32)
    decision.choice.label        # e.g. 'mixed_bfloat16, XLA off'
    print(format_decision(decision))
"""

import dataclasses

LOSS_RTOL = 0.05
"""Largest relative difference of the first loss from float32's that
counts as agreeing. bfloat16 keeps 8 bits of mantissa (about 0.4% per
rounding), and the errors add up over the layers: on an untrained ResNet in
inference mode bfloat16's loss was 1.6% from float32's, on the Transformers
under 0.01%. A setting 5% off computes something else (float16 overflowing,
a kernel without the precision it needs)."""
LOSS_ATOL = 1e-3


@dataclasses.dataclass
class Decision:
    """The trial's outcome.

    Attributes:
        choice: the chosen `Candidate`, or None when none was eligible.
        rows: one dict per candidate: `label`, `examples_per_sec`,
            `vs_best` (throughput / the chosen one's), `loss_diff` (relative
            first-loss difference from float32, or None), `compile_seconds`,
            `eligible`, `note` (why not eligible), `policy`, `xla`.
        reason: one sentence for the start block.
        trial_seconds: the trial's wall time, or None for a cached decision.
        measured_at: when a cached decision was measured (ISO time), or None.

    Example:

    >>> Decision(None, [], "no candidate ran").choice is None
    True
    """

    choice: object
    rows: list
    reason: str
    trial_seconds: float = None
    measured_at: str = None


def _reference_loss(timings):
    """float32's first loss (XLA off preferred), or None when float32 was not timed."""
    for jit in (False, True):
        for timing in timings:
            candidate = timing.candidate
            if (candidate.policy == "float32" and candidate.jit_compile == jit
                    and timing.error is None and timing.first_loss is not None):
                return timing.first_loss
    return None


def loss_agrees(loss, reference, rtol=LOSS_RTOL, atol=LOSS_ATOL):
    """Whether `loss` agrees with the float32 `reference` (None: nothing to compare).

    Example:

    >>> loss_agrees(9.02, 9.0), loss_agrees(9.5, 9.0), loss_agrees(9.5, None)
    (True, False, True)
    """
    if reference is None:
        return True
    return abs(loss - reference) <= rtol * abs(reference) + atol


def choose(timings, global_batch_size, rtol=LOSS_RTOL):
    """Picks the fastest eligible candidate of a trial.

    Args:
        timings: `CandidateTiming`s from `run_trial`.
        global_batch_size: examples per step, for examples/s.
        rtol: see `LOSS_RTOL`.

    Returns:
        A `Decision`.

    Example:

    >>> fast = CandidateTiming(Candidate("mixed_bfloat16", False), 1.0, [0.5], 9.01)
    >>> slow = CandidateTiming(Candidate("float32", False), 1.0, [1.0], 9.0)
    >>> choose([slow, fast], 32).choice.label
    'mixed_bfloat16, XLA off'
    """
    reference = _reference_loss(timings)
    rows = []
    for timing in timings:
        row = {"label": timing.candidate.label, **timing.candidate.as_dict(),
               "examples_per_sec": timing.throughput(global_batch_size),
               "compile_seconds": round(timing.compile_seconds, 2), "loss_diff": None,
               "first_loss": timing.first_loss, "eligible": False, "note": None}
        if timing.error:
            row["note"] = f"could not run ({timing.error})"
        elif not timing.finite or timing.first_loss is None:
            row["note"] = "loss not finite"
        elif not timing.step_times:
            row["note"] = "no step measured"
        else:
            if reference is not None:
                row["loss_diff"] = abs(timing.first_loss - reference) / max(abs(reference), 1e-12)
            if loss_agrees(timing.first_loss, reference, rtol):
                row["eligible"] = True
            else:
                row["note"] = (f"first loss {timing.first_loss:.4f} vs float32 {reference:.4f}: "
                               f"more than {100 * rtol:g}% apart")
        rows.append(row)
    eligible = [(row, timing) for row, timing in zip(rows, timings) if row["eligible"]]
    if not eligible:
        return Decision(None, rows, "autotune: no setting ran with a loss that agrees with "
                                    "float32")
    best_row, best = max(eligible, key=lambda pair: pair[0]["examples_per_sec"])
    for row in rows:
        if row["examples_per_sec"]:
            row["vs_best"] = row["examples_per_sec"] / best_row["examples_per_sec"]
    runner_up = sorted((row["examples_per_sec"] for row, _ in eligible), reverse=True)[1:2]
    margin = (f", {best_row['examples_per_sec'] / runner_up[0]:.2f}x the next"
              if runner_up else "")
    return Decision(best.candidate, rows,
                    f"autotune: fastest of {len(rows)} settings timed on this model{margin}")


def format_decision(decision, global_batch_size=None):
    """The trial's figures as lines of text (what the start block prints).

    Args:
        decision: a `Decision`.
        global_batch_size: shown in the heading, when given.

    Example:

    >>> print(format_decision(Decision(Candidate("float32", True), [
    ...     {"label": "float32, XLA on", "examples_per_sec": 100.0, "vs_best": 1.0,
    ...      "loss_diff": 0.0, "compile_seconds": 3.0, "eligible": True, "note": None}],
    ...     "autotune: fastest", 12.0)))
    autotune trial (12 s, compile included):
      setting                     examples/s   vs chosen   first loss vs fp32   compile
      float32, XLA on                  100.0       1.00x               0.000%     3.0 s  <- chosen
    """
    batch = f", batch {global_batch_size}" if global_batch_size else ""
    if decision.trial_seconds is not None:
        cost = f"{decision.trial_seconds:.0f} s, compile included"
    else:
        cost = "from the cache" + (f", measured {decision.measured_at}"
                                   if decision.measured_at else "")
    lines = [f"autotune trial ({cost}{batch}):",
             f"  {'setting':<26} {'examples/s':>11} {'vs chosen':>11} "
             f"{'first loss vs fp32':>20} {'compile':>9}"]
    chosen = decision.choice.label if decision.choice else None
    for row in decision.rows:
        speed = row.get("examples_per_sec")
        speed_text = f"{speed:.1f}" if speed else "-"
        vs = row.get("vs_best")
        diff = row.get("loss_diff")
        line = (f"  {row['label']:<26} {speed_text:>11} {(f'{vs:.2f}x' if vs else '-'):>11} "
                f"{(f'{100 * diff:.3f}%' if diff is not None else '-'):>20} "
                f"{row.get('compile_seconds') or 0:>7.1f} s")
        if row["label"] == chosen:
            line += "  <- chosen"
        elif row.get("note"):
            line += f"  (not eligible: {row['note']})"
        lines.append(line)
    return "\n".join(lines)
