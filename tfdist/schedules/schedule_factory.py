"""One factory from a schedule name to a learning-rate schedule with warmup."""

import keras

from tfdist.schedules._checks import check_choice
from tfdist.schedules._checks import check_float
from tfdist.schedules._checks import check_int
from tfdist.schedules.constant import ConstantLearningRate
from tfdist.schedules.inverse_sqrt import InverseSqrtDecay
from tfdist.schedules.choices import SCHEDULE_NAMES, SCHEDULES_NEEDING_WARMUP
from tfdist.schedules.warmup import WARMUP_MODES
from tfdist.schedules.warmup import WarmUp


# Options each schedule accepts beyond the common arguments, with defaults.
_OPTIONS = {
    "constant": {},
    "step": {"boundaries": None, "decay_rate": 0.1},
    "exponential": {"decay_steps": None, "decay_rate": 0.1, "staircase": False},
    "polynomial": {"end_learning_rate": None, "alpha": None, "power": 1.0},
    "cosine": {"end_learning_rate": None, "alpha": None},
    "cosine_restarts": {
        "first_decay_steps": None,
        "t_mul": 2.0,
        "m_mul": 1.0,
        "end_learning_rate": None,
        "alpha": None,
    },
    "inverse_sqrt": {},
}

_OWNER = "make_schedule"


def _normalise_name(name):
    if not isinstance(name, str):
        raise ValueError(
            f"{_OWNER}: `name` must be one of {', '.join(SCHEDULE_NAMES)}. "
            f"Received: name={name!r} (type {type(name).__name__})."
        )
    key = name.strip().lower().replace("-", "_")
    if key not in SCHEDULE_NAMES:
        raise ValueError(
            f"{_OWNER}: unknown schedule name {name!r}. "
            f"Valid names: {', '.join(SCHEDULE_NAMES)}."
        )
    return key


def _decay_steps(name, total_steps, warmup_steps):
    """Steps after warmup, from `total_steps`; a clear error when missing."""
    if total_steps is None:
        raise ValueError(
            f"{_OWNER}: schedule {name!r} needs `total_steps` (the number of "
            "optimizer steps of the whole run, warmup included). Received: "
            "total_steps=None."
        )
    total_steps = check_int(_OWNER, "total_steps", total_steps, 1)
    if total_steps <= warmup_steps:
        raise ValueError(
            f"{_OWNER}: `total_steps` must be greater than `warmup_steps`. "
            f"Received: total_steps={total_steps}, warmup_steps={warmup_steps}."
        )
    return total_steps - warmup_steps


def _end_fraction(name, base, options):
    """`alpha` (end rate / base rate) from `alpha` or `end_learning_rate`."""
    alpha, end = options["alpha"], options["end_learning_rate"]
    if alpha is not None and end is not None:
        raise ValueError(
            f"{_OWNER}: schedule {name!r} takes `alpha` or `end_learning_rate`, "
            f"not both. Received: alpha={alpha!r}, end_learning_rate={end!r}."
        )
    if end is not None:
        end = check_float(_OWNER, "end_learning_rate", end)
        if end > base:
            raise ValueError(
                f"{_OWNER}: `end_learning_rate` must be <= base_learning_rate "
                f"({base}). Received: end_learning_rate={end}."
            )
        return end / base
    if alpha is None:
        return 0.0
    alpha = check_float(_OWNER, "alpha", alpha)
    if alpha > 1.0:
        raise ValueError(
            f"{_OWNER}: `alpha` (end rate as a fraction of the base rate) must "
            f"be in [0, 1]. Received: alpha={alpha}."
        )
    return alpha


def _step_decay(base, warmup_steps, options):
    boundaries = options["boundaries"]
    if boundaries is None:
        raise ValueError(
            f"{_OWNER}: schedule 'step' needs `boundaries`, the optimizer steps "
            "at which the rate is multiplied by `decay_rate` (e.g. "
            "boundaries=[30000, 60000]). Received: boundaries=None."
        )
    try:
        boundaries = [check_int(_OWNER, "boundaries[i]", b, warmup_steps + 1) for b in boundaries]
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{_OWNER}: `boundaries` must be a non-empty, strictly increasing "
            f"list of integers > warmup_steps ({warmup_steps}). "
            f"Received: boundaries={options['boundaries']!r}."
        ) from error
    if not boundaries or any(b >= c for b, c in zip(boundaries, boundaries[1:])):
        raise ValueError(
            f"{_OWNER}: `boundaries` must be a non-empty, strictly increasing "
            f"list of integers > warmup_steps ({warmup_steps}). "
            f"Received: boundaries={options['boundaries']!r}."
        )
    decay_rate = check_float(_OWNER, "decay_rate", options["decay_rate"], strict=True)
    values = [base * decay_rate**i for i in range(len(boundaries) + 1)]
    # PiecewiseConstantDecay switches after a boundary (step > b); shift by one
    # so the new rate applies from global step b on, and by the warmup offset.
    relative = [b - warmup_steps - 1 for b in boundaries]
    return keras.optimizers.schedules.PiecewiseConstantDecay(relative, values)


def make_schedule(
    name,
    base_learning_rate,
    *,
    warmup_steps=0,
    total_steps=None,
    warmup_mode="linear",
    warmup_initial_learning_rate=0.0,
    **options,
):
    """Builds a named learning-rate schedule, with warmup, from few numbers.

    All step counts are global optimizer steps, warmup included; the factory
    converts them to the post-warmup steps the wrapped Keras schedule sees.
    After warmup the rate starts at `base_learning_rate` and follows:

    - `"constant"`: `base_learning_rate` for ever.
    - `"step"`: multiplied by `decay_rate` (default 0.1) from each step in
      `boundaries` on (required; integers > warmup_steps). Keras
      `PiecewiseConstantDecay`.
    - `"exponential"`: `base * decay_rate ** ((step - warmup) / decay_steps)`,
      `decay_rate` default 0.1, `decay_steps` default `total_steps -
      warmup_steps`, `staircase` default False. Keras `ExponentialDecay`.
    - `"polynomial"`: from base to the end rate at `total_steps` (required),
      `power` default 1.0 (linear). Keras `PolynomialDecay`.
    - `"cosine"`: half a cosine from base to the end rate at `total_steps`
      (required). Keras `CosineDecay`.
    - `"cosine_restarts"`: SGDR; `first_decay_steps` (required), `t_mul`
      (default 2.0), `m_mul` (default 1.0). Keras `CosineDecayRestarts`.
    - `"inverse_sqrt"`: the Transformer schedule, peaking at
      `base_learning_rate` at `warmup_steps` (required, >= 1; its warmup is
      always linear from 0) and falling as `1/sqrt(step)`. `InverseSqrtDecay`.

    The end rate of "polynomial", "cosine" and "cosine_restarts" is
    `end_learning_rate`, or `alpha * base_learning_rate`; default 0.

    Args:
        name: one of `SCHEDULE_NAMES` (case-insensitive, "-" or "_").
        base_learning_rate: the rate at the end of warmup, a number > 0
            (see `scale_learning_rate` for the linear scaling rule).
        warmup_steps: integer >= 0, warmup length in optimizer steps.
        total_steps: optimizer steps of the whole run, warmup included;
            required by "polynomial" and "cosine" and by "exponential" without
            `decay_steps`.
        warmup_mode: `"linear"` or `"exponential"` (see `WarmUp`).
        warmup_initial_learning_rate: the rate at step 0, >= 0 (> 0 for
            exponential warmup). Defaults to 0.0.
        **options: the schedule's own options listed above; an option the
            named schedule does not use is an error.

    Returns:
        A `keras.optimizers.schedules.LearningRateSchedule`: `WarmUp` around
        the post-warmup schedule when `warmup_steps > 0`, else the schedule
        itself (`ConstantLearningRate` for "constant").

    Raises:
        ValueError: unknown name (the message lists the valid ones), an
            option the schedule does not take, a missing required argument or
            a value out of range.

    Example:

    >>> schedule = make_schedule("cosine", 0.1, warmup_steps=100, total_steps=1000)
    >>> [round(float(schedule(s)), 4) for s in (0, 50, 100, 550, 1000)]
    [0.0, 0.05, 0.1, 0.05, 0.0]
    >>> model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    """
    key = _normalise_name(name)
    unknown = sorted(set(options) - set(_OPTIONS[key]))
    if unknown:
        allowed = ", ".join(_OPTIONS[key]) or "none"
        raise ValueError(
            f"{_OWNER}: schedule {key!r} does not take option(s) "
            f"{', '.join(unknown)}. Its options: {allowed}."
        )
    options = {**_OPTIONS[key], **options}
    base = check_float(_OWNER, "base_learning_rate", base_learning_rate, strict=True)
    warmup_steps = check_int(_OWNER, "warmup_steps", warmup_steps, 0)
    if total_steps is not None:
        total_steps = check_int(_OWNER, "total_steps", total_steps, 1)
    check_choice(_OWNER, "warmup_mode", warmup_mode, WARMUP_MODES)

    schedules = keras.optimizers.schedules
    if key in SCHEDULES_NEEDING_WARMUP:
        if warmup_steps < 1:
            raise ValueError(
                f"{_OWNER}: schedule 'inverse_sqrt' needs warmup_steps >= 1 (its "
                f"peak is at warmup_steps). Received: warmup_steps={warmup_steps}."
            )
        if warmup_mode != "linear" or warmup_initial_learning_rate != 0.0:
            raise ValueError(
                f"{_OWNER}: schedule 'inverse_sqrt' has its own linear warmup "
                "from 0; warmup_mode and warmup_initial_learning_rate cannot be "
                f"changed. Received: warmup_mode={warmup_mode!r}, "
                f"warmup_initial_learning_rate={warmup_initial_learning_rate!r}."
            )
        return InverseSqrtDecay(warmup_steps, peak_learning_rate=base)

    if key == "constant":
        after = ConstantLearningRate(base) if warmup_steps == 0 else base
    elif key == "step":
        after = _step_decay(base, warmup_steps, options)
    elif key == "exponential":
        decay_steps = options["decay_steps"]
        if decay_steps is None:
            decay_steps = _decay_steps(key, total_steps, warmup_steps)
        decay_steps = check_int(_OWNER, "decay_steps", decay_steps, 1)
        decay_rate = check_float(_OWNER, "decay_rate", options["decay_rate"], strict=True)
        after = schedules.ExponentialDecay(
            base, decay_steps, decay_rate, staircase=bool(options["staircase"])
        )
    elif key == "polynomial":
        alpha = _end_fraction(key, base, options)
        power = check_float(_OWNER, "power", options["power"], strict=True)
        after = schedules.PolynomialDecay(
            base,
            _decay_steps(key, total_steps, warmup_steps),
            end_learning_rate=alpha * base,
            power=power,
        )
    elif key == "cosine":
        alpha = _end_fraction(key, base, options)
        after = schedules.CosineDecay(
            base, _decay_steps(key, total_steps, warmup_steps), alpha=alpha
        )
    else:  # cosine_restarts
        first_decay_steps = options["first_decay_steps"]
        if first_decay_steps is None:
            raise ValueError(
                f"{_OWNER}: schedule 'cosine_restarts' needs `first_decay_steps`, "
                "the length of the first cosine cycle in optimizer steps. "
                "Received: first_decay_steps=None."
            )
        after = schedules.CosineDecayRestarts(
            base,
            check_int(_OWNER, "first_decay_steps", first_decay_steps, 1),
            t_mul=check_float(_OWNER, "t_mul", options["t_mul"], strict=True),
            m_mul=check_float(_OWNER, "m_mul", options["m_mul"]),
            alpha=_end_fraction(key, base, options),
        )

    if warmup_steps == 0:
        return after
    return WarmUp(
        after,
        warmup_steps,
        initial_learning_rate=warmup_initial_learning_rate,
        mode=warmup_mode,
    )
