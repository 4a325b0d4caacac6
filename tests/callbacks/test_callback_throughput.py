import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.callbacks.throughput import ThroughputMeter, format_summary


def test_figures_on_fixed_step_times():
    meter = ThroughputMeter(global_batch_size=64, num_replicas=2, tokens_per_example=128,
                            flops_per_example=1e6, peak_flops=1e9)
    figures = meter.figures([0.5, 0.5, 0.5, 0.5], percentiles=True)
    assert figures["examples_per_sec"] == pytest.approx(128.0)
    assert figures["examples_per_sec_per_replica"] == pytest.approx(64.0)
    assert figures["tokens_per_sec"] == pytest.approx(128.0 * 128)
    assert figures["model_flops_per_sec"] == pytest.approx(128e6)
    assert figures["mfu"] == pytest.approx(0.128)
    assert figures["step_time_ms"] == pytest.approx(500.0)
    assert figures["step_time_p50_ms"] == pytest.approx(500.0)
    line = format_summary(figures)
    assert "128 examples/s (64.0 per replica)" in line and "16.4k tokens/s" in line
    assert "model 128 MFLOP/s, MFU 12.8%" in line


def test_percentiles_use_the_step_time_distribution():
    meter = ThroughputMeter(global_batch_size=10)
    figures = meter.figures([0.1] * 9 + [1.0], percentiles=True)
    assert figures["step_time_p50_ms"] == pytest.approx(100.0)
    assert figures["step_time_p90_ms"] == pytest.approx(190.0)
    assert figures["step_time_ms"] == pytest.approx(190.0)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="global_batch_size"):
        ThroughputMeter(global_batch_size=0)


def test_meter_in_plain_fit_excludes_warmup_and_fills_logs():
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    printed = []
    meter = ThroughputMeter(global_batch_size=8, tokens_per_example=4, warmup_steps=3,
                            print_fn=printed.append)
    history = model.fit(x, y, batch_size=8, epochs=2, callbacks=[meter], verbose=0)
    assert meter.summary["measured_steps"] == 2 * 8 - 3
    assert meter.summary["tokens_per_sec"] == pytest.approx(4 * meter.summary["examples_per_sec"])
    assert len(history.history["examples_per_sec"]) == 2
    assert printed and printed[0].startswith("Throughput:")


def test_a_run_inside_the_warmup_window_says_so():
    meter = ThroughputMeter(global_batch_size=8, warmup_steps=100, print_fn=None)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(tf.zeros((16, 2)), tf.zeros((16, 1)), batch_size=8, verbose=0, callbacks=[meter])
    assert meter.summary == {"measured_steps": 0}
