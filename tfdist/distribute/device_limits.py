"""The most devices one worker may ask for, checked without importing TensorFlow.

Without GPUs, tfdist splits the CPU into N logical devices for N replicas
(`tfdist.distribute.devices.split_cpu_into_logical_devices`). Every logical device is a
full TensorFlow device with its own executor and its own copy of the model,
all running on the same cores, so beyond the core count more devices add no
speed, only memory and start-up time; a typo such as `--devices 1000` would
otherwise spend minutes creating a thousand replicas. No machine has more
than 64 GPUs either, so one limit serves both.

The recipes check `--devices` with `check_device_count` before TensorFlow
starts; `split_cpu_into_logical_devices` checks again for direct callers and
for `TFDIST_DEVICES_PER_WORKER`.

Example:

    check_device_count(8)   # 8
"""

import os

MAX_DEVICES_PER_WORKER = 64
"""The most devices (GPUs, or logical CPU devices) one worker may use."""


def check_device_count(count, what="devices"):
    """Refuses a device count above `MAX_DEVICES_PER_WORKER`.

    Args:
        count: the number of devices asked for (an int; the lower bound is
            the caller's to check).
        what: how the caller names the count, for the message (a flag such
            as `--devices`, or an argument name).

    Returns:
        `count`, unchanged.

    Raises:
        ValueError: `count` is above the limit; the message names the
            limit, this machine's core count and a count that works.

    Example:

    >>> check_device_count(2)
    2
    >>> check_device_count(100)
    Traceback (most recent call last):
    ValueError: devices=100 is more than 64, the most devices per worker ...
    """
    if isinstance(count, int) and not isinstance(count, bool) and count > MAX_DEVICES_PER_WORKER:
        cores = os.cpu_count() or 1
        raise ValueError(
            f"{what}={count} is more than {MAX_DEVICES_PER_WORKER}, the most devices per worker "
            f"tfdist allows (GPUs, or logical devices the CPU is split into). Logical CPU devices "
            f"share this machine's {cores} core(s): more of them add replicas, memory and "
            f"start-up time, not speed. Use {what}={min(cores, MAX_DEVICES_PER_WORKER)} (one per "
            f"core) or any count from 1 to {MAX_DEVICES_PER_WORKER}.")
    return count
