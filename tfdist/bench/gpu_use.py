"""How busy the GPUs were during a sweep point: NVML utilisation, sampled.

A sweep point on GPUs samples NVML's utilisation of its GPUs (the first
`devices` of TensorFlow's, mapped through `$CUDA_VISIBLE_DEVICES` by
`tfdist.runtime.nvml`) every `interval` seconds in a thread while its rounds run,
and reports the mean as `gpu_utilization` (a fraction, for the scaling
table's "GPU utilisation" column). Without NVML the figure is None and
`gpu_utilization_note` says why; on a machine without GPUs nothing is
sampled and the column is left out of the table. Under several workers the
figure is the chief's GPUs'.

Verified on a machine without GPUs only, with a stand-in NVML module.

Example:

    sampler = UtilizationSampler([0, 1]).start()
    ...  # the measured rounds
    sampler.stop()   # {'gpu_utilization': 0.83, 'gpu_utilization_samples': 42}
"""

import threading

from tfdist.runtime.argtypes import check_number
from tfdist.runtime.nvml import NvmlGpus, NvmlUnavailable


def mean_utilization(samples):
    """The mean of utilisation samples in percent, as a fraction; None for none.

    Args:
        samples: percentages (0-100); None entries (not reported) are skipped.

    Example:

    >>> mean_utilization([80.0, 90.0, None])
    0.85
    """
    values = [value for value in samples if value is not None]
    return sum(values) / len(values) / 100.0 if values else None


class UtilizationSampler:
    """Samples the utilisation of some GPUs in a thread between `start` and `stop`.

    Args:
        tf_indices: TensorFlow's physical GPU indices to sample.
        interval: seconds between samples, > 0.
        environ: the environment, for `$CUDA_VISIBLE_DEVICES`.
        nvml: a stand-in NVML module (tests), or None for `pynvml`.

    Example:

    >>> sampler = UtilizationSampler([0], interval=0.5).start()
    >>> sampler.stop()["gpu_utilization"]
    0.83
    """

    def __init__(self, tf_indices, interval=0.5, environ=None, nvml=None):
        check_number("interval", interval, above=0, unit="seconds")
        self.tf_indices = list(tf_indices)
        self.interval = interval
        self._environ, self._nvml = environ, nvml
        self._gpus, self._note = None, None
        self._samples = []
        self._stopped = threading.Event()
        self._thread = None

    def start(self):
        """Opens NVML and starts sampling; returns self."""
        try:
            self._gpus = NvmlGpus(self.tf_indices, environ=self._environ, nvml=self._nvml)
        except NvmlUnavailable as error:
            self._note = str(error)
            return self
        self._thread = threading.Thread(target=self._run, name="gpu-utilization", daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while True:
            readings = self._gpus.read()
            self._samples.extend(reading.utilization_percent for reading in readings.values())
            if self._stopped.wait(self.interval):
                return

    def stop(self):
        """Stops sampling; returns `gpu_utilization` (mean fraction, or None
        with `gpu_utilization_note`) and `gpu_utilization_samples`."""
        if self._gpus is None:
            return {"gpu_utilization": None, "gpu_utilization_note": self._note}
        self._stopped.set()
        self._thread.join()
        self._gpus.close()
        figures = {"gpu_utilization": mean_utilization(self._samples),
                   "gpu_utilization_samples": len(self._samples)}
        if figures["gpu_utilization"] is None:
            figures["gpu_utilization_note"] = "; ".join(sorted(set(self._gpus.problems.values()))) \
                or "no samples"
        return figures
