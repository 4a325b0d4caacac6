"""GPU utilisation, memory in use and power draw through NVML; no TensorFlow.

TensorFlow reports what its own allocator holds on a GPU, not how busy the
GPU is. NVML, the library behind `nvidia-smi`, does. Its Python bindings are
the `pynvml` module of the `nvidia-ml-py` package (in tfdist's `cuda`
extra). They are imported only when figures are asked for, so tfdist works
without them; a missing package or driver is an `NvmlUnavailable` whose
message says what to install.

Which NVML device is TensorFlow's GPU i: TensorFlow numbers the GPUs CUDA
shows it, and CUDA shows those of `$CUDA_VISIBLE_DEVICES`, in that order
(indices or UUIDs), else all of them (`nvml_device_ids`). Two caveats that
cannot be checked without GPUs: CUDA numbers GPUs fastest first unless
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, NVML by PCI bus, so on a machine with
different GPU models set that variable or use UUIDs in
`CUDA_VISIBLE_DEVICES`; and GPUs TensorFlow ignores (a compute capability
too old) shift its numbering.

Verified on a machine without a GPU only: the mapping, the messages when
the package or the driver library is missing (with the real `nvidia-ml-py`
13.615, `nvmlInit` raises `NVMLError_LibraryNotFound` there), and the
readings through a stand-in NVML module passed as `nvml=`.

Example:

    gpus = NvmlGpus([0, 1])            # TensorFlow's GPU:0 and GPU:1
    gpus.read()[0].utilization_percent  # e.g. 87.0
    gpus.close()
"""

import dataclasses
import os
import re

MB = 1024 * 1024
"""Bytes in the "MB" of the figures (2**20, as TensorFlow and nvidia-smi count)."""

INSTALL_HINT = 'pip install nvidia-ml-py (or pip install "tfdist[cuda]")'


class NvmlUnavailable(RuntimeError):
    """NVML figures cannot be read in this process; the message says why and what to do.

    Example:

        try:
            nvml = load_nvml()
        except NvmlUnavailable as error:
            print(error)  # for example: no NVIDIA driver library on this machine
    """


def load_nvml():
    """Imports NVML's Python bindings (`pynvml`, from the `nvidia-ml-py` package).

    Raises:
        NvmlUnavailable: the package is not installed; the message says how
            to install it.

    Example:

    >>> load_nvml().__name__   # with nvidia-ml-py installed
    'pynvml'
    """
    try:
        import pynvml  # pylint: disable=import-outside-toplevel
    except ImportError as error:
        raise NvmlUnavailable(
            f"NVML's Python bindings are not installed ({error}); {INSTALL_HINT}.") from None
    return pynvml


def cuda_visible_ids(environ=None):
    """The devices `$CUDA_VISIBLE_DEVICES` shows to CUDA, or None when it is unset.

    As CUDA reads it: comma-separated indices (`0`) or UUIDs (`GPU-...`,
    `MIG-...`, a unique prefix is enough), up to the first entry that is
    neither (so `-1` or an empty value show no GPU).

    Example:

    >>> cuda_visible_ids({"CUDA_VISIBLE_DEVICES": "2,GPU-8932f937,-1,0"})
    [2, 'GPU-8932f937']
    >>> cuda_visible_ids({}) is None
    True
    """
    environ = os.environ if environ is None else environ
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    ids = []
    for part in value.split(","):
        part = part.strip()
        if re.fullmatch(r"[0-9]+", part):
            ids.append(int(part))
        elif part[:4].upper() in ("GPU-", "MIG-"):
            ids.append(part)
        else:
            break
    return ids


def nvml_device_ids(tf_indices, environ=None):
    """The NVML device of each of TensorFlow's physical GPUs.

    Args:
        tf_indices: TensorFlow's physical GPU indices (as in "GPU:0").
        environ: the environment (default `os.environ`), for
            `$CUDA_VISIBLE_DEVICES`.

    Returns:
        One identifier per index: an NVML index (int) or a UUID (str).

    Raises:
        ValueError: an index beyond the GPUs `$CUDA_VISIBLE_DEVICES` shows
            (naming both).

    Example:

    >>> nvml_device_ids([0, 1], {"CUDA_VISIBLE_DEVICES": "3,1"})
    [3, 1]
    >>> nvml_device_ids([0, 1], {})
    [0, 1]
    """
    environ = os.environ if environ is None else environ
    visible = cuda_visible_ids(environ)
    if visible is None:
        return list(tf_indices)
    beyond = [index for index in tf_indices if index >= len(visible)]
    if beyond:
        raise ValueError(
            f"TensorFlow GPU(s) {beyond} are beyond CUDA_VISIBLE_DEVICES="
            f"{environ['CUDA_VISIBLE_DEVICES']!r}, which shows {len(visible)} GPU(s); cannot "
            "tell which NVML device they are.")
    return [visible[index] for index in tf_indices]


@dataclasses.dataclass(frozen=True)
class GpuReading:
    """One GPU's figures from NVML; a figure the GPU does not report is None.

    Attributes:
        utilization_percent: percent of the last sample period (1/6 s to
            1 s, by GPU) in which a kernel ran, 0 to 100.
        memory_used_mb: memory in use on the GPU by every process, in MB.
        power_w: power draw in watts.

    Example:

    >>> GpuReading(utilization_percent=87.0, memory_used_mb=10240.0).power_w is None
    True
    """

    utilization_percent: float = None
    memory_used_mb: float = None
    power_w: float = None


def reading_logs(index, reading):
    """The log entries of one GPU's reading, figures that are None left out.

    Args:
        index: TensorFlow's GPU index, for the key names.
        reading: a `GpuReading`.

    Example:

    >>> reading_logs(0, GpuReading(87.0, 10240.0, 251.5))
    {'gpu0_utilization': 87.0, 'gpu0_memory_used_mb': 10240.0, 'gpu0_power_w': 251.5}
    """
    figures = {f"gpu{index}_utilization": reading.utilization_percent,
               f"gpu{index}_memory_used_mb": reading.memory_used_mb,
               f"gpu{index}_power_w": reading.power_w}
    return {key: value for key, value in figures.items() if value is not None}


class NvmlGpus:
    """NVML handles for some of TensorFlow's GPUs, read on demand.

    Args:
        tf_indices: TensorFlow's physical GPU indices to read.
        environ: the environment, for `$CUDA_VISIBLE_DEVICES` (default
            `os.environ`).
        nvml: the NVML module to use; None imports `pynvml`. Tests on
            machines without a GPU pass a stand-in module with the same
            functions (`nvmlInit`, `nvmlDeviceGetHandleByIndex`, ...).

    Raises:
        NvmlUnavailable: the package is missing, NVML cannot start (no
            driver), or a GPU has no NVML device; the message says which.

    Attributes:
        problems: `{log key: why}` for figures a GPU does not report.

    Example:

    >>> gpus = NvmlGpus([0])
    >>> gpus.read()
    {0: GpuReading(utilization_percent=87.0, memory_used_mb=10240.0, power_w=251.5)}
    >>> gpus.close()
    """

    def __init__(self, tf_indices, environ=None, nvml=None):
        self.nvml = load_nvml() if nvml is None else nvml
        self.problems = {}
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as error:
            raise NvmlUnavailable(
                f"NVML could not start ({error}): the NVIDIA driver's libnvidia-ml is missing "
                "or cannot see the GPUs.") from None
        try:
            ids = nvml_device_ids(list(tf_indices), environ)
            self.handles = {index: self._handle(device) for index, device in zip(tf_indices, ids)}
        except (ValueError, self.nvml.NVMLError) as error:
            self.close()
            raise NvmlUnavailable(f"NVML has no device for a TensorFlow GPU: {error}") from None

    def _handle(self, device):
        nvml = self.nvml
        if isinstance(device, int):
            return nvml.nvmlDeviceGetHandleByIndex(device)
        try:
            return nvml.nvmlDeviceGetHandleByUUID(device)
        except nvml.NVMLError:
            pass
        for index in range(nvml.nvmlDeviceGetCount()):  # CUDA takes a unique UUID prefix
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if uuid.startswith(device):
                return handle
        raise ValueError(f"no NVML device has UUID {device!r}")

    def read(self):
        """Reads every GPU now; returns `{tf_index: GpuReading}` (see the class example)."""
        return {index: GpuReading(
            self._figure(index, "utilization",
                         lambda: float(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            self._figure(index, "memory_used_mb",
                         lambda: self.nvml.nvmlDeviceGetMemoryInfo(handle).used / MB),
            self._figure(index, "power_w",
                         lambda: self.nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0))
            for index, handle in self.handles.items()}

    def _figure(self, index, name, read):
        try:
            return read()
        except self.nvml.NVMLError as error:  # e.g. power on some boards, MIG slices
            self.problems[f"gpu{index}_{name}"] = str(error)
            return None

    def close(self):
        """Shuts NVML down (harmless to call twice)."""
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass
