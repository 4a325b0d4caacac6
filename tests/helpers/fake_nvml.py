"""A stand-in for NVML's `pynvml` module, for the GPU path on machines without GPUs.

These machines have no GPU and no NVIDIA driver, so real NVML cannot answer.
This module has the few `pynvml` functions tfdist calls, with the same names,
arguments, units (bytes, milliwatts, percent) and error class as
`nvidia-ml-py` 13.615, over devices described by the test. It is passed
through the documented `nvml=` seam of `tfdist.runtime.nvml.NvmlGpus`; what it
checks is tfdist's side (mapping, units, formatting), not NVML itself.
"""

import types


class NVMLError(Exception):
    """Like `pynvml.NVMLError`."""


def make_nvml(devices, init_error=None):
    """A module object standing in for `pynvml`.

    Args:
        devices: one dict per NVML device, in NVML's order: `uuid`,
            `utilization` (percent), `used` (bytes), `power_mw` (milliwatts,
            or None for "Not Supported").
        init_error: a message `nvmlInit` fails with, or None.

    Returns:
        The module; `module.calls` lists the calls made, by name.
    """
    module = types.ModuleType("fake_pynvml")
    module.NVMLError = NVMLError
    module.calls = []
    module.initialised = 0

    def call(name):
        module.calls.append(name)
        if name != "nvmlInit" and not module.initialised:
            raise NVMLError("Uninitialized")

    def nvmlInit():
        call("nvmlInit")
        if init_error:
            raise NVMLError(init_error)
        module.initialised += 1

    def nvmlShutdown():
        call("nvmlShutdown")
        module.initialised -= 1

    def nvmlDeviceGetCount():
        call("nvmlDeviceGetCount")
        return len(devices)

    def nvmlDeviceGetHandleByIndex(index):
        call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(devices):
            raise NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(uuid):
        call("nvmlDeviceGetHandleByUUID")
        for index, device in enumerate(devices):
            if device["uuid"] == uuid:
                return index
        raise NVMLError("Not Found")

    def nvmlDeviceGetUUID(handle):
        call("nvmlDeviceGetUUID")
        return devices[handle]["uuid"].encode()  # older pynvml returns bytes

    def nvmlDeviceGetUtilizationRates(handle):
        call("nvmlDeviceGetUtilizationRates")
        return types.SimpleNamespace(gpu=devices[handle]["utilization"], memory=0)

    def nvmlDeviceGetMemoryInfo(handle):
        call("nvmlDeviceGetMemoryInfo")
        return types.SimpleNamespace(used=devices[handle]["used"], total=2 * devices[handle]["used"])

    def nvmlDeviceGetPowerUsage(handle):
        call("nvmlDeviceGetPowerUsage")
        if devices[handle]["power_mw"] is None:
            raise NVMLError("Not Supported")
        return devices[handle]["power_mw"]

    for function in (nvmlInit, nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
                     nvmlDeviceGetHandleByUUID, nvmlDeviceGetUUID, nvmlDeviceGetUtilizationRates,
                     nvmlDeviceGetMemoryInfo, nvmlDeviceGetPowerUsage):
        setattr(module, function.__name__, function)
    return module


GIB = 1024 ** 3

FOUR_GPUS = [
    {"uuid": f"GPU-{index}aaa-1111", "utilization": 10.0 * (index + 1), "used": (index + 1) * GIB,
     "power_mw": 100_000 + 1000 * index}
    for index in range(4)
]
"""NVML devices 0-3: utilisation 10/20/30/40 %, 1-4 GiB used, 100-103 W."""
