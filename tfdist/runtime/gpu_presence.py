"""Whether this machine certainly has no GPU, told without starting TensorFlow.

Asking TensorFlow for its GPUs costs its import (2-5 s of CPU). A command that
only previews what `auto` resolves to (`--print-config`) can skip that where
the answer is certain: a Linux machine with no NVIDIA or AMD display or
accelerator on its PCI bus, none of the device files the NVIDIA, ROCm or WSL
drivers create, and no TensorFlow device plugin installed. Anything else (a
GPU on the bus without its driver, a container that hides the bus, another
operating system) is "maybe", and the caller asks TensorFlow.

Example:

    gpus = 0 if gpus_certainly_absent() else gpu_count()
"""

import os
import sys

GPU_VENDORS = ("0x10de", "0x1002")
"""PCI vendor ids of NVIDIA and AMD, whose GPUs TensorFlow builds can use."""

GPU_CLASSES = ("0x03", "0x12")
"""PCI base classes a GPU reports: display controller, processing accelerator."""

DRIVER_DEVICE_FILES = ("nvidiactl", "nvidia0", "kfd", "dxg")
"""Files under /dev that the NVIDIA, ROCm and WSL GPU drivers create."""


def gpus_certainly_absent(pci_devices="/sys/bus/pci/devices", dev="/dev", paths=None):
    """True when TensorFlow cannot see a GPU here; False when it may.

    Args:
        pci_devices: the folder listing the PCI devices (sysfs).
        dev: the device folder.
        paths: where Python imports from (`sys.path` when None), searched for
            the `tensorflow-plugins` folder of pluggable devices.

    Example:

    >>> gpus_certainly_absent(pci_devices="/no/such/folder")  # cannot tell
    False
    """
    if not sys.platform.startswith("linux"):
        return False
    if any(os.path.exists(os.path.join(dev, name)) for name in DRIVER_DEVICE_FILES):
        return False
    if any(os.path.isdir(os.path.join(path, "tensorflow-plugins"))
           for path in (sys.path if paths is None else paths) if path):
        return False
    try:
        devices = os.listdir(pci_devices)
    except OSError:
        return False
    if not devices:
        return False  # a bus hidden from this process (some containers): cannot tell
    return not any(_is_gpu(os.path.join(pci_devices, device)) for device in devices)


def _is_gpu(device_folder):
    """Whether the PCI device in `device_folder` is an NVIDIA or AMD GPU (True when unreadable)."""
    try:
        with open(os.path.join(device_folder, "vendor")) as vendor_file:
            vendor = vendor_file.read().strip()
        with open(os.path.join(device_folder, "class")) as class_file:
            device_class = class_file.read().strip()
    except OSError:
        return True
    return vendor in GPU_VENDORS and device_class[:4] in GPU_CLASSES
