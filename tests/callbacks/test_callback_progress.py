"""tfdist.callbacks.progress: model metrics in the bar, run figures with units after it."""

import keras
import numpy as np
import pytest

from tfdist.callbacks import ProgressLogger, ThroughputMeter
from tfdist.callbacks.progress import flops, format_run_figures, is_run_figure, model_metrics, si


@pytest.mark.parametrize("value, text", [
    (28403.86, "28.4k"), (1577.99, "1.58k"), (950.0, "950"), (64.0, "64.0"), (0.5, "0.50"),
    (69020011125.2, "69.0G"), (2.5e12, "2.50T"), (3.3e6, "3.30M"),
])
def test_si_keeps_about_three_significant_digits(value, text):
    assert si(value) == text


def test_figures_line_has_units_and_leaves_metrics_out():
    logs = {"loss": 1.25, "val_accuracy": 0.5, "learning_rate": 0.003, "tokens_per_sec": 28403.86,
            "examples_per_sec": 1577.99, "examples_per_sec_per_replica": 788.9,
            "step_time_ms": 40.5579, "model_flops_per_sec": 69020011125.2, "mfu": 0.123}
    assert format_run_figures(logs) == ("lr 3.00e-03 | 28.4k tok/s | 1.58k examples/s | 40.6 ms/step"
                                        " | 69.0 GFLOP/s | MFU 12.3%")
    assert model_metrics(logs) == {"loss": 1.25, "val_accuracy": 0.5}
    assert is_run_figure("gpu0_peak_mb") and not is_run_figure("val_loss")
    assert is_run_figure("gpu1_utilization") and is_run_figure("gpu0_power_w")
    assert flops(5e8) == "500 MFLOP/s"


def test_plain_fit_prints_metrics_in_the_bar_and_figures_after_it(capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
    model.fit(x, y, batch_size=8, epochs=2, verbose=2,
              callbacks=[ThroughputMeter(8, warmup_steps=1, print_fn=None), ProgressLogger()])
    lines = capsys.readouterr().out.splitlines()
    bars = [line for line in lines if line.startswith("8/8 - ")]
    assert len(bars) == 2, lines
    assert all("loss:" in bar and "mae:" in bar and "examples_per_sec" not in bar for bar in bars)
    figures = [line for line in lines if line.startswith("  ") and "examples/s" in line]
    assert len(figures) == 2 and all("ms/step" in line for line in figures), lines
