"""A progress bar that shows model metrics as Keras does and speed with units.

`ThroughputMeter`, `LearningRateLogger` and `DeviceMemoryMonitor` put raw
numbers into the logs (so `History`, `CSVLogger` and `TensorBoard` get exact
values); Keras's own progress bar would print them as
`model_flops_per_sec: 33435202425.7995`. `ProgressLogger` keeps those keys
out of the bar and prints them after it, one short line with units:
`lr 3.00e-03 | 28.4k tok/s | 1.58k examples/s | 40.6 ms/step | 69.0 GFLOP/s`.
"""

from tfdist.runtime.argtypes import check_callable
from tfdist.seam.keras_callbacks import ProgbarLoggerHooks

# Keys that are figures about the run, not model metrics, with how to show
# them. Keys not listed here (the model's losses and metrics) stay in the bar.
_RUN_FIGURES = {
    "learning_rate": lambda v: f"lr {v:.2e}",
    "tokens_per_sec": lambda v: f"{si(v)} tok/s",
    "examples_per_sec": lambda v: f"{si(v)} examples/s",
    "step_time_ms": lambda v: f"{v:.1f} ms/step",
    "model_flops_per_sec": lambda v: flops(v),
    "mfu": lambda v: f"MFU {100 * v:.1f}%",
    "host_rss_mb": lambda v: f"host {v / 1024:.2f} GiB",
}
_HIDDEN_FIGURES = ("examples_per_sec_per_replica", "step_time_p50_ms", "step_time_p90_ms",
                   "measured_steps", "host_peak_rss_mb")


def is_run_figure(name):
    """Whether a log key is a figure about the run (speed, memory, learning
    rate) rather than a model metric, including its `val_` form.

    Example:

    >>> is_run_figure("tokens_per_sec"), is_run_figure("val_loss")
    (True, False)
    """
    return (name in _RUN_FIGURES or name in _HIDDEN_FIGURES
            or (name.startswith("gpu") and name.endswith(("_mb", "_utilization", "_power_w"))))


def si(value, digits=3):
    """A number with an SI prefix and about `digits` significant digits.

    Example:

    >>> si(28403.86), si(69020011125.2), si(950.0)
    ('28.4k', '69.0G', '950')
    """
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            scaled = value / factor
            decimals = max(0, digits - len(str(int(abs(scaled)))))
            return f"{scaled:.{decimals}f}{prefix}"
    decimals = max(0, digits - len(str(int(abs(value)))))
    return f"{value:.{decimals}f}"


def flops(value):
    """FLOP/s with a unit prefix.

    Example:

    >>> flops(69020011125.2)
    '69.0 GFLOP/s'
    """
    text = si(value)
    return f"{text[:-1]} {text[-1]}FLOP/s" if text[-1].isalpha() else f"{text} FLOP/s"


def format_run_figures(logs):
    """One line of the run figures in `logs`, with units; empty if none.

    Example:

    >>> format_run_figures({"loss": 0.5, "tokens_per_sec": 28403.9, "step_time_ms": 40.56})
    '28.4k tok/s | 40.6 ms/step'
    """
    parts = [show(logs[name]) for name, show in _RUN_FIGURES.items()
             if isinstance(logs.get(name), (int, float))]
    gpus = sorted(name for name in logs if name.startswith("gpu") and name.endswith("_peak_mb"))
    parts += [f"{name.removesuffix('_peak_mb')} peak {logs[name] / 1024:.2f} GiB" for name in gpus]
    return " | ".join(parts)


def model_metrics(logs):
    """The entries of `logs` that are model metrics (losses included).

    Example:

    >>> model_metrics({"loss": 0.5, "tokens_per_sec": 9.0})
    {'loss': 0.5}
    """
    return {name: value for name, value in (logs or {}).items() if not is_run_figure(name)}


class ProgressLogger(ProgbarLoggerHooks):
    """Keras's progress bar with model metrics only, and run figures with units.

    At each epoch end (and at the end of an `evaluate` run) the bar shows the
    model's losses and metrics with Keras's formatting, and the run figures
    (learning rate, throughput, FLOP/s, memory) follow on one indented line
    with units. `Trainer` uses it as its progress bar; in your own
    `model.fit`, pass it in the callbacks list and Keras uses it instead of
    its own bar.

    Args:
        print_fn: prints the run-figure line (default `print`).

    Example:

    >>> model.fit(dataset, epochs=2, verbose=2,
    ...           callbacks=[ThroughputMeter(64), ProgressLogger()])
    64/64 - 12s - 190ms/step - accuracy: 0.62 - loss: 1.27
      lr 3.00e-03 | 1.58k examples/s | 40.6 ms/step
    """

    def __init__(self, print_fn=print):
        super().__init__()
        self.print_fn = check_callable("print_fn", print_fn, "a function of one string (print)")

    def shown_logs(self, logs):
        """The bar shows the model's metrics only (`model_metrics`).

        Example:

        >>> ProgressLogger().shown_logs({"loss": 0.5, "tokens_per_sec": 9.0})
        {'loss': 0.5}
        """
        return model_metrics(logs)

    def after_bar(self, logs):
        """Prints the run figures (learning rate, throughput, ...) with units after the bar.

        Example:

        >>> ProgressLogger().after_bar({"loss": 0.5})  # no run figures: prints nothing
        """
        figures = format_run_figures(logs or {})
        if figures and self.verbose:
            self.print_fn(f"  {figures}", flush=True)

