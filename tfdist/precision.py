"""Mixed-precision policy selection.

A user names the precision in words (`auto`, `float32`, `mixed_float16`,
`mixed_bfloat16`); tfdist checks the hardware, picks for `auto`, and says what
it picked and why. The chosen name is applied as the Keras global dtype
policy, so layers built afterwards compute in it while their variables stay
float32.
"""

import dataclasses
import logging
import os
import platform

# TensorFlow and Keras are imported inside the functions that need them, so
# that the recipes can validate their flags (which name these precisions)
# without starting TensorFlow.

logger = logging.getLogger("tfdist")

PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
# Names users know from other tools (PyTorch Lightning, NVIDIA docs, ...),
# each mapped to the Keras policy it means. Half precision always means the
# mixed policy: variables stay float32.
PRECISION_ALIASES = {
    "fp32": "float32", "f32": "float32", "32": "float32", "32-true": "float32",
    "bf16": "mixed_bfloat16", "bfloat16": "mixed_bfloat16", "mixed_bf16": "mixed_bfloat16",
    "bf16-mixed": "mixed_bfloat16", "bf16_mixed": "mixed_bfloat16",
    "fp16": "mixed_float16", "f16": "mixed_float16", "float16": "mixed_float16", "half": "mixed_float16",
    "mixed_fp16": "mixed_float16", "16": "mixed_float16", "16-mixed": "mixed_float16",
    "fp16_mixed": "mixed_float16",
}
CPU_FLAGS_ENV = "TFDIST_CPU_FLAGS"
_CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# The CPU flags tfdist's rules and autotune's cache read, spelt as Linux's
# /proc/cpuinfo spells them.
HARDWARE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile",
                  "amx_int8", "fma")


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """The precision policy a run uses and why.

    Attributes:
        policy: a Keras dtype policy name: `float32`, `mixed_float16` or
            `mixed_bfloat16`.
        reason: one human sentence explaining the choice.
        loss_scaling: whether training needs dynamic loss scaling (float16).

    Example:

    >>> PrecisionChoice("float32", "asked for").compute_dtype
    'float32'
    """

    policy: str
    reason: str

    @property
    def compute_dtype(self):
        """The dtype layers compute in under this policy."""
        return {"float32": "float32", "mixed_float16": "float16",
                "mixed_bfloat16": "bfloat16"}[self.policy]

    @property
    def loss_scaling(self):
        """True when the policy needs dynamic loss scaling (float16)."""
        return self.policy == "mixed_float16"


def canonical_precision(name):
    """Maps a precision name or a known alias to one of `PRECISIONS`.

    Args:
        name: `auto`, a Keras policy name, or an alias such as `bf16`,
            `fp16`, `fp32`, `mixed_bf16` (see `PRECISION_ALIASES`); case and
            surrounding spaces are ignored.

    Returns:
        The name in `PRECISIONS`.

    Raises:
        ValueError: an unknown name; the message lists the valid ones.

    Example:

    >>> canonical_precision("bf16")
    'mixed_bfloat16'
    """
    key = str(name).strip().lower()
    if key in PRECISIONS:
        return key
    if key in PRECISION_ALIASES:
        return PRECISION_ALIASES[key]
    raise ValueError(
        f"Unknown precision {name!r}. Valid precisions: {', '.join(PRECISIONS)} "
        f"(aliases: {', '.join(PRECISION_ALIASES)}).")


def cpu_flags(cpuinfo_path="/proc/cpuinfo", environ=None):
    """Returns the set of CPU feature flags (empty where they cannot be read).

    The environment variable `TFDIST_CPU_FLAGS` (flags separated by spaces
    or commas, e.g. `"avx2 fma"` or `"avx2,amx_bf16,avx512_bf16"`) replaces
    what the CPU reports: set it to see what `--precision auto` would pick on
    another kind of CPU, and in tests, so that they do not depend on the
    machine that runs them. Set but empty, it describes a CPU with no flags.
    A flag tfdist reads spelt otherwise than /proc/cpuinfo spells it
    (`AVX2`, `avx512bf16`) is refused with a ValueError naming the spelling.

    Example:

    >>> "avx2" in cpu_flags()  # on most x86-64 machines
    True
    >>> sorted(cpu_flags(environ={"TFDIST_CPU_FLAGS": "avx2,amx_bf16"}))
    ['amx_bf16', 'avx2']
    """
    environ = os.environ if environ is None else environ
    if CPU_FLAGS_ENV in environ:
        flags = set(environ[CPU_FLAGS_ENV].replace(",", " ").split())
        for flag in sorted(flags):
            meant = _flag_meant(flag)
            if meant is not None:
                raise ValueError(
                    f"${CPU_FLAGS_ENV} names {flag!r}, which is not how /proc/cpuinfo spells a "
                    f"flag: did you mean {meant!r}? (the flags tfdist reads: "
                    f"{' '.join(HARDWARE_FLAGS)})")
        return flags
    try:
        with open(cpuinfo_path) as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _flag_meant(flag):
    """The flag of HARDWARE_FLAGS that `flag` misspells (case, `-` or `_` aside), else None.

    A misspelt flag would otherwise count as absent, and `auto` would pick
    for a CPU without it, silently.
    """
    squeezed = flag.lower().replace("-", "").replace("_", "")
    for known in HARDWARE_FLAGS:
        if flag != known and squeezed == known.replace("_", ""):
            return known
    return None


def cpu_model_name(cpuinfo_path="/proc/cpuinfo"):
    """The CPU's model name (from /proc/cpuinfo, else what `platform` says).

    Example:

    >>> cpu_model_name()
    'AMD EPYC 7B13'
    """
    try:
        with open(cpuinfo_path) as stream:
            for line in stream:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def gpu_descriptions():
    """`(name, (major, minor))` for each GPU TensorFlow sees: its device name
    and compute capability (`(0, 0)` when TensorFlow does not report one).

    Example:

    >>> gpu_descriptions()  # on a machine without GPUs
    []

    Where no GPU can be present (`tfdist.runtime.gpu_presence`), TensorFlow is
    not asked, so a preview of the `auto` rules need not import it.
    """
    from tfdist.runtime.gpu_presence import gpus_certainly_absent

    if gpus_certainly_absent():
        return []
    import tensorflow as tf

    descriptions = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        descriptions.append((details.get("device_name", gpu.name),
                             tuple(details.get("compute_capability") or (0, 0))))
    return descriptions


def detect_precision(gpu_capabilities=None, flags=None):
    """Picks the fastest numerically safe policy for this machine.

    bfloat16 on Ampere or newer GPUs (compute capability >= 8.0) and on CPUs
    with AMX-BF16 or AVX512-BF16; float16 with loss scaling on GPUs with
    compute capability 7.x; float32 otherwise.

    Args:
        gpu_capabilities: list of `(major, minor)` tuples, one per GPU; read
            from TensorFlow when None.
        flags: set of CPU feature flags; read from /proc/cpuinfo when None.

    Returns:
        A `PrecisionChoice`.

    Example:

    >>> detect_precision(gpu_capabilities=[(7, 0)]).policy
    'mixed_float16'
    """
    if gpu_capabilities is None:
        gpu_capabilities = [capability for _, capability in gpu_descriptions()]
    if gpu_capabilities:
        oldest = min(gpu_capabilities)
        version = f"{oldest[0]}.{oldest[1]}"
        if oldest >= (8, 0):
            return PrecisionChoice(
                "mixed_bfloat16", f"auto: GPU compute capability {version} (>= 8.0) has fast bfloat16")
        if oldest >= (7, 0):
            return PrecisionChoice(
                "mixed_float16", f"auto: GPU compute capability {version} has float16 tensor cores but no bfloat16")
        return PrecisionChoice(
            "float32", f"auto: GPU compute capability {version} (< 7.0) has no fast half precision")
    if flags is None:
        flags = cpu_flags()
    fast = sorted(flags.intersection(_CPU_BF16_FLAGS))
    source = f" (from ${CPU_FLAGS_ENV})" if CPU_FLAGS_ENV in os.environ else ""
    if fast:
        return PrecisionChoice("mixed_bfloat16", f"auto: CPU has {', '.join(fast)}{source}")
    return PrecisionChoice(
        "float32", "auto: no GPU and no AMX-BF16/AVX512-BF16 on this CPU, so half precision would be "
        f"slower{source}")


def resolve_precision(name):
    """Validates a precision name and resolves `auto`.

    Args:
        name: one of `PRECISIONS`, or an alias (`bf16`, `fp16`, `fp32`, ...).

    Returns:
        A `PrecisionChoice`; a warning is logged when an explicit half
        precision is asked for on hardware that only emulates it.

    Raises:
        ValueError: `name` is not one of `PRECISIONS`.

    Example:

    >>> resolve_precision("float32").policy
    'float32'
    >>> resolve_precision("bf16").policy
    'mixed_bfloat16'
    """
    name = canonical_precision(name)
    if name == "auto":
        return detect_precision()
    choice = PrecisionChoice(name, "asked for")
    if name != "float32" and detect_precision().policy != name:
        logger.warning(
            "Precision %s was asked for, but this machine has no fast %s; it will "
            "run, likely slower than float32.", name, choice.compute_dtype)
    return choice


def apply_precision(name):
    """Resolves `name` and sets it as the Keras global dtype policy.

    Call it before building the model (and inside or outside the strategy
    scope: the policy is global).

    Args:
        name: one of `PRECISIONS`.

    Returns:
        The applied `PrecisionChoice`.

    Example:

    >>> choice = apply_precision("mixed_bfloat16")
    >>> keras.mixed_precision.dtype_policy().name
    'mixed_bfloat16'
    """
    import keras

    choice = resolve_precision(name)
    keras.mixed_precision.set_global_policy(choice.policy)
    logger.debug("Precision: %s (%s)", choice.policy, choice.reason)
    return choice
