"""How TensorFlow takes GPU memory: `--gpu-memory {growth,preallocate,limit:MB}`.

* `preallocate` (the default) is TensorFlow's own behaviour: at start-up it
  reserves nearly all of every GPU's memory for its allocator.
* `growth` calls `tf.config.experimental.set_memory_growth(gpu, True)` for
  every GPU: memory is taken as it is needed (other processes can share the
  GPU, at some cost in fragmentation).
* `limit:MB` calls `tf.config.set_logical_device_configuration(gpu,
  [tf.config.LogicalDeviceConfiguration(memory_limit=MB)])` for every GPU:
  one logical GPU per physical GPU, capped at MB (2**20 bytes, TensorFlow's
  unit).

Both calls must happen before TensorFlow initialises its devices (before the
first op, variable or strategy), so the parser here imports no TensorFlow:
a bad value is refused before TensorFlow starts, and `apply_gpu_memory` runs
right after the import.

With `--devices N`: `limit:MB` keeps one logical device per physical GPU, so
`/gpu:i` is still physical GPU i and `--devices N` takes the first N GPUs as
before; a GPU is never split into several (more devices than GPUs stays an
error of `create_strategy`). Without a GPU the setting does nothing and
`gpu_memory_notice` says so in one line (the CPU split of `--devices N` is
unaffected).

`$TF_FORCE_GPU_ALLOW_GROWTH` (set in some GPU images) overrides TensorFlow's
growth setting; `check_allow_growth_env` refuses an explicit request it
would contradict.

Verified on a machine without a GPU only: parsing, the no-GPU path, and the
calls made through TensorFlow's API as recorded through `apply_gpu_memory`'s
`tf_config` seam (the functions and argument types are TensorFlow's own);
their effect on a real GPU was not observed here.

Example:

    setting = parse_gpu_memory("limit:4096")        # before TensorFlow
    tf = import_tensorflow()
    gpus = apply_gpu_memory(setting)                # before the strategy
"""

import dataclasses
import os
import re

GPU_MEMORY_FORMS = ("growth", "preallocate", "limit:MB")
"""The forms `--gpu-memory` accepts (MB a positive integer)."""

DEFAULT_GPU_MEMORY = "preallocate"
"""TensorFlow's own behaviour: nearly all GPU memory reserved up front."""

ALLOW_GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"


class GpuMemoryError(RuntimeError):
    """The GPU memory setting cannot be applied in this process; the message says why.

    Example:

        try:
            apply_gpu_memory("growth")
        except GpuMemoryError as error:
            print(error)  # for example: the GPUs were initialised before
    """


@dataclasses.dataclass(frozen=True)
class GpuMemory:
    """A parsed `--gpu-memory` value.

    Attributes:
        mode: "growth", "preallocate" or "limit".
        limit_mb: the per-GPU limit in MB for "limit", else None.

    Example:

    >>> GpuMemory("limit", 4096).text
    'limit:4096'
    """

    mode: str
    limit_mb: int = None

    @property
    def text(self):
        """The canonical flag value."""
        return f"limit:{self.limit_mb}" if self.mode == "limit" else self.mode

    @property
    def is_default(self):
        """Whether this is TensorFlow's own behaviour (nothing to apply)."""
        return self.mode == DEFAULT_GPU_MEMORY


def parse_gpu_memory(text):
    """Parses a `--gpu-memory` value; imports no TensorFlow.

    Args:
        text: "growth", "preallocate" or "limit:MB" with MB a positive
            integer (case and spaces around the parts do not matter).

    Returns:
        A `GpuMemory`.

    Raises:
        ValueError: naming the value and the allowed forms.

    Example:

    >>> parse_gpu_memory("limit:4096")
    GpuMemory(mode='limit', limit_mb=4096)
    >>> parse_gpu_memory("Growth").text
    'growth'
    """
    if isinstance(text, GpuMemory):
        return text
    value = str(text).strip().lower()
    if value in ("growth", "preallocate"):
        return GpuMemory(value)
    mode, colon, number = str(text).strip().partition(":")
    if mode.strip().lower() == "limit" and colon:
        number = number.strip()
        if re.fullmatch(r"[0-9]+", number) and int(number) > 0:
            return GpuMemory("limit", int(number))
        raise ValueError(
            f"gpu_memory {text!r}: the limit must be a positive whole number of MB (2**20 bytes) "
            f"per GPU, such as limit:4096; got {number!r}.")
    raise ValueError(
        f"gpu_memory must be growth (allocate as needed), preallocate (TensorFlow's default: "
        f"nearly all memory up front) or limit:MB (MB a positive integer, such as limit:4096); "
        f"got {text!r}.")


def check_gpu_memory(text):
    """`parse_gpu_memory`, returning the canonical text (for a recipe `Option`).

    Example:

    >>> check_gpu_memory(" LIMIT: 512 ")
    'limit:512'
    """
    return parse_gpu_memory(text).text


def check_allow_growth_env(setting, explicit=True, environ=None):
    """Checks the setting against `$TF_FORCE_GPU_ALLOW_GROWTH`, which TensorFlow
    lets override its growth setting; imports no TensorFlow.

    Args:
        setting: a `GpuMemory` or its text.
        explicit: whether the user asked for the setting (a flag or the
            config file) rather than getting the default.
        environ: the environment (default `os.environ`).

    Returns:
        A note for the description when the variable changes what the
        setting does, else None.

    Raises:
        ValueError: an explicit request the variable contradicts, naming
            both and the ways out.

    Example:

    >>> check_allow_growth_env("preallocate", explicit=False,
    ...                        environ={"TF_FORCE_GPU_ALLOW_GROWTH": "true"})
    'growing as needed: $TF_FORCE_GPU_ALLOW_GROWTH=true overrides the preallocation'
    """
    setting = parse_gpu_memory(setting)
    environ = os.environ if environ is None else environ
    forced = environ.get(ALLOW_GROWTH_ENV)
    if forced not in ("true", "false"):  # unset, or a value TensorFlow ignores
        return None
    contradicted = ((forced == "true" and setting.mode == "preallocate")
                    or (forced == "false" and setting.mode == "growth"))
    if contradicted and (explicit or setting.mode == "growth"):
        other = "growth" if forced == "true" else "preallocate"
        raise ValueError(
            f"gpu_memory {setting.text} contradicts ${ALLOW_GROWTH_ENV}={forced} in the "
            f"environment, which TensorFlow obeys instead; unset the variable or use "
            f"--gpu-memory {other}.")
    if forced == "true" and setting.mode != "growth":
        what = "the preallocation" if setting.mode == "preallocate" else "the preallocation up to the limit"
        return f"growing as needed: ${ALLOW_GROWTH_ENV}=true overrides {what}"
    return None


def describe_gpu_memory(setting, gpus, note=None):
    """One line saying what the setting does with `gpus` GPUs.

    Example:

    >>> describe_gpu_memory(parse_gpu_memory("limit:4096"), 2)
    'limit:4096 on 2 GPU(s): one logical device of at most 4096 MB per GPU'
    >>> describe_gpu_memory(parse_gpu_memory("growth"), 0)
    'growth: no effect, TensorFlow sees no GPU'
    """
    setting = parse_gpu_memory(setting)
    if not gpus:
        return f"{setting.text}: no effect, TensorFlow sees no GPU"
    what = {"growth": "memory taken as needed",
            "preallocate": "TensorFlow's default, nearly all memory reserved up front",
            "limit": f"one logical device of at most {setting.limit_mb} MB per GPU"}[setting.mode]
    return f"{setting.text} on {gpus} GPU(s): {what}" + (f" ({note})" if note else "")


def gpu_memory_notice(setting, gpus):
    """The one-line statement for a non-default setting on a machine without
    GPUs, else None (nothing worth saying).

    Example:

    >>> gpu_memory_notice(parse_gpu_memory("growth"), 0)
    '--gpu-memory growth has no effect: TensorFlow sees no GPU on this machine.'
    >>> gpu_memory_notice(parse_gpu_memory("preallocate"), 0) is None
    True
    """
    setting = parse_gpu_memory(setting)
    if gpus or setting.is_default:
        return None
    return f"--gpu-memory {setting.text} has no effect: TensorFlow sees no GPU on this machine."


def apply_gpu_memory(setting, tf_config=None):
    """Applies the setting to every GPU; call it before TensorFlow initialises
    its devices (before the first op, variable or strategy).

    `preallocate` makes no call. A GPU that already has logical devices
    configured is refused for `growth`, and for `limit:MB` unless it holds
    exactly that one limit already (a second call is harmless).

    Args:
        setting: a `GpuMemory` or its text.
        tf_config: what to call instead of `tf.config`: an object with
            `list_physical_devices`, `get_logical_device_configuration`,
            `set_logical_device_configuration`, `LogicalDeviceConfiguration`
            and `experimental.set_memory_growth`. The seam through which
            tests on machines without GPUs check which calls are made;
            None (the default) is TensorFlow's own `tf.config`.

    Returns:
        The number of physical GPUs TensorFlow sees (0: nothing was done).

    Raises:
        ValueError: a bad setting.
        GpuMemoryError: TensorFlow has already initialised its GPUs, or a
            GPU is already configured otherwise; the message names the GPU
            and the way out.

    Example:

    >>> apply_gpu_memory("growth")   # on a machine without GPUs
    0
    """
    setting = parse_gpu_memory(setting)
    if tf_config is None:
        import tensorflow as tf

        tf_config = tf.config
    gpus = tf_config.list_physical_devices("GPU")
    if setting.is_default:
        return len(gpus)
    for gpu in gpus:
        existing = tf_config.get_logical_device_configuration(gpu)
        try:
            if setting.mode == "growth":
                if existing:
                    raise GpuMemoryError(
                        f"--gpu-memory growth cannot be set on {gpu.name}: it is already split "
                        f"into logical devices {list(existing)} (TensorFlow allows growth only "
                        "on an unsplit GPU); use --gpu-memory limit:MB or drop the split.")
                tf_config.experimental.set_memory_growth(gpu, True)
            else:
                wanted = [tf_config.LogicalDeviceConfiguration(memory_limit=setting.limit_mb)]
                if existing and list(existing) == wanted:
                    continue
                if existing:
                    raise GpuMemoryError(
                        f"--gpu-memory {setting.text} cannot be set on {gpu.name}: it is "
                        f"already configured as logical devices {list(existing)}.")
                tf_config.set_logical_device_configuration(gpu, wanted)
        except (RuntimeError, ValueError) as error:
            if isinstance(error, GpuMemoryError):
                raise
            raise GpuMemoryError(
                f"--gpu-memory {setting.text} could not be applied to {gpu.name}: it must be set "
                "before TensorFlow initialises its GPUs (before any op, variable, dataset or "
                "strategy); call tfdist.runtime.gpu_memory.apply_gpu_memory at the top of the program. "
                f"TensorFlow said: {error}") from error
    return len(gpus)
