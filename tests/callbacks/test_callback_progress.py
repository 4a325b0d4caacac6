"""tfdist.callbacks.progress: model metrics in the bar, run figures with units after it;
after a resume mid-epoch, the bar's rate and ETA count only the steps run since."""

import re
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.interrupt import Interrupted, InterruptAfterSteps
from helpers.workers import train_common as common
from tfdist.callbacks import ProgressLogger, ThroughputMeter
from tfdist.callbacks.backup import BackupAndResume
from tfdist.callbacks.progress import flops, format_run_figures, is_run_figure, model_metrics, si
from tfdist.training import Trainer


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


# ------------------------------------------------------------ after a resume
RESUME_STEPS, RESUME_AT, STEP_SLEEP = 200, 140, 0.05


class SleepAfterEachStep(keras.callbacks.Callback):
    """Makes every training step last at least `STEP_SLEEP` seconds."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(STEP_SLEEP)


def seconds(text):
    """A Progbar duration (`2s`, `1:05`, `40ms`, `900us`) in seconds."""
    if ":" in text:
        return sum(int(part) * 60 ** power
                   for power, part in enumerate(reversed(text.rstrip("s").split(":"))))
    number, unit = re.fullmatch(r"(\d+)(us|ms|s)", text).groups()
    return int(number) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def fit_resumed_late(tmp_path, verbose, capsys):
    """Fits 200 steps, interrupted after step 141 (backup at step 140), then
    resumes with each step sleeping 0.05 s; returns the resumed fit's output."""
    data = tf.data.Dataset.from_tensor_slices(common.regression_arrays(n=64)).batch(8).repeat()
    strategy = tf.distribute.get_strategy()

    def fit(callbacks, verbose):
        trainer = Trainer(common.dense_model(strategy), keras.optimizers.SGD(0.01), "mse",
                          strategy=strategy)
        trainer.fit(data, epochs=1, steps_per_epoch=RESUME_STEPS, callbacks=callbacks,
                    verbose=verbose)

    backup_dir = tmp_path / "backup"
    with pytest.raises(Interrupted):
        fit([BackupAndResume(backup_dir, save_freq=RESUME_AT, verbose=0),
             InterruptAfterSteps(RESUME_AT + 1)], verbose=0)
    capsys.readouterr()
    fit([BackupAndResume(backup_dir, save_freq=10_000, verbose=0), SleepAfterEachStep()],
        verbose)
    return re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)


def test_the_bar_after_a_late_resume_shows_the_rate_and_eta_of_the_steps_run_since(
        tmp_path, capsys):
    out = fit_resumed_late(tmp_path, 1, capsys)
    updates = [(int(current), seconds(eta_or_elapsed), seconds(rate))
               for current, eta_or_elapsed, rate in re.findall(
                   rf"(\d+)/{RESUME_STEPS} \S+ (\S+) (\d+(?:us|ms|s))/step", out)]
    assert updates and updates[0][0] == RESUME_AT + 1, out  # resumed mid-epoch, at its step
    assert updates[-1][0] == RESUME_STEPS, out
    # Keras divides the elapsed time by the step index (here ~15 ms/step, 0 s left);
    # each step since the resume took >= 50 ms.
    assert all(rate >= 0.04 for _, _, rate in updates), updates
    running = [(current, eta, rate) for current, eta, rate in updates
               if current < RESUME_STEPS]
    assert len(running) >= 5, updates
    for current, eta, rate in running:
        left = RESUME_STEPS - current
        assert eta >= int(0.045 * left), (current, eta, rate, updates)
        # the ETA is the shown rate times the steps left (the rate is rounded to 1 ms)
        assert abs(eta - rate * left) <= 1 + 0.001 * left, (current, eta, rate, updates)


def test_the_epoch_line_after_a_late_resume_shows_the_rate_of_the_steps_run_since(
        tmp_path, capsys):
    out = fit_resumed_late(tmp_path, 2, capsys)
    lines = re.findall(rf"^{RESUME_STEPS}/{RESUME_STEPS} - (\S+) - (\S+)/step - loss:", out,
                       flags=re.MULTILINE)
    assert len(lines) == 1, out
    elapsed, rate = (seconds(text) for text in lines[0])
    steps_run = RESUME_STEPS - RESUME_AT
    assert rate >= 0.04, out  # Keras shows elapsed / 200 steps (~15 ms/step)
    assert elapsed >= int(STEP_SLEEP * steps_run) - 1, out  # the wall time since the epoch began
