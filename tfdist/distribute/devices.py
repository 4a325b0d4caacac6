"""Device discovery and logical CPU splitting.

Multi-device code paths can run for real on a machine without accelerators by
splitting the CPU into several logical devices, which `MirroredStrategy` then
treats like separate GPUs. The split must happen before TensorFlow
initialises its devices; asking for it afterwards is an error, never a silent
single device.
"""

import tensorflow as tf

from tfdist.distribute.device_limits import check_device_count


class DeviceConfigError(RuntimeError):
    """The requested device layout cannot be provided in this process.

    Example:

        try:
            split_cpu_into_logical_devices(2)  # after TensorFlow set up its devices
        except DeviceConfigError as error:
            print(error)
    """


def gpu_count():
    """Returns the number of physical GPUs visible to TensorFlow.

    Example:

    >>> gpu_count()  # on a CPU-only machine
    0
    """
    return len(tf.config.list_physical_devices("GPU"))


def split_cpu_into_logical_devices(count):
    """Splits the first physical CPU into `count` logical CPU devices.

    Idempotent: when the CPU already has exactly `count` logical devices
    nothing happens. It does not initialise TensorFlow itself. Must be called before TensorFlow initialises its runtime
    (before the first op, strategy or variable).

    Args:
        count: number of logical CPU devices wanted, 1 to
            `MAX_DEVICES_PER_WORKER` (64; see `tfdist.distribute.device_limits`).

    Returns:
        The list of logical CPU device names, e.g. `["/device:CPU:0", ...]`.

    Raises:
        ValueError: `count` is not a positive integer, or is above
            `MAX_DEVICES_PER_WORKER` (the message names the limit).
        DeviceConfigError: TensorFlow is already initialised with a different
            number of logical CPUs.

    Example:

    >>> names = split_cpu_into_logical_devices(2)
    >>> len(names)
    2
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(
            f"The number of logical CPU devices must be an integer >= 1, got {count!r}."
        )
    check_device_count(count)
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    names = [f"/device:CPU:{index}" for index in range(count)]
    # Return without touching the runtime when the layout is already right:
    # listing logical devices would initialise TensorFlow, after which
    # MultiWorkerMirroredStrategy can no longer configure collective ops.
    if (len(configured) if configured else 1) == count:
        return names
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError as error:
        existing = len(tf.config.list_logical_devices("CPU"))
        raise DeviceConfigError(
            f"Cannot split the CPU into {count} logical devices: TensorFlow is "
            f"already initialised with {existing} logical CPU device(s). Ask for "
            "the devices before any TensorFlow op runs (for example pass "
            "--devices on the command line, or call "
            "tfdist.distribute.devices.split_cpu_into_logical_devices() at the top of your "
            "program)."
        ) from error
    return names
