"""The `--autotune` modes and their default.

Example:

    default_autotune_mode()   # 'on' unless $TFDIST_AUTOTUNE says otherwise
"""

import os

AUTOTUNE_MODES = ("on", "off", "refresh")
"""`on`: use a cached decision or run a trial; `off`: the fixed rules;
`refresh`: run a trial even when a decision is cached, and replace it."""
AUTOTUNE_ENV = "TFDIST_AUTOTUNE"
"""Sets the default of `--autotune` (e.g. `off` where start-up time matters
more than the step, as in a test suite)."""


def default_autotune_mode(environ=None):
    """`--autotune`'s default: `$TFDIST_AUTOTUNE` when set, else "on".

    The value is read as the recipes read it (case and surrounding blanks do not
    matter, blank is unset) and checked the same way.

    Args:
        environ: the environment (default `os.environ`).

    Raises:
        ValueError: `$TFDIST_AUTOTUNE` is not one of `AUTOTUNE_MODES`.

    Example:

    >>> default_autotune_mode({"TFDIST_AUTOTUNE": " OFF "})
    'off'
    >>> default_autotune_mode({})
    'on'
    """
    environ = os.environ if environ is None else environ
    mode = (environ.get(AUTOTUNE_ENV) or "").strip().lower() or "on"
    if mode not in AUTOTUNE_MODES:
        raise ValueError(f"${AUTOTUNE_ENV}={environ[AUTOTUNE_ENV]!r} is not allowed. Choose one "
                         f"of: {', '.join(AUTOTUNE_MODES)}, or unset it (on).")
    return mode


def why_flags_rule_out_a_trial(autotune, precision, xla):
    """Why the flags alone leave no autotune trial to run: "off" (`--autotune off`),
    "nothing to choose" (both `--precision` and `--xla` given), or None when one may run.

    Example:

    >>> why_flags_rule_out_a_trial("on", "float32", "off")
    'nothing to choose'
    >>> why_flags_rule_out_a_trial("on", "auto", "off") is None
    True
    """
    if autotune == "off":
        return "off"
    if precision != "auto" and xla != "auto":
        return "nothing to choose"
    return None
