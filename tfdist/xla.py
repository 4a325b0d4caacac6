"""When tfdist XLA-compiles the replica step (`--xla auto|on|off`).

`auto` compiles everywhere except bfloat16 on CPUs. Measured figures behind
that choice (README, Performance):

- GPUs: XLA fuses elementwise kernels into their matmuls; on by default.
- float32 on CPUs: the gain grows with the model. On a 2-core AVX2 CPU the
  Transformer `base` (6 layers, d=512) trains 1.18x faster with XLA and
  reaches 75% of the float32 matmul FLOP/s; the tiny and small ones gain
  between 0.9x and 1.2x, run to run. On an Intel Xeon with AMX the small one
  gained 2.1x.
- bfloat16 on CPUs: TensorFlow's own bfloat16 kernels beat XLA's (on an
  Intel Xeon with AMX: 5,040 vs 4,500 tokens/s on the small Transformer;
  XLA's CPU bfloat16 matmul does not use AMX).
- A model whose step is faster uncompiled on CPUs says why
  (`leave_uncompiled_where_slower`): the CNN recipe's ResNets, whose fused
  batch norms ran the float32 step 1.98x faster without XLA on an AMX Xeon.

Example:

    jit_compile, reason = resolve_xla("auto", "float32", on_gpu=False)
"""

XLA_MODES = ("auto", "on", "off")

SYNC_BN_XLA_BLOCKER = ("synchronised batch norm all-reduces inside the model, which an "
                       "XLA-compiled replica step cannot hold")
"""Why a ResNet with synchronised batch norm cannot be XLA-compiled."""

FUSED_BATCH_NORM_BEATS_XLA = ("the ResNet's fused batch-norm kernels run its step faster than "
                              "XLA compiles it on CPUs")
"""Why `--xla auto` leaves a ResNet's step uncompiled on CPUs: with its batch norms
as TensorFlow's fused kernels (`FusedBatchNormalization`), the `resnet_tiny` step
ran 1.9x (float32) faster without XLA than with it on an AMX Xeon."""


def resolve_xla(mode, precision_policy, on_gpu):
    """Decides whether to XLA-compile the replica step, and says why.

    Args:
        mode: "auto", "on" or "off".
        precision_policy: the resolved Keras policy name ("float32",
            "mixed_float16", "mixed_bfloat16").
        on_gpu: whether the step runs on GPUs.

    Returns:
        `(jit_compile, reason)`: a bool, and a short reason for the log.

    Raises:
        ValueError: an unknown mode (the allowed ones are named).

    Example:

    >>> resolve_xla("auto", "float32", on_gpu=False)
    (True, 'auto: XLA fuses the elementwise ops of float32 steps on CPUs')
    >>> resolve_xla("auto", "mixed_bfloat16", on_gpu=False)
    (False, "auto: TensorFlow's bfloat16 CPU kernels beat XLA's")
    """
    if mode not in XLA_MODES:
        raise ValueError(f"Unknown XLA mode {mode!r}; choose one of {', '.join(XLA_MODES)}.")
    if mode == "on":
        return True, "asked for"
    if mode == "off":
        return False, "asked for"
    if on_gpu:
        return True, "auto: XLA fuses kernels on GPUs"
    if precision_policy == "mixed_bfloat16":
        return False, "auto: TensorFlow's bfloat16 CPU kernels beat XLA's"
    return True, "auto: XLA fuses the elementwise ops of float32 steps on CPUs"


def respect_xla_blocker(mode, jit_compile, reason, blocker, asked="--xla on",
                        way_out="Use --xla off or auto."):
    """Turns `auto` XLA off, with the reason, for a model that cannot be
    compiled; XLA asked for such a model is an error, never a silent change.

    Args:
        mode: "auto", "on" or "off".
        jit_compile, reason: the decision so far (`resolve_xla`'s).
        blocker: why this model cannot be compiled, or None.
        asked, way_out: how the error names the request and the way out
            (the recipes' flags by default; the bench names its own).

    Example:

    >>> respect_xla_blocker("auto", True, "auto: GPU", "sync BN all-reduces")
    (False, 'auto: sync BN all-reduces')
    """
    if blocker is None or not jit_compile:
        return jit_compile, reason
    if mode == "on":
        raise ValueError(f"{asked} is not possible for this model: {blocker}. {way_out}")
    return False, f"auto: {blocker}"


def leave_uncompiled_where_slower(mode, jit_compile, reason, slower_on_cpu, on_gpu):
    """Turns `auto`'s XLA off on CPUs for a model that XLA would slow down there.

    Applied after the model's blockers (a model that cannot be compiled says
    so first); `--xla on` still compiles it.

    Args:
        mode: "auto", "on" or "off".
        jit_compile, reason: the decision so far (`resolve_xla`'s, after any blocker).
        slower_on_cpu: why this model's step is faster uncompiled on CPUs, or None.
        on_gpu: whether the step runs on GPUs.

    Example:

    >>> leave_uncompiled_where_slower("auto", True, "auto: ...", "fused kernels", on_gpu=False)
    (False, 'auto: fused kernels')
    """
    if slower_on_cpu and jit_compile and mode == "auto" and not on_gpu:
        return False, f"auto: {slower_on_cpu}"
    return jit_compile, reason
