"""Throughput meter: examples/s, tokens/s, step time percentiles, MFU."""

import time

import keras
import numpy as np

from tfdist.runtime.argtypes import check_callable, check_int_at_least, check_number


class ThroughputMeter(keras.callbacks.Callback):
    """Measures training throughput and puts it into the logs.

    Step time is the wall time between consecutive `on_train_batch_end`
    calls, so it includes waiting for input, as a user experiences it. The
    first `warmup_steps` steps of the run (tracing, XLA compilation) are left
    out. With `steps_per_execution > 1` Keras reports a batch once per group,
    and the meter divides the interval by the group size.

    At each epoch end the logs gain `examples_per_sec`, `step_time_ms` and,
    where known, `tokens_per_sec`, `model_flops_per_sec` and `mfu`, so
    `History`, `CSVLogger` and `TensorBoard` placed after this callback see
    them. At the end of training `summary` holds the figures for the whole
    run and one line is printed (chief only, if `print_fn` says so). With
    `log_every=N`, the figures of the last N steps are also put into the logs
    of every N-th step, so `TensorBoard(update_freq=N)` draws throughput
    along the run, not only one point per epoch.

    Every worker computes the same figures from its own clock; nothing is
    written to disk.

    Args:
        global_batch_size: examples per step across all replicas.
        num_replicas: replicas in sync, for the per-replica figures.
        tokens_per_example: tokens in one example (e.g. the sequence length),
            or None when the data has no token axis.
        flops_per_example: model FLOPs for one training example (forward and
            backward), for model FLOP/s and MFU; None to skip.
        peak_flops: the peak FLOP/s of all devices together, for MFU; None
            to skip MFU.
        warmup_steps: steps at the start of training left out of the figures.
        steps_per_execution: steps run per reported batch.
        log_every: also add the figures of the last `log_every` steps to the
            logs of every `log_every`-th step; None for epoch ends only.
        print_fn: called with the one-line summary at the end of training;
            None to stay silent.

    Example:

    >>> meter = ThroughputMeter(global_batch_size=64, tokens_per_example=128)
    >>> model.fit(dataset, epochs=2, callbacks=[meter])
    >>> meter.summary["examples_per_sec"]
    """

    def __init__(self, global_batch_size, num_replicas=1, tokens_per_example=None,
                 flops_per_example=None, peak_flops=None, warmup_steps=2,
                 steps_per_execution=1, log_every=None, print_fn=print):
        super().__init__()
        for name, value in (("global_batch_size", global_batch_size), ("num_replicas", num_replicas),
                            ("steps_per_execution", steps_per_execution)):
            check_int_at_least(name, value, 1)
        check_int_at_least("warmup_steps", warmup_steps, 0)
        for name, value in (("tokens_per_example", tokens_per_example),
                            ("flops_per_example", flops_per_example), ("peak_flops", peak_flops)):
            check_number(name, value, above=0, none_means="not measured")
        if log_every is not None and (not isinstance(log_every, int) or log_every < 1):
            raise ValueError(f"log_every must be None or an int >= 1, got {log_every!r}.")
        self.log_every = log_every
        self.global_batch_size = global_batch_size
        self.num_replicas = num_replicas
        self.tokens_per_example = tokens_per_example
        self.flops_per_example = flops_per_example
        self.peak_flops = peak_flops
        self.warmup_steps = warmup_steps
        self.steps_per_execution = steps_per_execution
        self.print_fn = check_callable("print_fn", print_fn, "a function of one string (print)",
                                       allow_none=True)  # None: silent
        self.summary = {}
        self._run_step_times = []
        self._epoch_step_times = []
        self._steps_seen = 0
        self._last = None

    def on_train_begin(self, logs=None):
        self._run_step_times = []
        self._steps_seen = 0
        self.summary = {}

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_step_times = []
        self._last = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        steps = self.steps_per_execution
        self._steps_seen += steps
        if self._steps_seen <= self.warmup_steps:
            return
        per_step = elapsed / steps
        self._epoch_step_times.extend([per_step] * steps)
        self._run_step_times.extend([per_step] * steps)
        if (self.log_every and logs is not None
                and self._steps_seen // self.log_every != (self._steps_seen - steps) // self.log_every):
            logs.update(self.figures(self._run_step_times[-self.log_every:]))

    def on_test_begin(self, logs=None):
        self._paused_at = time.perf_counter()

    def on_test_end(self, logs=None):
        # Validation inside an epoch must not count as training step time.
        if self._last is not None:
            self._last += time.perf_counter() - self._paused_at

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self._epoch_step_times:
            logs.update(self.figures(self._epoch_step_times))

    def on_train_end(self, logs=None):
        if not self._run_step_times:
            self.summary = {"measured_steps": 0}
            if self.print_fn:
                self.print_fn(
                    f"Throughput: not measured (the run had {self._steps_seen} step(s), all within "
                    f"the {self.warmup_steps}-step warmup window).")
            return
        self.summary = self.figures(self._run_step_times, percentiles=True)
        if self.print_fn:
            self.print_fn(format_summary(self.summary))

    def figures(self, step_times, percentiles=False):
        """Throughput figures for a list of per-step times in seconds.

        Example:

        >>> ThroughputMeter(64).figures([0.5, 0.5])["examples_per_sec"]
        128.0
        """
        times = np.asarray(step_times, dtype=np.float64)
        mean = float(times.mean())
        examples_per_sec = self.global_batch_size / mean
        result = {
            "examples_per_sec": examples_per_sec,
            "examples_per_sec_per_replica": examples_per_sec / self.num_replicas,
            "step_time_ms": mean * 1000.0,
        }
        if self.tokens_per_example:
            result["tokens_per_sec"] = examples_per_sec * self.tokens_per_example
        if self.flops_per_example:
            result["model_flops_per_sec"] = examples_per_sec * self.flops_per_example
            if self.peak_flops:
                result["mfu"] = result["model_flops_per_sec"] / self.peak_flops
        if percentiles:
            result["step_time_p50_ms"] = float(np.percentile(times, 50)) * 1000.0
            result["step_time_p90_ms"] = float(np.percentile(times, 90)) * 1000.0
            result["measured_steps"] = int(times.size)
        return result


def format_summary(summary):
    """One line for a `ThroughputMeter.summary`, with units and sensible digits.

    Example:

    >>> format_summary({"examples_per_sec": 100.0, "examples_per_sec_per_replica": 50.0,
    ...                 "step_time_ms": 640.0, "measured_steps": 10})
    'Throughput: 100 examples/s (50.0 per replica) | step 640.0 ms mean over 10 steps'
    """
    from tfdist.callbacks.progress import flops, si

    if not summary.get("measured_steps") or "examples_per_sec" not in summary:
        return "Throughput: not measured (every step of the run was in the meter's warmup window)."
    parts = [f"Throughput: {si(summary['examples_per_sec'])} examples/s "
             f"({si(summary['examples_per_sec_per_replica'])} per replica)"]
    if "tokens_per_sec" in summary:
        parts.append(f"{si(summary['tokens_per_sec'])} tokens/s")
    step = f"step {summary['step_time_ms']:.1f} ms mean"
    if "step_time_p50_ms" in summary:
        step += f", p50 {summary['step_time_p50_ms']:.1f}, p90 {summary['step_time_p90_ms']:.1f}"
    parts.append(step + f" over {summary['measured_steps']} steps")
    if "model_flops_per_sec" in summary:
        text = f"model {flops(summary['model_flops_per_sec'])}"
        if "mfu" in summary:
            text += f", MFU {100 * summary['mfu']:.1f}%"
        parts.append(text)
    return " | ".join(parts)
