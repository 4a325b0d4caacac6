"""Optimizers by name, with a learning-rate schedule.

Build the optimizer inside `strategy.scope()`: Keras 3 optimizers capture the
strategy when they are constructed.
"""

import keras

from tfdist.schedules import make_schedule
from tfdist.schedules.fused_adam import FusedAdam, FusedAdamW
from tfdist.schedules.choices import (MIN_STEPS_AFTER_WARMUP, MOMENT_SETTINGS, OPTIMIZER_NAMES,
                                      SCHEDULES_SHAPED_BY_THE_RUN, moment_setting_fault)


def _recipe_schedule_options(schedule, warmup_steps, total_steps):
    """Defaults for the schedules that need more than a length: step decay
    divides the rate by 10 at 50% and 75% of the post-warmup steps (the
    classic ResNet shape); SGDR restarts after a quarter of them."""
    if total_steps is None or schedule not in SCHEDULES_SHAPED_BY_THE_RUN:
        return {}
    decay = total_steps - warmup_steps
    if decay < MIN_STEPS_AFTER_WARMUP:
        raise ValueError(
            f"Schedule {schedule!r} needs at least {MIN_STEPS_AFTER_WARMUP} optimizer steps after "
            f"the {warmup_steps} warmup "
            f"steps, but the run has {total_steps} in all; lower --warmup-steps or train longer.")
    if schedule == "step":
        return {"boundaries": sorted({warmup_steps + decay // 2, warmup_steps + (3 * decay) // 4})}
    return {"first_decay_steps": max(1, decay // 4)}


def check_moment_settings(name, **settings):
    """Refuses a moment setting (`beta_1`, `beta_2`, `epsilon`) the optimizer
    `name` does not have, and betas outside [0, 1); None means Keras's default.

    Raises:
        ValueError: naming the setting, the optimizer and those that have it.

    Example:

    >>> check_moment_settings("sgd", beta_2=0.98)
    Traceback (most recent call last):
    ValueError: Optimizer 'sgd' has no beta_2 (got 0.98); adam, adamw, lamb, lion have it.
    """
    for setting, value in settings.items():
        fault = moment_setting_fault(name, setting, value)
        if fault == "missing":
            raise ValueError(f"Optimizer {name!r} has no {setting} (got {value:g}); "
                             f"{', '.join(MOMENT_SETTINGS[setting])} have it.")
        if fault == "range":
            raise ValueError(f"{setting} must be in [0, 1), got {value:g}.")


def build_optimizer(name, learning_rate, *, schedule="constant", warmup_steps=0, total_steps=None,
                    weight_decay=0.0, momentum=0.9, beta_1=None, beta_2=None, epsilon=None,
                    fused=True):
    """Returns a Keras optimizer whose learning rate follows a warmup schedule.

    Args:
        name: one of `OPTIMIZER_NAMES`. `momentum` is SGD with Nesterov
            momentum; `sgd` is plain SGD.
        learning_rate: the peak rate, reached at the end of the warmup.
        schedule: decay after warmup, a name accepted by
            `tfdist.schedules.make_schedule` (`constant`, `cosine`, ...);
            `step` decays 10x at 50% and 75% of the post-warmup steps and
            `cosine_restarts` restarts after a quarter of them.
        warmup_steps: optimizer steps of linear warmup from 0.
        total_steps: optimizer steps in the whole run, for decaying
            schedules.
        weight_decay: decoupled weight decay (ignored by `adam`; passed to
            the other optimizers, which all take it in Keras 3).
        momentum: momentum for `momentum`.
        beta_1, beta_2, epsilon: the moment settings of `adam`, `adamw`,
            `lamb` (all three) and `lion` (the betas); None keeps Keras's
            default. Set for an optimizer without them: an error.
        fused: `adam` and `adamw` update each variable with TensorFlow's
            one-kernel Adam (`tfdist.schedules.fused_adam`: faster to trace,
            rounding its constants as TensorFlow does); False
            builds Keras's own `Adam` and `AdamW`. Other optimizers ignore it.

    Returns:
        A `keras.optimizers.Optimizer`.

    Raises:
        ValueError: unknown optimizer name, or a schedule error.

    Example:

    >>> with strategy.scope():
    ...     optimizer = build_optimizer("adamw", 1e-3, schedule="cosine",
    ...                                 warmup_steps=100, total_steps=1000)
    """
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"Unknown optimizer {name!r}. Valid optimizers: {', '.join(OPTIMIZER_NAMES)}.")
    check_moment_settings(name, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
    rate = make_schedule(schedule, learning_rate, warmup_steps=warmup_steps, total_steps=total_steps,
                         **_recipe_schedule_options(schedule, warmup_steps, total_steps))
    decay = {"weight_decay": weight_decay} if weight_decay else {}
    moments = {key: value for key, value in
               (("beta_1", beta_1), ("beta_2", beta_2), ("epsilon", epsilon)) if value is not None}
    if name == "adam":
        if weight_decay:
            raise ValueError(
                f"Optimizer 'adam' has no decoupled weight decay (got weight_decay={weight_decay}); "
                "use 'adamw'.")
        return (FusedAdam if fused else keras.optimizers.Adam)(rate, **moments)
    if name == "adamw":
        adamw = FusedAdamW if fused else keras.optimizers.AdamW
        return adamw(rate, weight_decay=weight_decay, **moments)
    if name == "sgd":
        return keras.optimizers.SGD(rate, **decay)
    if name == "momentum":
        return keras.optimizers.SGD(rate, momentum=momentum, nesterov=True, **decay)
    if name == "lamb":
        return keras.optimizers.Lamb(rate, **decay, **moments)
    return keras.optimizers.Lion(rate, **decay, **moments)
