import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.callbacks.memory import (DeviceMemoryMonitor, MemoryUsageWarning, host_memory_limit_mb,
                                     host_peak_rss_mb, host_rss_mb)

BIG_MB = 160
no_gpu = pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")),
                            reason="checks the CPU-only path")


def big_array(mb=BIG_MB):
    """A float64 array of `mb` MB whose pages are all touched (resident)."""
    return np.ones(mb * 1024 * 1024 // 8)


def tiny_fit(callbacks, epochs=3, batch_size=8):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model.fit(x, x[:, :1], batch_size=batch_size, epochs=epochs, verbose=0,
                     callbacks=callbacks)


class BatchLogRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batch_logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.batch_logs.append(dict(logs))


class AllocateAtEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch, self.kept = epoch, None

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            self.kept = big_array()


def test_host_rss_rises_and_falls_with_a_big_array_and_the_peak_stays():
    monitor = DeviceMemoryMonitor(warn_fraction=None)
    before = monitor.read()
    array = big_array()
    during = monitor.read()
    assert during["host_rss_mb"] - before["host_rss_mb"] > 0.8 * BIG_MB
    # Within 1 MB: the kernel's RSS counters are updated lazily.
    assert during["host_peak_rss_mb"] >= during["host_rss_mb"] - 1
    del array
    after = monitor.read()
    assert during["host_rss_mb"] - after["host_rss_mb"] > 0.8 * BIG_MB
    assert after["host_peak_rss_mb"] >= during["host_rss_mb"] - 1
    assert host_peak_rss_mb() >= host_rss_mb() - 1


def test_epoch_logs_show_an_allocation_made_during_fit():
    allocate = AllocateAtEpoch(epoch=1)
    history = tiny_fit([allocate, DeviceMemoryMonitor(warn_fraction=None)], epochs=2)
    rss = history.history["host_rss_mb"]
    assert len(rss) == 2 and rss[1] - rss[0] > 0.8 * BIG_MB
    assert history.history["host_peak_rss_mb"][1] >= rss[1] - 1


@no_gpu
def test_without_gpus_the_gpu_paths_are_skipped_and_logs_hold_no_gpu_keys():
    recorder = BatchLogRecorder()
    monitor = DeviceMemoryMonitor(batch_freq=2, gpu_limit_mb=1, reset_peak_each_epoch=True)
    history = tiny_fit([monitor, recorder], epochs=2)
    assert monitor.gpu_indices == []
    assert set(history.history) == {"loss", "host_rss_mb", "host_peak_rss_mb"}
    # batch_freq=2: figures in the logs of batches 1 and 3 of each 4-batch epoch, not 0 and 2.
    has_figures = ["host_rss_mb" in logs for logs in recorder.batch_logs]
    assert has_figures == [False, True, False, True] * 2
    assert not any(key.startswith("gpu") for logs in recorder.batch_logs for key in logs)


@no_gpu
def test_asking_for_a_gpu_that_does_not_exist_names_it():
    with pytest.raises(ValueError, match=r"GPU\(s\) \[0\].*sees 0 GPU"):
        tiny_fit([DeviceMemoryMonitor(gpus=[0])], epochs=1)


def test_without_batch_freq_the_monitor_keeps_keras_async_batch_dispatch():
    assert getattr(DeviceMemoryMonitor().on_train_batch_end, "_is_default", False)
    assert not getattr(DeviceMemoryMonitor(batch_freq=3).on_train_batch_end, "_is_default", False)


def test_a_tiny_host_limit_warns_once_while_above_it():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_fit([DeviceMemoryMonitor(host_limit_mb=1, warn_fraction=0.5)], epochs=3)
    memory = [w for w in caught if issubclass(w.category, MemoryUsageWarning)]
    assert len(memory) == 1, [str(w.message) for w in memory]
    assert "host_rss_mb=" in str(memory[0].message) and "limit of 1.0 MB" in str(memory[0].message)


def test_the_warning_rearms_after_the_figure_drops_below_the_threshold():
    monitor = DeviceMemoryMonitor(host_limit_mb=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert monitor.check(monitor.read()) == ["host_rss_mb"]
        assert monitor.check(monitor.read()) == ["host_rss_mb"]   # still above: no new warning
        monitor.host_limit_mb = 10 ** 9
        assert monitor.check(monitor.read()) == []
        monitor.host_limit_mb = 1
        assert monitor.check(monitor.read()) == ["host_rss_mb"]   # crossed again: warns again
    assert sum(issubclass(w.category, MemoryUsageWarning) for w in caught) == 2


def test_detected_host_limit_is_the_machine_memory_and_is_not_crossed_here():
    limit = host_memory_limit_mb()
    with open("/proc/meminfo") as f:
        total_mb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) / 1024
    assert 0 < limit <= total_mb
    monitor = DeviceMemoryMonitor(warn_fraction=0.99)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemoryUsageWarning)
        assert monitor.check(monitor.read()) == []


@pytest.mark.parametrize("kwargs, name", [
    ({"warn_fraction": 1.5}, "warn_fraction"), ({"warn_fraction": 0}, "warn_fraction"),
    ({"host_limit_mb": -1}, "host_limit_mb"), ({"gpu_limit_mb": "8GB"}, "gpu_limit_mb"),
    ({"batch_freq": 0}, "batch_freq"), ({"gpus": [-1]}, "gpus"),
])
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DeviceMemoryMonitor(**kwargs)


def test_get_config_round_trips():
    monitor = DeviceMemoryMonitor(warn_fraction=0.8, host_limit_mb=1000, batch_freq=5)
    assert DeviceMemoryMonitor(**monitor.get_config()).get_config() == monitor.get_config()
