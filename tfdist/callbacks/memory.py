"""Device and host memory figures (and GPU utilisation and power) in the
training logs, with limit warnings."""

import resource
import sys
import warnings

import keras
import tensorflow as tf

from tfdist.runtime.argtypes import check_bool, check_callable, check_number
from tfdist.runtime.nvml import NvmlGpus, NvmlUnavailable, reading_logs
from tfdist.seam import local_gpu_memory_limits

MB = 1024 * 1024
"""Bytes in the "MB" of the logged figures (a mebibyte, 2**20 bytes)."""


class MemoryUsageWarning(UserWarning):
    """A memory figure passed the configured fraction of its limit.

    Example:

        import warnings

        warnings.simplefilter("error", MemoryUsageWarning)  # stop the run instead
        trainer.fit(data, callbacks=[DeviceMemoryMonitor(warn_fraction=0.9)])
    """


class DeviceMemoryMonitor(keras.callbacks.Callback):
    """Puts GPU and host memory use into the logs and warns near the limits.

    At every epoch end (and, with `batch_freq=N`, every N-th training batch)
    the logs gain, in MB (2**20 bytes):

    * `host_rss_mb`: this process's resident memory now (`VmRSS` from
      `/proc/self/status`; absent where there is no `/proc`);
    * `host_peak_rss_mb`: its peak resident memory since the process started
      (`resource.getrusage(RUSAGE_SELF).ru_maxrss`, or `VmHWM` if larger);
    * for every visible GPU `i`: `gpu{i}_current_mb` and `gpu{i}_peak_mb`,
      from `tf.config.experimental.get_memory_info("GPU:i")`. With
      `reset_peak_each_epoch=True` the GPU peak is reset
      (`tf.config.experimental.reset_memory_stats`) at every epoch start, so
      the epoch figure is that epoch's peak.

    * with `gpu_utilization=True`, for every watched GPU `i`, from NVML
      (the `nvidia-ml-py` package, in tfdist's `cuda` extra):
      `gpu{i}_utilization` (percent of the last sample period a kernel
      ran, 0-100), `gpu{i}_memory_used_mb` (in use by every process on
      the GPU) and `gpu{i}_power_w` (watts). TensorFlow's GPU `i` is found
      among NVML's devices through `$CUDA_VISIBLE_DEVICES`
      (`tfdist.runtime.nvml.nvml_device_ids`); a logical GPU reports its physical
      GPU's figures. A figure the GPU does not report is left out.

    On a machine without GPUs there are no `gpu*` keys and no GPU calls, and
    the monitor says so once through `print_fn`; on a GPU machine without
    NVML (package or driver library missing) it says once why there are no
    utilisation figures and how to get them. Callbacks after this one in the
    list (`CSVLogger`, `TensorBoard`, `History`, the progress bar) see the
    figures. The NVML path was verified only on a machine without GPUs,
    through a stand-in NVML module (`tfdist.runtime.nvml.NvmlGpus`'s `nvml=`).

    A `MemoryUsageWarning` is issued when `host_rss_mb` or a `gpu{i}_peak_mb`
    passes `warn_fraction` of its limit, once per crossing: it warns again
    only after the figure has gone back below the threshold. Limits:
    `host_limit_mb`, else the smaller of `MemTotal` in `/proc/meminfo` and
    the cgroup memory limit (containers); `gpu_limit_mb`, else the memory
    limit TensorFlow gave the GPU (a logical device's `memory_limit`, or
    the allocator limit of the physical device). A figure without a known
    limit is logged but never warned about.

    Multi-worker: nothing is written to disk; every worker logs and checks
    its own process's memory (the figures are per process, not reduced
    across workers), so a worker close to its limit warns on its own output.

    Args:
        warn_fraction: warn when a figure passes this fraction of its limit,
            a number in (0, 1]; None never warns.
        host_limit_mb: the host memory limit in MB, or None to detect it.
        gpu_limit_mb: the memory limit in MB of each GPU, or None to detect
            it.
        batch_freq: also log into the batch logs every this many training
            batches (an int >= 1), or None for epoch logs only. Reading the
            figures does not synchronise with the devices.
        gpus: indices of the GPUs to watch (as in "GPU:0"), or None for
            every GPU TensorFlow sees.
        reset_peak_each_epoch: reset the GPU peak at every epoch start.
        gpu_utilization: also log NVML's utilisation, memory in use and
            power of every watched GPU.
        print_fn: says, once, why GPU figures are missing (no GPU, no
            NVML); None says nothing.

    Example:

    >>> monitor = DeviceMemoryMonitor(warn_fraction=0.9, batch_freq=100)
    >>> history = model.fit(dataset, epochs=3,
    ...                     callbacks=[monitor, keras.callbacks.CSVLogger("log.csv")])
    >>> history.history["host_peak_rss_mb"]
    """

    def __init__(self, warn_fraction=0.9, host_limit_mb=None, gpu_limit_mb=None,
                 batch_freq=None, gpus=None, reset_peak_each_epoch=True, gpu_utilization=True,
                 print_fn=print):
        super().__init__()
        check_number("warn_fraction", warn_fraction, above=0, at_most=1, none_means="no warning")
        for name, value in (("host_limit_mb", host_limit_mb), ("gpu_limit_mb", gpu_limit_mb)):
            check_number(name, value, above=0, unit="MB", none_means="the limit measured")
        if batch_freq is not None and not (
                isinstance(batch_freq, int) and not isinstance(batch_freq, bool)
                and batch_freq >= 1):
            raise ValueError(f"batch_freq must be an integer >= 1 or None, got {batch_freq!r}.")
        if gpus is not None:
            iterable = hasattr(gpus, "__iter__") and not isinstance(gpus, (str, bytes))
            listed = list(gpus) if iterable else None
            if listed is None or any(not isinstance(g, int) or isinstance(g, bool) or g < 0
                                     for g in listed):
                raise ValueError(
                    f"gpus must be a list of GPU indices (integers >= 0) or None (all), got "
                    f"{gpus!r}.")
            gpus = listed
        for name, value in (("reset_peak_each_epoch", reset_peak_each_epoch),
                            ("gpu_utilization", gpu_utilization)):
            check_bool(name, value)
        self.warn_fraction = warn_fraction
        self.host_limit_mb = host_limit_mb
        self.gpu_limit_mb = gpu_limit_mb
        self.batch_freq = batch_freq
        self.gpus = gpus
        self.reset_peak_each_epoch = reset_peak_each_epoch
        self.gpu_utilization = bool(gpu_utilization)
        self.print_fn = check_callable("print_fn", print_fn, "a function of one string (print)",
                                       allow_none=True)  # None: silent
        self.limits = {}
        self._gpu_indices = None
        self._over = set()
        self._nvml = None
        self._physical = None
        self._said = set()
        if batch_freq is not None:
            # Only then: a batch hook turns off Keras's asynchronous batch-end dispatch.
            self.on_train_batch_end = self._on_train_batch_end

    @property
    def gpu_indices(self):
        """Indices of the GPUs this monitor watches ([] without GPUs).

        Example:

        >>> DeviceMemoryMonitor().gpu_indices  # on a CPU-only machine
        []
        """
        if self._gpu_indices is None:
            visible = list(range(len(tf.config.list_logical_devices("GPU"))))
            if self.gpus is None:
                self._gpu_indices = visible
            else:
                missing = [g for g in self.gpus if g not in visible]
                if missing:
                    raise ValueError(
                        f"DeviceMemoryMonitor was asked to watch GPU(s) {missing}, but this "
                        f"process sees {len(visible)} GPU(s) (indices {visible}). Pass "
                        "gpus=None to watch whatever GPUs exist.")
                self._gpu_indices = list(self.gpus)
        return self._gpu_indices

    def read(self):
        """Returns the current memory figures as a dict of MB values.

        Example:

        >>> DeviceMemoryMonitor().read()
        {'host_rss_mb': 812.4, 'host_peak_rss_mb': 903.1}
        """
        figures = {}
        rss = host_rss_mb()
        if rss is not None:
            figures["host_rss_mb"] = rss
        figures["host_peak_rss_mb"] = host_peak_rss_mb()
        for index in self.gpu_indices:
            info = tf.config.experimental.get_memory_info(f"GPU:{index}")
            figures[f"gpu{index}_current_mb"] = info["current"] / MB
            figures[f"gpu{index}_peak_mb"] = info["peak"] / MB
        if self._nvml is not None:
            readings = self._nvml.read()
            for index in self.gpu_indices:
                figures.update(reading_logs(index, readings[self._physical[index]]))
            for key, why in self._nvml.problems.items():
                self._say(f"DeviceMemoryMonitor: {key} is not reported: NVML says {why}.")
        return figures

    def _say(self, message):
        if message not in self._said:
            self._said.add(message)
            if self.print_fn:
                self.print_fn(message)

    def check(self, figures):
        """Warns (`MemoryUsageWarning`) about figures that crossed their threshold.

        Args:
            figures: a dict from `read()`.

        Returns:
            The names of the figures that are above their threshold now.

        Example:

        >>> monitor = DeviceMemoryMonitor(host_limit_mb=1)
        >>> monitor.check(monitor.read())  # warns once
        ['host_rss_mb']
        """
        if self.warn_fraction is None:
            return []
        watched = {"host_rss_mb" if "host_rss_mb" in figures else "host_peak_rss_mb":
                   self._host_limit()}
        for index in self.gpu_indices:
            watched[f"gpu{index}_peak_mb"] = self._gpu_limit(index)
        above = []
        for name, limit in watched.items():
            if limit is None or name not in figures:
                continue
            value = figures[name]
            if value > self.warn_fraction * limit:
                above.append(name)
                if name not in self._over:
                    self._over.add(name)
                    warnings.warn(
                        f"Memory: {name}={value:.1f} MB is above {self.warn_fraction:.0%} of "
                        f"its limit of {limit:.1f} MB.", MemoryUsageWarning, stacklevel=2)
            else:
                self._over.discard(name)
        return above

    def on_train_begin(self, logs=None):
        self._gpu_indices = None
        _ = self.gpu_indices  # validates `gpus` before the first step
        if not self.gpu_indices:
            self._say("DeviceMemoryMonitor: no GPU visible to TensorFlow, so no GPU memory, "
                      "utilisation or power figures; logging host memory only.")
        elif self.gpu_utilization and self._nvml is None:
            self._physical = physical_gpu_indices()
            self._nvml, why = open_nvml(sorted({self._physical[i] for i in self.gpu_indices}))
            if why:
                self._say(f"DeviceMemoryMonitor: no GPU utilisation or power figures: {why}")

    def on_train_end(self, logs=None):
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def on_fit_error(self, error):
        """Shuts NVML down when `fit` raised `error`, as the end of a `fit`
        does (the next `fit` opens it again). tfdist's `Trainer` calls it
        (Keras calls no callback when `fit` raises); after Keras's own `fit`
        raised, call it yourself.

        Example:

        >>> try:
        ...     model.fit(x, y, callbacks=[monitor])
        ... except Exception as error:
        ...     monitor.on_fit_error(error)
        ...     raise
        """
        del error
        self.on_train_end()

    def on_epoch_begin(self, epoch, logs=None):
        if self.reset_peak_each_epoch:
            for index in self.gpu_indices:
                tf.config.experimental.reset_memory_stats(f"GPU:{index}")

    def _on_train_batch_end(self, batch, logs=None):
        if logs is not None and (batch + 1) % self.batch_freq == 0:
            figures = self.read()
            self.check(figures)
            logs.update(figures)

    def on_epoch_end(self, epoch, logs=None):
        figures = self.read()
        self.check(figures)
        if logs is not None:
            logs.update(figures)

    def get_config(self):
        return {"warn_fraction": self.warn_fraction, "host_limit_mb": self.host_limit_mb,
                "gpu_limit_mb": self.gpu_limit_mb, "batch_freq": self.batch_freq,
                "gpus": self.gpus, "reset_peak_each_epoch": self.reset_peak_each_epoch,
                "gpu_utilization": self.gpu_utilization}

    def _host_limit(self):
        if self.host_limit_mb is not None:
            return float(self.host_limit_mb)
        if "host" not in self.limits:
            self.limits["host"] = host_memory_limit_mb()
        return self.limits["host"]

    def _gpu_limit(self, index):
        if self.gpu_limit_mb is not None:
            return float(self.gpu_limit_mb)
        key = f"gpu{index}"
        if key not in self.limits:
            self.limits[key] = gpu_memory_limit_mb(index)
        return self.limits[key]


def open_nvml(physical_indices, environ=None, nvml=None):
    """NVML handles for TensorFlow's physical GPUs, or why there are none.

    Args:
        physical_indices: TensorFlow's physical GPU indices.
        environ: the environment, for `$CUDA_VISIBLE_DEVICES`.
        nvml: a stand-in NVML module (tests), or None for `pynvml`.

    Returns:
        `(tfdist.runtime.nvml.NvmlGpus, None)`, or `(None, reason)` when NVML is
        unavailable: the reason names what is missing and how to get it.

    Example:

    >>> open_nvml([0])   # a GPU machine without nvidia-ml-py
    (None, "NVML's Python bindings are not installed (...); pip install nvidia-ml-py ...")
    """
    try:
        return NvmlGpus(physical_indices, environ=environ, nvml=nvml), None
    except NvmlUnavailable as error:
        return None, str(error)


def physical_gpu_indices(logical_counts=None):
    """TensorFlow's physical GPU index of each logical GPU, in logical order.

    Args:
        logical_counts: the number of logical devices of each physical GPU
            (1 for an unsplit GPU), or None to ask TensorFlow.

    Example:

    >>> physical_gpu_indices([2, 1])   # GPU 0 split in two, GPU 1 whole
    [0, 0, 1]
    """
    if logical_counts is None:
        logical_counts = [len(tf.config.get_logical_device_configuration(gpu) or [None])
                          for gpu in tf.config.list_physical_devices("GPU")]
    return [physical for physical, count in enumerate(logical_counts) for _ in range(count)]


def host_rss_mb():
    """This process's resident memory in MB now, or None without `/proc`.

    Example:

    >>> host_rss_mb() > 0
    True
    """
    kb = _proc_status_kb("VmRSS")
    return None if kb is None else kb * 1024 / MB


def host_peak_rss_mb():
    """This process's peak resident memory in MB since it started.

    From `resource.getrusage(RUSAGE_SELF).ru_maxrss`, and `VmHWM` / `VmRSS`
    in `/proc/self/status` where they exist (whichever is largest, so the
    peak is never below the current figure).

    Example:

    >>> host_peak_rss_mb() >= host_rss_mb()
    True
    """
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    peak = peak / MB if sys.platform == "darwin" else peak * 1024 / MB
    for field in ("VmHWM", "VmRSS"):
        kb = _proc_status_kb(field)
        if kb is not None:
            peak = max(peak, kb * 1024 / MB)
    return peak


def _proc_status_kb(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_memory_limit_mb():
    """The memory this process may use in MB: the smaller of the machine's
    `MemTotal` and the cgroup (container) limit; None when neither is known.

    Example:

    >>> host_memory_limit_mb() > 0
    True
    """
    limits = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    limits.append(int(line.split()[1]) * 1024)
                    break
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < 2 ** 60:  # "max" or a huge number: no limit
            limits.append(int(value))
    return min(limits) / MB if limits else None


def gpu_memory_limit_mb(index):
    """The memory TensorFlow may use on GPU `index`, in MB, or None if unknown.

    A logical GPU made with `memory_limit` reports that limit; otherwise the
    limit of TensorFlow's allocator on the device.

    Args:
        index: the GPU index, as in "GPU:0".

    Example:

    >>> gpu_memory_limit_mb(0)  # on a 16 GB GPU
    15511.0
    """
    logical = []  # one entry per logical GPU, in TensorFlow's numbering
    for device in tf.config.list_physical_devices("GPU"):
        configs = tf.config.get_logical_device_configuration(device)
        logical.extend(configs if configs else [None])
    if index < len(logical) and logical[index] is not None and logical[index].memory_limit:
        return float(logical[index].memory_limit)
    try:  # Not a public API, but the one place TF reports a GPU allocator's limit.
        limits = local_gpu_memory_limits()
        if index < len(limits) and limits[index]:
            return limits[index] / MB
    except Exception:  # pragma: no cover - depends on the GPU runtime
        pass
    return None

