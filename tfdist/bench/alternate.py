"""Measuring several contenders in one process, in alternating rounds.

A shared machine's speed drifts by tens of percent within minutes; a
comparison is only meaningful between figures taken in the same run, close
in time. `run_rounds` therefore runs every (contender, input) a few steps at
a time in turn, reversing the order every other round, and `summarise`
pools each one's step times into the ThroughputMeter figures and keeps the
per-round throughput for round-by-round ratios (`figures.paired_ratio`).

Example:

    results = run_rounds({"ours": ours, "keras": keras_fit}, rounds=5, steps=4)
    figures = summarise(ours, results["ours"], peak_flops=2.0e11)
    paired_ratio(results["ours"].round_throughput(), results["keras"].round_throughput())
"""

import dataclasses
import logging
import time

from tfdist.bench import figures as fig
from tfdist.runtime.argtypes import check_int_at_least

logger = logging.getLogger("tfdist")


@dataclasses.dataclass
class Rounds:
    """The step times of one contender, per input and per round.

    Args:
        global_batch_size: examples per step.
        times: `{input: [[seconds per step, ...] per round]}`.

    Example:

    >>> Rounds(64, {"pipeline": [[0.5, 0.5], [1.0]]}).pooled()
    [0.5, 0.5, 1.0]
    """

    global_batch_size: int
    times: dict = dataclasses.field(default_factory=dict)

    def pooled(self, input="pipeline"):
        """All measured step times of `input` ("pipeline" or "memory"), in seconds.

        Args:
            input: which input's rounds.

        Example:

        >>> Rounds(8, {"memory": [[0.1], [0.2]]}).pooled("memory")
        [0.1, 0.2]
        """
        return [t for round_times in self.times.get(input, []) for t in round_times]

    def round_throughput(self, input="pipeline"):
        """Examples/s of each round of `input` (global batch / mean step time).

        Args:
            input: which input's rounds.

        Example:

        >>> Rounds(64, {"pipeline": [[0.5, 0.5], [1.0]]}).round_throughput()
        [128.0, 64.0]
        """
        return [self.global_batch_size * len(ts) / sum(ts) for ts in self.times.get(input, [])]


def run_rounds(contenders, rounds, steps, inputs=("pipeline",), warmup_steps=2, log=None):
    """Warms every contender up, then runs them in alternating rounds.

    Args:
        contenders: `{name: Contender}` (insertion order is the first
            round's order; odd rounds run in reverse).
        rounds: number of rounds, >= 1.
        steps: measured steps per contender, input and round, >= 1.
        inputs: which inputs to measure ("pipeline", "memory"); a contender
            with an `inputs` attribute is measured only on those it lists.
        warmup_steps: unmeasured steps per contender and input before the
            first round (tracing, XLA compilation); 0 when they are warm.
        log: called with one progress line per round, or None.

    Returns:
        `{name: Rounds}`.

    Example:

    >>> results = run_rounds({"a": a, "b": b}, rounds=3, steps=4)
    >>> len(results["a"].times["pipeline"])
    3
    """
    check_int_at_least("rounds", rounds, 1)
    log = log or (lambda line: None)
    names = list(contenders)
    for name in names if warmup_steps else ():
        start = time.perf_counter()
        contenders[name].warm_up(warmup_steps, inputs)
        log(f"  warm-up {name}: {time.perf_counter() - start:.0f} s")
    results = {name: Rounds(contenders[name].global_batch_size) for name in names}
    jobs = [(name, input) for name in names for input in inputs
            if input in getattr(contenders[name], "inputs", inputs)]
    for index in range(rounds):
        order = jobs if index % 2 == 0 else list(reversed(jobs))
        parts = []
        for name, input in order:
            times = contenders[name].run(steps, input=input)
            results[name].times.setdefault(input, []).append(times)
            rate = contenders[name].global_batch_size * len(times) / sum(times)
            parts.append(f"{name}{'' if input == 'pipeline' else ' [' + input + ']'} "
                         f"{rate:.1f} ex/s")
        log(f"  round {index + 1}/{rounds}: " + " | ".join(parts))
    return results


def summarise(contender, rounds, peak_flops=None):
    """The figures of one contender from its pooled step times.

    Throughput, per-replica throughput, tokens/s, model FLOP/s and MFU come
    from `ThroughputMeter.figures` on the pooled "pipeline" times; then the
    step-time percentiles (p50, p90, p99 in ms), the per-round throughput,
    and, when "memory" rounds were run, the input-wait share.

    Args:
        contender: the `Contender` (batch, replicas, tokens and FLOPs per example).
        rounds: its `Rounds`.
        peak_flops: the same-run matmul FLOP/s in the contender's precision,
            for MFU; None to skip MFU.

    Returns:
        A dict of figures (see `summarise_times`) plus the contender's
        resolved settings.

    Example:

    >>> results = run_rounds({"ours": contender}, rounds=2, steps=3)
    >>> summarise(contender, results["ours"], peak_flops=1.3e11)["mfu"]
    0.44
    """
    result = summarise_times(
        rounds, num_replicas=contender.num_replicas,
        tokens_per_example=contender.tokens_per_example,
        flops_per_example=contender.flops_per_example, peak_flops=peak_flops)
    result.update(contender.describe())
    return result


def summarise_times(rounds, num_replicas=1, tokens_per_example=None, flops_per_example=None,
                    peak_flops=None):
    """The figures of pooled step times (no TensorFlow needed).

    Args:
        rounds: a `Rounds` with at least one "pipeline" round.
        num_replicas: replicas in sync.
        tokens_per_example: tokens per example, or None.
        flops_per_example: model training FLOPs per example, or None.
        peak_flops: same-run matmul FLOP/s, or None.

    Returns:
        A dict: `examples_per_sec`, `examples_per_sec_per_replica`,
        `step_time_ms` (mean), `step_time_p50_ms`, `step_time_p90_ms`,
        `step_time_p99_ms`, `measured_steps`, `round_examples_per_sec`,
        and when known `tokens_per_sec`, `model_flops_per_sec`, `mfu`,
        `peak_flops_per_sec`, `compute_step_time_ms` and `input_wait_share`.

    Example:

    >>> summarise_times(Rounds(64, {"pipeline": [[0.5, 0.5]]}))["examples_per_sec"]
    128.0
    """
    from tfdist.callbacks.throughput import ThroughputMeter

    times = rounds.pooled("pipeline")
    if not times:
        raise ValueError("No measured 'pipeline' steps to summarise: run at least one round "
                         "with steps >= 1.")
    meter = ThroughputMeter(rounds.global_batch_size, num_replicas=num_replicas,
                            tokens_per_example=tokens_per_example,
                            flops_per_example=flops_per_example, peak_flops=peak_flops,
                            print_fn=None)
    result = meter.figures(times, percentiles=True)
    result.update({f"step_time_{name}_ms": value * 1000.0
                   for name, value in fig.percentiles(times).items()})
    result["round_examples_per_sec"] = rounds.round_throughput("pipeline")
    if peak_flops:
        result["peak_flops_per_sec"] = peak_flops
    memory = rounds.pooled("memory")
    if memory:
        compute = sum(memory) / len(memory)
        result["compute_step_time_ms"] = compute * 1000.0
        result["input_wait_share"] = fig.input_wait_share(sum(times) / len(times), compute)
    return result
