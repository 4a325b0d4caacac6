"""The arithmetic of every figure the benchmark reports, on plain numbers.

No TensorFlow here: each function takes measured numbers (seconds, FLOP/s,
examples/s) and returns a derived figure, so tests can check each one on
fixed inputs. Throughput itself (examples/s, tokens/s, step time mean and
percentiles) comes from `tfdist.callbacks.ThroughputMeter.figures`.

Example:

    >>> speedup(150.0, 100.0)
    1.5
    >>> scaling_efficiency(1.5, replicas=2)
    0.75
"""

import math
import statistics

from tfdist.runtime.argtypes import check_int_at_least, check_number

PERCENTILES = (50, 90, 99)
"""Step-time percentiles the report shows."""


def _check_positive(name, value):
    check_number(name, value, above=0)


def _check_non_negative(name, value):
    check_number(name, value, at_least=0)


def speedup(throughput, baseline_throughput):
    """Speedup of a run over the baseline: the ratio of their throughputs.

    Args:
        throughput: examples/s (or tokens/s) of the run, > 0.
        baseline_throughput: the same unit for the baseline (1 replica,
            1 worker), > 0.

    Returns:
        `throughput / baseline_throughput`.

    Raises:
        ValueError: a throughput that is not a finite number > 0.

    Example:

    >>> speedup(300.0, 200.0)
    1.5
    """
    _check_positive("throughput", throughput)
    _check_positive("baseline_throughput", baseline_throughput)
    return throughput / baseline_throughput


def scaling_efficiency(speedup_value, replicas, baseline_replicas=1):
    """Scaling efficiency: speedup divided by the growth in replicas.

    With weak scaling (fixed per-replica batch) an ideal system keeps the
    per-replica throughput, so its speedup equals `replicas /
    baseline_replicas` and its efficiency is 1. The same definition is used
    for strong scaling (fixed global batch).

    Args:
        speedup_value: the run's speedup over the baseline (see `speedup`).
        replicas: replicas in the run (all devices of all workers), >= 1.
        baseline_replicas: replicas of the baseline run, >= 1.

    Returns:
        `speedup_value / (replicas / baseline_replicas)`.

    Raises:
        ValueError: replicas that are not integers >= 1, or a speedup that
            is not a finite number > 0.

    Example:

    >>> scaling_efficiency(1.8, replicas=2)
    0.9
    """
    _check_positive("speedup", speedup_value)
    for name, value in (("replicas", replicas), ("baseline_replicas", baseline_replicas)):
        check_int_at_least(name, value, 1)
    return speedup_value / (replicas / baseline_replicas)


def matmul_flops(n, m=None, k=None):
    """FLOPs of one `[n, k] x [k, m]` matrix multiply: `2 * n * m * k`.

    A multiply-add counts 2 FLOPs, as in the models' FLOP counts.

    Args:
        n: rows of the left matrix; `m` and `k` default to `n` (square).
        m: columns of the right matrix.
        k: the shared dimension.

    Example:

    >>> matmul_flops(2048)
    17179869184
    """
    m = n if m is None else m
    k = n if k is None else k
    for name, value in (("n", n), ("m", m), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"matmul dimension {name} must be an integer >= 1, got {value!r}.")
    return 2 * n * m * k


def flops_per_sec(flops, seconds):
    """FLOP/s of work `flops` done in `seconds`.

    Args:
        flops: the work, >= 0.
        seconds: the time it took, > 0.

    Example:

    >>> flops_per_sec(17179869184, 0.1) / 1e9
    171.79869184
    """
    _check_non_negative("flops", flops)
    _check_positive("seconds", seconds)
    return flops / seconds


def model_flops_utilization(model_flops_per_sec, peak_flops_per_sec):
    """MFU: the model's useful FLOP/s as a fraction of a peak FLOP/s.

    The peak here is what a large matmul reaches on the same devices, in the
    same precision and the same run (not a datasheet figure), so MFU says how
    close training comes to the best this hardware shows on dense algebra.

    Args:
        model_flops_per_sec: analytic model FLOPs per example x examples/s.
        peak_flops_per_sec: measured matmul FLOP/s of all devices, > 0.

    Returns:
        The ratio (0.5 means 50%).

    Example:

    >>> model_flops_utilization(80e9, 200e9)
    0.4
    """
    _check_non_negative("model_flops_per_sec", model_flops_per_sec)
    _check_positive("peak_flops_per_sec", peak_flops_per_sec)
    return model_flops_per_sec / peak_flops_per_sec


def input_wait_share(step_time, compute_step_time):
    """Share of the step time spent waiting for input.

    Measured by difference: `step_time` is the mean step time with the real
    input pipeline, `compute_step_time` with the same batch served from
    memory (no input work). What the real pipeline adds is waiting:
    `(step_time - compute_step_time) / step_time`, clamped to `[0, 1]`
    (noise can make the in-memory run the slower one).

    Args:
        step_time: seconds per step with the input pipeline, > 0.
        compute_step_time: seconds per step without input work, > 0.

    Example:

    >>> input_wait_share(0.5, 0.4)
    0.2
    >>> input_wait_share(0.4, 0.5)
    0.0
    """
    _check_positive("step_time", step_time)
    _check_positive("compute_step_time", compute_step_time)
    return min(1.0, max(0.0, (step_time - compute_step_time) / step_time))


def percentiles(values, which=PERCENTILES):
    """Linear-interpolation percentiles (numpy's default method) of `values`.

    Args:
        values: a non-empty sequence of numbers (e.g. step times in ms).
        which: the percentiles wanted, each in [0, 100].

    Returns:
        A dict `{"p50": ..., "p90": ..., ...}`.

    Raises:
        ValueError: `values` is empty or a percentile is out of range.

    Example:

    >>> percentiles([1, 2, 3, 4, 5], (50, 90))
    {'p50': 3.0, 'p90': 4.6}
    """
    data = sorted(float(v) for v in values)
    if not data:
        raise ValueError("percentiles() needs at least one value, got none.")
    result = {}
    for q in which:
        if not 0 <= q <= 100:
            raise ValueError(f"A percentile must be in [0, 100], got {q!r}.")
        position = (len(data) - 1) * q / 100.0
        low = math.floor(position)
        high = min(low + 1, len(data) - 1)
        value = data[low] + (data[high] - data[low]) * (position - low)
        result[f"p{q:g}"] = round(value, 12)
    return result


def paired_ratio(numerators, denominators):
    """Median of round-by-round ratios of two alternating measurements.

    Speeds on a shared machine drift; comparing the two settings within each
    round (measured back to back) and taking the median over rounds cancels
    most of the drift and ignores a disturbed round.

    Args:
        numerators: throughput of setting A in each round.
        denominators: throughput of setting B in the same rounds (same length).

    Returns:
        A dict: `ratio` (median of the per-round ratios), `low` and `high`
        (their min and max), `rounds`.

    Raises:
        ValueError: the lists differ in length, are empty, or hold a value
            that is not > 0.

    Example:

    >>> paired_ratio([200, 210, 150], [100, 100, 100])
    {'ratio': 2.0, 'low': 1.5, 'high': 2.1, 'rounds': 3}
    """
    numerators, denominators = list(numerators), list(denominators)
    if not numerators or len(numerators) != len(denominators):
        raise ValueError(f"paired_ratio needs two equally long, non-empty lists; got "
                         f"{len(numerators)} and {len(denominators)} values.")
    ratios = [speedup(a, b) for a, b in zip(numerators, denominators)]
    return {"ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
            "rounds": len(ratios)}


def input_headroom(pipeline_examples_per_sec, training_examples_per_sec):
    """How many times faster the input pipeline alone is than training.

    Args:
        pipeline_examples_per_sec: examples/s of the input pipeline iterated
            alone, > 0.
        training_examples_per_sec: examples/s of training, > 0.

    Example:

    >>> input_headroom(1000.0, 250.0)
    4.0
    """
    return speedup(pipeline_examples_per_sec, training_examples_per_sec)


INPUT_HEADROOM_WARNING = 2.0
"""Warn when the pipeline alone is less than this many times faster than training."""


def input_bound_advice(headroom, threshold=INPUT_HEADROOM_WARNING):
    """A warning with advice when the pipeline is too close to the training rate.

    Args:
        headroom: `input_headroom(...)`.
        threshold: warn below this ratio.

    Returns:
        None when `headroom >= threshold`, else a message.

    Example:

    >>> input_bound_advice(3.0) is None
    True
    """
    _check_positive("headroom", headroom)
    if headroom >= threshold:
        return None
    return (f"The input pipeline alone delivers only {headroom:.2f}x the training rate "
            f"(< {threshold:g}x): training is or will become input-bound. Cache decoded "
            "examples (cache=True in make_dataset_fn), raise the parallelism of decode/augment "
            "(num_parallel_calls, already AUTOTUNE in tfdist.data), prefetch more batches, "
            "move augmentation to the accelerator, or preprocess offline into TFRecords.")


def fastest_peak(peaks):
    """The highest of the matmul peaks measured in one run, and its precision.

    MFU against this peak says how far a run is from the fastest dense
    algebra the machine showed in any precision (e.g. a float32 run on a CPU
    with fast bfloat16 against the bfloat16 peak), not only in its own.

    Args:
        peaks: `{precision: FLOP/s}` (as `run_comparison` reports them),
            non-empty, each a finite number > 0.

    Returns:
        `(precision, flops_per_sec)`; of equal peaks, the first in `peaks`.

    Raises:
        ValueError: no peaks, or a peak that is not a finite number > 0 (its
            precision is named).

    Example:

    >>> fastest_peak({"float32": 2.1e11, "mixed_bfloat16": 4.1e11})
    ('mixed_bfloat16', 410000000000.0)
    """
    if not peaks:
        raise ValueError(f"fastest_peak needs at least one measured peak, got {peaks!r}.")
    for precision, value in peaks.items():
        _check_positive(f"peak of {precision}", value)
    best = max(peaks.values())
    return next((p, v) for p, v in peaks.items() if v == best)


def mfu_vs_fastest_peak(model_flops_per_sec, peaks):
    """MFU against the fastest peak of the run (see `fastest_peak`), named.

    Args:
        model_flops_per_sec: the model's FLOP/s (analytic FLOPs x examples/s).
        peaks: `{precision: FLOP/s}` measured in the same run.

    Returns:
        `{"mfu_vs_fastest_peak": ..., "fastest_peak_precision": ...,
        "fastest_peak_flops_per_sec": ...}`.

    Raises:
        ValueError: see `fastest_peak` and `model_flops_utilization`.

    Example:

    >>> mfu_vs_fastest_peak(41e9, {"float32": 2e11, "mixed_bfloat16": 4.1e11})
    {'mfu_vs_fastest_peak': 0.1, 'fastest_peak_precision': 'mixed_bfloat16', \
'fastest_peak_flops_per_sec': 410000000000.0}
    """
    precision, peak = fastest_peak(peaks)
    return {"mfu_vs_fastest_peak": model_flops_utilization(model_flops_per_sec, peak),
            "fastest_peak_precision": precision, "fastest_peak_flops_per_sec": peak}


STEP_PARTS = (("matmul", ("matmul",)), ("softmax/loss", ("softmax/loss",)),
              ("elementwise", ("rng and bitwise", "data and copies", "elementwise and other")))
"""Parts of a step's compute time, each with the profile op kinds it sums
(`tfdist.bench.profile.KINDS` and `OTHER`): everything but matmuls and
softmax/loss counts as elementwise (copies, RNG, other ops too)."""
STEP_SHARES = ("data",) + tuple(part for part, _ in STEP_PARTS)
"""Keys of `step_time_shares`: input wait first, then the compute parts."""


def step_time_shares(kind_shares, input_wait_share):
    """Splits a step into input wait and the compute parts of `STEP_PARTS`.

    The input-wait share (`input_wait_share`) is the `data` part; the rest of
    the step, `1 - input_wait_share`, is compute, split in proportion to the
    op kinds' shares of a profile's op self time (`summarise_events`). The
    split assumes the op self times add up in the same proportions as their
    wall time (ops on parallel threads count each). The four parts sum to 1.

    Args:
        kind_shares: `{profile op kind: share}` (times work too: only their
            proportions count); kinds left out count 0, at least one > 0.
        input_wait_share: the share of the step spent waiting for input, in
            `[0, 1]` (`input_wait_share`).

    Returns:
        `{"data": ..., "matmul": ..., "softmax/loss": ..., "elementwise": ...}`.

    Raises:
        ValueError: an unknown kind (the known ones are named), a negative or
            non-number share, all shares 0, or a wait share outside [0, 1].

    Example:

    >>> step_time_shares({"matmul": 0.5, "softmax/loss": 0.25, "data and copies": 0.125,
    ...                   "elementwise and other": 0.125}, 0.25)
    {'data': 0.25, 'matmul': 0.375, 'softmax/loss': 0.1875, 'elementwise': 0.1875}
    """
    known = [kind for _, kinds in STEP_PARTS for kind in kinds]
    unknown = [kind for kind in kind_shares if kind not in known]
    if unknown:
        raise ValueError(f"Unknown op kind(s) {unknown}; the known ones are {', '.join(known)}.")
    for kind, value in kind_shares.items():
        _check_non_negative(f"share of {kind}", value)
    total = sum(kind_shares.values())
    if total <= 0:
        raise ValueError(f"The op kind shares are all 0 ({kind_shares!r}): nothing was profiled "
                         "to split the compute time by.")
    _check_non_negative("input_wait_share", input_wait_share)
    if input_wait_share > 1:
        raise ValueError(f"input_wait_share must be in [0, 1], got {input_wait_share!r}.")
    compute = 1.0 - input_wait_share
    shares = {"data": float(input_wait_share)}
    for part, kinds in STEP_PARTS:
        shares[part] = compute * sum(kind_shares.get(kind, 0) for kind in kinds) / total
    return shares
