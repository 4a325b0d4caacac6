import mmap
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.fake_nvml import FOUR_GPUS, GIB, make_nvml
from helpers.recorders import BatchRecorder
from tfdist.callbacks.memory import (DeviceMemoryMonitor, MemoryUsageWarning, host_memory_limit_mb,
                                     host_peak_rss_mb, host_rss_mb, open_nvml, physical_gpu_indices)
from tfdist.runtime.nvml import GpuReading, NvmlGpus, cuda_visible_ids, nvml_device_ids, reading_logs

BIG_MB = 160
no_gpu = pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")),
                            reason="checks the CPU-only path")


def big_array(mb=BIG_MB):
    """A float64 array of `mb` MB whose pages are all touched (resident), in
    memory of its own: freeing it unmaps it, whatever malloc would do. (In a
    pytest worker that had run most of the suite on a Zen 3, the RSS did not
    fall when an `np.ones` array, which goes through malloc, was freed.)"""
    array = np.frombuffer(mmap.mmap(-1, mb * 1024 * 1024), dtype=np.float64)
    array[:] = 1.0
    return array


def tiny_fit(callbacks, epochs=3, batch_size=8):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model.fit(x, x[:, :1], batch_size=batch_size, epochs=epochs, verbose=0,
                     callbacks=callbacks)


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
    recorder = BatchRecorder()
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


@no_gpu
def test_without_gpus_the_monitor_says_so_once_across_fits():
    said = []
    monitor = DeviceMemoryMonitor(warn_fraction=None, print_fn=said.append)
    tiny_fit([monitor], epochs=2)
    tiny_fit([monitor], epochs=1)
    assert said == ["DeviceMemoryMonitor: no GPU visible to TensorFlow, so no GPU memory, "
                    "utilisation or power figures; logging host memory only."]
    quiet = DeviceMemoryMonitor(warn_fraction=None, print_fn=None)
    assert "host_rss_mb" in tiny_fit([quiet], epochs=1).history


def _pynvml_installed():
    import importlib.util

    return importlib.util.find_spec("pynvml") is not None


@pytest.mark.skipif(_pynvml_installed(), reason="checks the path without nvidia-ml-py")
def test_without_nvidia_ml_py_the_reason_says_what_to_install():
    # The real import of pynvml fails here: nvidia-ml-py is not installed.
    gpus, why = open_nvml([0])
    assert gpus is None
    assert why.startswith("NVML's Python bindings are not installed (No module named 'pynvml')")
    assert 'pip install nvidia-ml-py (or pip install "tfdist[cuda]")' in why


def test_without_a_driver_the_reason_names_nvmls_error():
    """A stand-in NVML (tests/helpers/fake_nvml.py) whose nvmlInit fails as the real
    nvidia-ml-py 13.615 does on this machine: "NVML Shared Library Not Found"."""
    gpus, why = open_nvml([0], nvml=make_nvml([], init_error="NVML Shared Library Not Found"))
    assert gpus is None
    assert why.startswith("NVML could not start (NVML Shared Library Not Found): the NVIDIA "
                          "driver's libnvidia-ml is missing")


@pytest.mark.parametrize("visible, expected", [
    (None, None), ("", []), ("-1", []), ("0,1", [0, 1]), (" 3 , 1 ", [3, 1]),
    ("2,-1,0", [2]), ("GPU-8932f937,1", ["GPU-8932f937", 1]), ("MIG-abc", ["MIG-abc"]),
    ("0,junk,1", [0]),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(visible, expected):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert cuda_visible_ids(environ) == expected


@pytest.mark.parametrize("visible, tf_indices, expected", [
    (None, [0, 1], [0, 1]), ("2,3", [0, 1], [2, 3]), ("3,1", [1], [1]),
    ("GPU-2aaa,0", [0, 1], ["GPU-2aaa", 0]),
])
def test_tensorflow_gpu_i_is_the_i_th_visible_cuda_device(visible, tf_indices, expected):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert nvml_device_ids(tf_indices, environ) == expected


def test_a_tensorflow_gpu_beyond_cuda_visible_devices_is_named():
    with pytest.raises(ValueError, match=r"TensorFlow GPU\(s\) \[1\] are beyond "
                                         r"CUDA_VISIBLE_DEVICES='2', which shows 1 GPU"):
        nvml_device_ids([0, 1], {"CUDA_VISIBLE_DEVICES": "2"})


def test_logical_gpus_report_their_physical_gpu():
    assert physical_gpu_indices([1, 1]) == [0, 1]
    assert physical_gpu_indices([2, 1]) == [0, 0, 1]
    assert physical_gpu_indices([]) == []


def test_reading_logs_names_and_units():
    assert reading_logs(1, GpuReading(87.0, 10240.0, 251.5)) == {
        "gpu1_utilization": 87.0, "gpu1_memory_used_mb": 10240.0, "gpu1_power_w": 251.5}
    assert reading_logs(0, GpuReading(50.0, 1.0, None)) == {
        "gpu0_utilization": 50.0, "gpu0_memory_used_mb": 1.0}


def test_readings_of_the_mapped_devices_in_mb_and_watts():
    """Through a stand-in NVML (tests/helpers/fake_nvml.py): no GPU exists here, so
    this checks tfdist's mapping and units, not NVML."""
    nvml = make_nvml(FOUR_GPUS)
    gpus = NvmlGpus([0, 1], environ={"CUDA_VISIBLE_DEVICES": "2,GPU-3aaa"}, nvml=nvml)
    readings = gpus.read()
    assert readings == {0: GpuReading(30.0, 3 * GIB / 2 ** 20, 102.0),
                        1: GpuReading(40.0, 4 * GIB / 2 ** 20, 103.0)}
    assert reading_logs(0, readings[0]) == {"gpu0_utilization": 30.0,
                                            "gpu0_memory_used_mb": 3072.0, "gpu0_power_w": 102.0}
    gpus.close()
    gpus.close()
    assert nvml.initialised == 0


def test_a_failed_fit_shuts_nvml_down():
    """Stand-in NVML (tests/helpers/fake_nvml.py) in the monitor, as a GPU fit opens
    it; Keras calls no callback when fit raises, tfdist's Trainer calls on_fit_error."""
    from tfdist.training import Trainer

    class Fails(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("a callback failed")

    nvml = make_nvml(FOUR_GPUS)
    monitor = DeviceMemoryMonitor(warn_fraction=None, print_fn=None)
    monitor._nvml = NvmlGpus([0], environ={}, nvml=nvml)
    assert nvml.initialised == 1
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(RuntimeError, match="a callback failed"):
        Trainer(model, keras.optimizers.SGD(0.1), "mse").fit(
            data, epochs=1, verbose=0, callbacks=[monitor, Fails()])
    assert nvml.initialised == 0 and monitor._nvml is None


def test_a_figure_a_gpu_does_not_report_is_left_out_and_named():
    """Stand-in NVML (tests/helpers/fake_nvml.py), power "Not Supported" as on some boards."""
    devices = [dict(FOUR_GPUS[0], power_mw=None)]
    gpus = NvmlGpus([0], environ={}, nvml=make_nvml(devices))
    assert reading_logs(0, gpus.read()[0]) == {"gpu0_utilization": 10.0,
                                               "gpu0_memory_used_mb": 1024.0}
    assert gpus.problems == {"gpu0_power_w": "Not Supported"}


def test_an_unknown_uuid_is_a_reason_not_a_crash():
    """Stand-in NVML (tests/helpers/fake_nvml.py)."""
    nvml = make_nvml(FOUR_GPUS)
    gpus, why = open_nvml([0], environ={"CUDA_VISIBLE_DEVICES": "GPU-ffff"}, nvml=nvml)
    assert gpus is None and "no NVML device has UUID 'GPU-ffff'" in why
    assert nvml.initialised == 0  # shut down again
