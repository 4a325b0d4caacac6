"""Which settings an autotune trial times: the precision x XLA grid.

`--precision auto` and `--xla auto` leave a choice open; an explicit value
closes it. The grid holds only settings this hardware can run natively: on
a CPU, bfloat16 only where it has AMX-BF16 or AVX512-BF16 (elsewhere it is
emulated and always slower), float16 never (emulated on every CPU); on GPUs
bfloat16 from compute capability 8.0 and float16 from 7.0. XLA is tried on
and off unless the model cannot be compiled, except half precision with XLA
on CPUs: XLA's CPU bfloat16 matmul does not use the CPU's bfloat16
instructions (2x slower than TensorFlow's own kernels, measured on CPUs with
AMX and with AVX512-BF16), and it was the slowest setting in every trial,
while its compilation is the trial's longest. `--xla on` still times it.

Example:

    grid = candidate_grid("auto", "auto", on_gpu=False, cpu_flags={"avx512_bf16"})
    [c.label for c in grid]
    # ['float32, XLA off', 'float32, XLA on', 'mixed_bfloat16, XLA off']
"""

import dataclasses

from tfdist.precision import PRECISIONS
from tfdist.xla import XLA_MODES

_CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One setting a trial times: a Keras precision policy and XLA on or off.

    Args:
        policy: "float32", "mixed_bfloat16" or "mixed_float16".
        jit_compile: whether the replica step is XLA-compiled.

    Example:

    >>> Candidate("mixed_bfloat16", False).label
    'mixed_bfloat16, XLA off'
    """

    policy: str
    jit_compile: bool

    @property
    def label(self):
        """A short label, e.g. 'float32, XLA on' (see the class example)."""
        return f"{self.policy}, XLA {'on' if self.jit_compile else 'off'}"

    def as_dict(self):
        """`{"precision": policy, "xla": bool}`, as the cache stores it.

        Example:

        >>> Candidate("float32", True).as_dict()
        {'precision': 'float32', 'xla': True}
        """
        return {"precision": self.policy, "xla": self.jit_compile}


def candidate_precisions(precision, on_gpu, gpu_capabilities=(), cpu_flags=()):
    """The precision policies a trial may time, and a note on any left out.

    Args:
        precision: the asked precision, canonical (`auto` or a policy name).
        on_gpu: whether the step runs on GPUs.
        gpu_capabilities: `(major, minor)` of each GPU.
        cpu_flags: the CPU's feature flags (see `tfdist.precision.cpu_flags`).

    Returns:
        `(policies, note)`: a tuple of policy names (float32 first when
        present), and a sentence naming what was left out and why, or None.

    Example:

    >>> candidate_precisions("auto", False, cpu_flags={"avx2"})
    (('float32',), 'mixed_bfloat16 not tried: this CPU has no AMX-BF16/AVX512-BF16, so it would only be emulated')
    >>> candidate_precisions("mixed_float16", True, [(7, 0)])
    (('mixed_float16',), None)
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (canonical names; "
                         f"tfdist.precision.canonical_precision turns aliases into them), got "
                         f"{precision!r}.")
    if precision != "auto":
        return (precision,), None
    if on_gpu:
        oldest = min(gpu_capabilities) if gpu_capabilities else (0, 0)
        policies = ["float32"]
        if oldest >= (8, 0):
            policies.append("mixed_bfloat16")
        if oldest >= (7, 0):
            policies.append("mixed_float16")
        note = None if len(policies) == 3 else (
            f"half precisions without fast kernels on compute capability "
            f"{oldest[0]}.{oldest[1]} not tried")
        return tuple(policies), note
    if set(cpu_flags).intersection(_CPU_BF16_FLAGS):
        return ("float32", "mixed_bfloat16"), None
    return ("float32",), ("mixed_bfloat16 not tried: this CPU has no AMX-BF16/AVX512-BF16, so it "
                          "would only be emulated")


def candidate_grid(precision, xla, *, on_gpu, gpu_capabilities=(), cpu_flags=(),
                   xla_blocker=None):
    """The settings a trial times for the asked `--precision` and `--xla`.

    Args:
        precision: the asked precision, canonical (`auto` or a policy name).
        xla: the asked XLA mode, "auto", "on" or "off".
        on_gpu, gpu_capabilities, cpu_flags: the hardware (see
            `candidate_precisions`).
        xla_blocker: why the model cannot be XLA-compiled, or None.

    Returns:
        A tuple of `Candidate`s: a single one when nothing is left to choose.

    Example:

    >>> [c.label for c in candidate_grid("float32", "auto", on_gpu=False)]
    ['float32, XLA off', 'float32, XLA on']
    >>> [c.label for c in candidate_grid("auto", "off", on_gpu=False, cpu_flags={"amx_bf16"})]
    ['float32, XLA off', 'mixed_bfloat16, XLA off']
    >>> [c.label for c in candidate_grid("auto", "auto", on_gpu=False, cpu_flags={"amx_bf16"})]
    ['float32, XLA off', 'float32, XLA on', 'mixed_bfloat16, XLA off']
    """
    if xla not in XLA_MODES:
        raise ValueError(f"xla must be one of {', '.join(XLA_MODES)}, got {xla!r}.")
    policies, _ = candidate_precisions(precision, on_gpu, gpu_capabilities, cpu_flags)
    if xla == "auto":
        compile_choices = (False,) if xla_blocker else (False, True)
    else:
        compile_choices = (xla == "on",)
    return tuple(Candidate(policy, jit) for policy in policies for jit in compile_choices
                 if not (jit and xla == "auto" and not on_gpu and policy != "float32"))
