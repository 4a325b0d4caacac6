"""Whether TensorFlow runs its oneDNN CPU kernels, and why: one line for `tfdist doctor`.

TensorFlow decides once per process: `TF_ENABLE_ONEDNN_OPTS` when it is set
("1"/"true" on, "0"/"false" off), else on for CPUs with AVX512-VNNI,
AVX512-BF16 or AMX. With oneDNN on, its kernels run the matmuls and
convolutions, and its pool is TensorFlow's default CPU allocator (see
`tfdist.runtime.cpu_allocator`).

Example:

    from tfdist.runtime.onednn import describe_onednn

    print(describe_onednn())   # e.g. "on (TensorFlow's default on this CPU; ...)"
"""

import os

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"


def describe_onednn(enabled=None, environ=None):
    """One line: oneDNN on or off in this process, what decided it, how to change it.

    Args:
        enabled: whether TensorFlow runs oneDNN (default: ask TensorFlow).
        environ: the environment (default `os.environ`).

    Example:

    >>> describe_onednn(True, {})
    "on (TensorFlow's default on this CPU; TF_ENABLE_ONEDNN_OPTS=0 turns it off)"
    >>> describe_onednn(False, {"TF_ENABLE_ONEDNN_OPTS": "0"})
    'off (TF_ENABLE_ONEDNN_OPTS=0)'
    """
    environ = os.environ if environ is None else environ
    if enabled is None:
        from tfdist import seam

        enabled = seam.onednn_enabled()
    value = environ.get(ONEDNN_ENV)
    state = "on" if enabled else "off"
    if value is not None:
        return f"{state} ({ONEDNN_ENV}={value})"
    if enabled:
        return f"on (TensorFlow's default on this CPU; {ONEDNN_ENV}=0 turns it off)"
    return (f"off (TensorFlow's default on CPUs without AVX512-VNNI, AVX512-BF16 or AMX; "
            f"{ONEDNN_ENV}=1 turns it on)")
