"""TensorFlow's CPU tensors from a memory pool instead of `malloc` and `free`.

TensorFlow allocates the tensors of a CPU step with the C library's `malloc`
by default. glibc hands large blocks back to the kernel when they are freed
and maps them again on the next step, so each step of a convolutional model
faults its activations and gradients in page by page: on a 2-core AVX2 AMD
EPYC (Zen 3) the `resnet_tiny` recipe spent 25 of its 48 CPU-seconds in the
kernel and ran 1.75x slower than from a pool (docs/performance.md has the
figures). TensorFlow's own pooled allocator (its BFC allocator, the one GPU
memory comes from) keeps freed blocks for the next step; TensorFlow reads
`TF_CPU_ALLOCATOR_USE_BFC` when it first allocates a CPU tensor.

`import tfdist` calls `pool_cpu_memory()`, which sets that variable to
`true` unless the environment already sets it (`TF_CPU_ALLOCATOR_USE_BFC=false`
keeps `malloc`), and lets the pool grow to the machine's memory
(`TF_CPU_BFC_MEM_LIMIT_IN_MB`, else TensorFlow caps it at 64 GiB) unless that
is set too. Child processes (the launcher's workers) inherit both. The pool
keeps the high-water mark of the process's CPU tensors: memory freed by
TensorFlow is reused by TensorFlow, not returned to the system.

Where TensorFlow turns oneDNN on (by default on CPUs with AVX512-VNNI,
AVX512-BF16 or AMX; `TF_ENABLE_ONEDNN_OPTS` decides otherwise), its default
is not `malloc` but oneDNN's own pool; the variable then switches to
TensorFlow's pool, which trained the CNN recipe as fast on an AMD EPYC Zen 5
(docs/engine.md has the figures).

It takes effect when set before the process's first CPU tensor: importing
tfdist before creating any tensor is enough (importing TensorFlow or Keras
first is fine); a program that created tensors, or built a model, before
`import tfdist` keeps TensorFlow's default
(`cpu_allocator_in_use()` tells which).

Example:

    import tfdist                     # sets the defaults
    import tensorflow as tf
    tf.ones([2])
    tfdist.runtime.cpu_allocator.cpu_allocator_in_use()   # "pool"
"""

import os

POOL_ENV = "TF_CPU_ALLOCATOR_USE_BFC"
POOL_LIMIT_ENV = "TF_CPU_BFC_MEM_LIMIT_IN_MB"


def _tensorflow_reads_true(value):
    """Whether TensorFlow reads this environment value as true: "1" or "true" in
    any case (its ReadBoolFromEnvVar; any other value leaves malloc)."""
    return value.lower() in ("1", "true")


def machine_memory_mb():
    """This machine's physical memory in MiB, or None where the system does not say.

    Example:

    >>> machine_memory_mb() > 0
    True
    """
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
    except (AttributeError, OSError, ValueError):
        return None


def pool_limit_problem(environ=None):
    """What is wrong with `$TF_CPU_BFC_MEM_LIMIT_IN_MB` while the pool is asked for, or None.

    TensorFlow reads the pool's limit as a whole number of MiB; a value it
    cannot read (`lots`, `1.5`) or 0 leaves a pool too small for any tensor,
    and the process crashes at its first one (a segmentation fault) or stops
    with an out-of-memory error. The recipes refuse it before TensorFlow
    starts and `tfdist doctor` names it; `import tfdist` does not turn the
    pool on then (a program that turns it on itself gets TensorFlow's crash).

    Example:

    >>> pool_limit_problem({"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "1.5"})
    "$TF_CPU_BFC_MEM_LIMIT_IN_MB='1.5' is not a whole number of MiB > 0 ..."
    >>> pool_limit_problem({"TF_CPU_BFC_MEM_LIMIT_IN_MB": "8192"}) is None
    True
    """
    environ = os.environ if environ is None else environ
    limit = environ.get(POOL_LIMIT_ENV)
    if limit is None or not _tensorflow_reads_true(environ.get(POOL_ENV, "true")):
        return None  # no pool asked for (tfdist asks unless POOL_ENV says otherwise)
    text = limit.strip()
    if text.isascii() and text.isdigit() and int(text) > 0:  # as TensorFlow's strtoll reads it
        return None
    memory = machine_memory_mb()
    return (f"${POOL_LIMIT_ENV}={limit!r} is not a whole number of MiB > 0 (the limit of "
            f"TensorFlow's CPU memory pool, which would crash or run out of memory at its first "
            f"tensor): set one such as 8192, or unset it"
            + (f" for this machine's {memory} MiB" if memory else "")
            + f" ({POOL_ENV}=false keeps malloc instead).")


def pool_cpu_memory(environ=None):
    """Asks TensorFlow for its pooled CPU allocator, as far as `environ` has not
    decided already (see the module docstring).

    Args:
        environ: the environment to set defaults in (default `os.environ`).

    Returns:
        `{variable: value}` of what this call set (empty when the
        environment had decided both).

    Example:

    >>> pool_cpu_memory({})["TF_CPU_ALLOCATOR_USE_BFC"]
    'true'
    >>> pool_cpu_memory({"TF_CPU_ALLOCATOR_USE_BFC": "false"})
    {}
    """
    environ = os.environ if environ is None else environ
    set_here = {}
    if pool_limit_problem(environ) is not None:
        # Not turned on here: TensorFlow reads the limit only with the pool on, and
        # would crash at the first tensor. The recipes and `tfdist doctor` refuse it.
        return set_here
    if POOL_ENV not in environ:
        environ[POOL_ENV] = set_here[POOL_ENV] = "true"
    if _tensorflow_reads_true(environ[POOL_ENV]) and POOL_LIMIT_ENV not in environ:
        memory = machine_memory_mb()
        if memory:
            environ[POOL_LIMIT_ENV] = set_here[POOL_LIMIT_ENV] = str(memory)
    return set_here


def cpu_allocator_in_use():
    """"pool" when this process's CPU tensors come from a pooled allocator
    (TensorFlow's, or oneDNN's where oneDNN is on), "malloc" when from the C
    library's. Creates a CPU tensor (which fixes the choice for the process).

    Example:

    >>> cpu_allocator_in_use()
    'pool'
    """
    import tensorflow as tf

    with tf.device("/cpu:0"):
        tf.zeros([1])
    try:
        tf.config.experimental.get_memory_info("CPU:0")  # only a pool keeps these figures
    except ValueError:
        return "malloc"
    return "pool"


def describe_cpu_allocator(in_use, environ=None, onednn=None):
    """One line for `tfdist doctor`: where this process's CPU tensors come from, and why.

    Args:
        in_use: `cpu_allocator_in_use()`.
        environ: the environment (default `os.environ`).
        onednn: whether TensorFlow runs oneDNN in this process (default: ask
            TensorFlow), which makes oneDNN's pool its default allocator.

    Example:

    >>> describe_cpu_allocator("pool", {"TF_CPU_ALLOCATOR_USE_BFC": "true",
    ...                                 "TF_CPU_BFC_MEM_LIMIT_IN_MB": "24000"})
    "TensorFlow's pool (TF_CPU_ALLOCATOR_USE_BFC=true), up to 24000 MiB"
    >>> describe_cpu_allocator("pool", {"TF_CPU_ALLOCATOR_USE_BFC": "false"}, onednn=True)
    "oneDNN's pool (TensorFlow's default with oneDNN on; TF_CPU_ALLOCATOR_USE_BFC=false)"
    """
    environ = os.environ if environ is None else environ
    value = environ.get(POOL_ENV)
    asked_for_the_pool = value is not None and _tensorflow_reads_true(value)
    if in_use == "pool":
        if not asked_for_the_pool:  # then the pool in use is TensorFlow's default
            if onednn is None:
                from tfdist import seam

                onednn = seam.onednn_enabled()
            if onednn:
                return ("oneDNN's pool (TensorFlow's default with oneDNN on"
                        + (f"; {POOL_ENV}={value})" if value is not None else ")"))
        limit = environ.get(POOL_LIMIT_ENV)
        return (f"TensorFlow's pool ({POOL_ENV}={value})"
                + (f", up to {limit} MiB" if limit else ", up to TensorFlow's 64 GiB"))
    if value is not None and not asked_for_the_pool:
        return (f"malloc ({POOL_ENV}={value} in the environment; unset it for TensorFlow's "
                "pool, whose steps ran 1.2-1.75x faster where malloc faulted)")
    return (f"malloc: a CPU tensor was made before {POOL_ENV} was set (import tfdist before "
            "creating tensors)")
